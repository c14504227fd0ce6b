//! What `planner forecast` reads, in one read-only snapshot: each kind's
//! ready drafts, the gate rows and cap units of the days ahead, when each
//! rotating kind's categories last published, and the pauses in force —
//! with Postgres's clock, read once, in the same transaction. It writes
//! nothing; the simulation is `forecast::simulate`.
//!
//! Why one `REPEATABLE READ` transaction: a worker gating a slot between
//! two of these reads would otherwise show up twice (its draft gone from
//! the ready list *and* its cap unit spent) or not at all.

use super::StoreError;
use crate::forecast::{Draft, Gated, KindState};
use crate::outcome::{Reason, SlotState};
use chrono::{DateTime, NaiveDate, Utc};
use sqlx::postgres::PgPool;
use sqlx::Row;
use std::collections::HashMap;

/// [`forecast_read`]'s answer.
#[derive(Debug, Clone, Default)]
pub struct ForecastRead {
    /// Postgres's `now()`: the snapshot's instant.
    pub now: DateTime<Utc>,
    /// Each asked-for kind's rows (a kind without any has a default entry).
    pub kinds: HashMap<String, KindState>,
}

/// The rows a `days`-day forecast of `kinds` needs; `rotating` names the
/// kinds whose categories' last publishes are read too. Gate rows and cap
/// units are read for every day any zone's forecast can touch (UTC's date
/// a day either side), drafts only if ready before the last of them.
pub async fn forecast_read(
    pool: &PgPool,
    kinds: &[String],
    rotating: &[String],
    days: u32,
) -> Result<ForecastRead, StoreError> {
    let mut tx = pool.begin().await?;
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        .execute(&mut *tx)
        .await?;
    let now: DateTime<Utc> = sqlx::query_scalar("SELECT now()")
        .fetch_one(&mut *tx)
        .await?;
    let days = i32::try_from(days).unwrap_or(i32::MAX);
    let mut out = ForecastRead {
        now,
        kinds: kinds
            .iter()
            .map(|k| (k.clone(), KindState::default()))
            .collect(),
    };
    let drafts = sqlx::query(
        "SELECT kind, id, priority, ready_at, category FROM draft
          WHERE kind = ANY($1) AND status = 'ready'
            AND ready_at < now() + make_interval(days => $2 + 2)",
    )
    .bind(kinds)
    .bind(days)
    .fetch_all(&mut *tx)
    .await?;
    for r in &drafts {
        if let Some(k) = out.kinds.get_mut(r.try_get::<&str, _>("kind")?) {
            k.drafts.push(Draft {
                id: r.try_get("id")?,
                priority: r.try_get("priority")?,
                ready_at: r.try_get("ready_at")?,
                category: r.try_get("category")?,
            });
        }
    }
    // The days ahead in any zone: from UTC's yesterday.
    let window = "day BETWEEN (now() AT TIME ZONE 'UTC')::date - 1
                          AND (now() AT TIME ZONE 'UTC')::date + $2 + 1";
    let gated = sqlx::query(&format!(
        "SELECT kind, day, slot, state, reason FROM publish_slot WHERE kind = ANY($1) AND {window}"
    ))
    .bind(kinds)
    .bind(days)
    .fetch_all(&mut *tx)
    .await?;
    for r in &gated {
        if let Some(k) = out.kinds.get_mut(r.try_get::<&str, _>("kind")?) {
            k.gated.push(Gated {
                day: r.try_get("day")?,
                slot_no: u32::try_from(r.try_get::<i32, _>("slot")?).unwrap_or(0),
                state: r.try_get::<SlotState, _>("state")?,
                reason: r.try_get::<Option<Reason>, _>("reason")?,
            });
        }
    }
    let used = sqlx::query(&format!(
        "SELECT kind, day, used FROM daily_quota WHERE kind = ANY($1) AND {window}"
    ))
    .bind(kinds)
    .bind(days)
    .fetch_all(&mut *tx)
    .await?;
    for r in &used {
        if let Some(k) = out.kinds.get_mut(r.try_get::<&str, _>("kind")?) {
            let day: NaiveDate = r.try_get("day")?;
            k.used.push((day, i64::from(r.try_get::<i32, _>("used")?)));
        }
    }
    if !rotating.is_empty() {
        let last = sqlx::query(
            "SELECT kind, category, max(published_at) AS last_out FROM draft
              WHERE kind = ANY($1) AND status = 'published' AND published_at IS NOT NULL
              GROUP BY kind, category",
        )
        .bind(rotating)
        .fetch_all(&mut *tx)
        .await?;
        for r in &last {
            if let Some(k) = out.kinds.get_mut(r.try_get::<&str, _>("kind")?) {
                k.last_out
                    .push((r.try_get("category")?, r.try_get("last_out")?));
            }
        }
    }
    let paused = sqlx::query(&format!(
        "SELECT kind, until_at FROM kind_pause k WHERE kind = ANY($1) AND {}",
        super::pause::in_force_at("now()")
    ))
    .bind(kinds)
    .fetch_all(&mut *tx)
    .await?;
    for r in &paused {
        if let Some(k) = out.kinds.get_mut(r.try_get::<&str, _>("kind")?) {
            k.paused = Some(r.try_get("until_at")?);
        }
    }
    tx.commit().await?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every read lands on its kind: drafts (ready ones only), gate rows
    /// and cap units of the days ahead, categories' last publishes of a
    /// rotating kind, and a pause in force (an expired one is not).
    #[tokio::test]
    async fn the_snapshot_reads_each_kinds_rows() {
        let db = testkit::TestDb::new().await;
        sqlx::raw_sql(
            "INSERT INTO draft (kind, title, status, ready_at, priority, category, published_at) VALUES
               ('a', 'r', 'ready', now() - interval '1 h', 3, NULL, NULL),
               ('a', 'f', 'ready', now() + interval '1 day', 0, NULL, NULL),
               ('a', 'far', 'ready', now() + interval '30 days', 0, NULL, NULL),
               ('a', 'd', 'draft', now(), 0, NULL, NULL),
               ('b', 'p', 'published', now(), 0, 'sport', now() - interval '2 h'),
               ('b', 'r', 'ready', now(), 0, 'arts', NULL);
             INSERT INTO publish_slot (day, slot, kind, state, reason, claimed_by)
             VALUES (current_date, 1, 'a', 'skipped', 'operator', 'w'),
                    (current_date - 30, 1, 'a', 'published', NULL, 'w');
             INSERT INTO daily_quota (kind, day, used) VALUES ('a', current_date, 1);
             INSERT INTO kind_pause (kind, paused_at, until_at, paused_by, note)
             VALUES ('a', now(), now() + interval '1 h', 'manual', ''),
                    ('b', now() - interval '2 h', now() - interval '1 h', 'manual', '')",
        )
        .execute(&db.pool)
        .await
        .unwrap();
        let r = forecast_read(&db.pool, &["a".into(), "b".into()], &["b".into()], 7)
            .await
            .unwrap();
        let a = &r.kinds["a"];
        let titles: Vec<i32> = a.drafts.iter().map(|d| d.priority).collect();
        assert_eq!(a.drafts.len(), 2, "ready within the window: {titles:?}");
        assert_eq!(a.gated.len(), 1);
        assert_eq!(
            a.gated[0].reason.as_ref().map(Reason::as_str),
            Some("operator")
        );
        assert_eq!(a.used.len(), 1);
        assert!(a.paused.is_some_and(|u| u.is_some_and(|u| u > r.now)));
        let b = &r.kinds["b"];
        assert_eq!(b.last_out.len(), 1);
        assert_eq!(b.last_out[0].0.as_deref(), Some("sport"));
        assert_eq!(b.paused, None, "an expired pause is not in force");
        assert_eq!(b.drafts[0].category.as_deref(), Some("arts"));
    }
}
