//! Paused kinds (`planner pause` / `planner resume`), kept in Postgres
//! (`kind_pause`), so every worker sees the same pause and it survives a
//! Redis flush; and the per-delivery read of a slot's plan that carries
//! the pause check.
//!
//! While a kind is paused, each of its deliveries takes the slot's gate row
//! as `skipped/paused` — final, like every gate row — so paused slots do not
//! pile up and run in a burst after `resume`. The check rides on the read
//! the executor already makes per delivery (the slot's plan), so the hot
//! path gets no extra round trip; the batch path reads the paused kinds once
//! per batch and leaves their deliveries to the one-delivery path.

use super::StoreError;
use crate::slot::{PlannedSlot, SlotKey};
use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::{PgConnection, PgPool, Row};

/// The one rule of when a pause is in force, as SQL over `kind_pause`
/// (alias `k`) at the instant `at` (a parameter `$n`, or Postgres's
/// `clock_timestamp()` where a delivery is judged).
pub(super) fn in_force_at(at: &str) -> String {
    format!("(k.until_at IS NULL OR k.until_at > {at})")
}

/// [`in_force_at`] the injected clock's `now`, parameter `$n`.
fn in_force(n: u8) -> String {
    in_force_at(&format!("${n}"))
}

/// A pause in force.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Pause {
    /// The paused kind.
    pub kind: String,
    /// When the pause began; pausing again (to change `until`) keeps it.
    pub paused_at: DateTime<Utc>,
    /// When it ends by itself; `None`: until `planner resume`.
    pub until: Option<DateTime<Utc>>,
    /// The caller that paused it (`manual` for the CLI and the console).
    pub paused_by: String,
    /// The operator's reason, as given (at most
    /// [`MAX_NOTE_CHARS`](crate::operator::MAX_NOTE_CHARS)); may be empty.
    pub note: String,
}

/// Pauses `kind` (or changes the end of its pause). Idempotent.
pub async fn pause_kind(
    pool: &PgPool,
    kind: &str,
    until: Option<DateTime<Utc>>,
    by: &str,
    note: &str,
    now: DateTime<Utc>,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO kind_pause (kind, paused_at, until_at, paused_by, note) VALUES ($1, $2, $3, $4, $5)
         ON CONFLICT (kind) DO UPDATE SET until_at = EXCLUDED.until_at, paused_by = EXCLUDED.paused_by,
                                          note = EXCLUDED.note",
    )
    .bind(kind)
    .bind(now)
    .bind(until)
    .bind(by)
    .bind(note)
    .execute(pool)
    .await
    .map(|_| ())
}

/// Ends `kind`'s pause; `false` when it was not paused.
pub async fn resume_kind(
    pool: &PgPool,
    kind: &str,
    now: DateTime<Utc>,
) -> Result<bool, StoreError> {
    let r = sqlx::query(&format!(
        "DELETE FROM kind_pause k WHERE k.kind = $1 AND {}",
        in_force(2)
    ))
    .bind(kind)
    .bind(now)
    .execute(pool)
    .await?;
    // An expired row is gone too, but it was not a pause in force.
    sqlx::query("DELETE FROM kind_pause WHERE kind = $1")
        .bind(kind)
        .execute(pool)
        .await?;
    Ok(r.rows_affected() == 1)
}

/// The pauses in force at `now`, by kind.
pub async fn paused_kinds(pool: &PgPool, now: DateTime<Utc>) -> Result<Vec<Pause>, StoreError> {
    let rows = sqlx::query(&format!(
        "SELECT kind, paused_at, until_at, paused_by, note FROM kind_pause k
          WHERE {} ORDER BY kind",
        in_force(1)
    ))
    .bind(now)
    .fetch_all(pool)
    .await?;
    rows.iter()
        .map(|r| {
            Ok(Pause {
                kind: r.try_get("kind")?,
                paused_at: r.try_get("paused_at")?,
                until: r.try_get("until_at")?,
                paused_by: r.try_get("paused_by")?,
                note: r.try_get("note")?,
            })
        })
        .collect()
}

/// The statement of [`planned_and_paused_many`].
static PLANNED_AND_PAUSED: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "SELECT p.kind, p.day, p.slot, p.nominal_at, p.due_at, p.jitter_ms,
                clock_timestamp() AS db_now,
                EXISTS (SELECT 1 FROM kind_pause k WHERE k.kind = p.kind AND {}) AS paused
           {}",
        in_force_at("clock_timestamp()"),
        crate::store::PLANS_BY_KEY
    )
});

/// The stored plans of `keys` (those planned), each with whether its kind
/// is paused and Postgres's clock as it was read: the batch path's one
/// read per batch, in one statement (a read of the plans and one of the
/// pauses were two round trips per batch). Plans are looked up by key
/// (`store::PLANS_BY_KEY`). Time is Postgres's, so a worker whose clock
/// runs fast still runs nothing early.
pub async fn planned_and_paused_many<'a>(
    pool: &PgPool,
    keys: impl IntoIterator<Item = &'a SlotKey>,
) -> Result<Vec<(PlannedSlot, bool, DateTime<Utc>)>, StoreError> {
    let (kinds, days, nos) = crate::store::key_columns(keys);
    let rows = sqlx::query(PLANNED_AND_PAUSED.as_str())
        .bind(&kinds)
        .bind(&days)
        .bind(&nos)
        .fetch_all(pool)
        .await?;
    rows.iter()
        .map(|r| {
            Ok((
                crate::store::planned_row(r)?,
                r.try_get("paused")?,
                r.try_get("db_now")?,
            ))
        })
        .collect()
}

/// The executor's per-delivery read, in one statement.
#[derive(Debug, Clone)]
pub struct PlanRead {
    /// The slot's stored plan, if it was planned.
    pub planned: Option<PlannedSlot>,
    /// Whether the slot's kind is paused, by Postgres's clock.
    pub paused: bool,
    /// Postgres's clock when it was read: deadlines are judged by it.
    pub db_now: DateTime<Utc>,
}

/// The slot's stored plan (if any), whether its kind is paused and
/// Postgres's clock, in one statement: the executor's per-delivery read.
/// Every time rule of a delivery (not due, the deadline, the pause) is
/// judged by that clock, never the worker's.
pub async fn planned_and_paused(
    conn: &mut PgConnection,
    key: &SlotKey,
) -> Result<PlanRead, StoreError> {
    // Built once: the per-delivery statement text stays the same, so the
    // connection's prepared-statement cache serves it.
    static SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        format!(
            "SELECT p.nominal_at, p.due_at, p.jitter_ms, clock_timestamp() AS db_now,
                    EXISTS (SELECT 1 FROM kind_pause k WHERE k.kind = $1 AND {}) AS paused
               FROM (SELECT 1) AS one
               LEFT JOIN planned_slot p ON p.kind = $1 AND p.day = $2 AND p.slot = $3",
            in_force_at("clock_timestamp()")
        )
    });
    let r = sqlx::query(SQL.as_str())
        .bind(&key.kind)
        .bind(key.day)
        .bind(key.slot_no as i32)
        .fetch_one(conn)
        .await?;
    let due: Option<DateTime<Utc>> = r.try_get("due_at")?;
    let planned = match (due, r.try_get("nominal_at")?, r.try_get("jitter_ms")?) {
        (Some(due_at), Some(nominal_at), Some(jitter_ms)) => Some(PlannedSlot {
            key: key.clone(),
            nominal_at,
            due_at,
            jitter_ms,
        }),
        _ => None,
    };
    Ok(PlanRead {
        planned,
        paused: r.try_get("paused")?,
        db_now: r.try_get("db_now")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The batch path's plan read looks each plan up on its key, also in a
    /// table filled since Postgres last counted it (as during a planned
    /// day): as a join it hashed all of `planned_slot` for every batch.
    #[tokio::test]
    async fn the_batch_plan_read_looks_plans_up_by_key_in_a_table_not_yet_analyzed() {
        let db = testkit::TestDb::new().await;
        sqlx::query(
            "INSERT INTO planned_slot (kind, day, slot, nominal_at, due_at, jitter_ms, source)
             SELECT 'k' || (g % 10), DATE '2030-01-15', g, now(), now(), 0, 'planner'
               FROM generate_series(1, 20000) g",
        )
        .execute(&db.pool)
        .await
        .unwrap();
        let keys: Vec<SlotKey> = (1..=224)
            .map(|g| SlotKey::new(format!("k{}", g % 10), "2030-01-15".parse().unwrap(), g))
            .collect();
        let (kinds, days, nos) = crate::store::key_columns(&keys);
        let plan: Vec<String> = sqlx::query_scalar(&format!("EXPLAIN {}", *PLANNED_AND_PAUSED))
            .bind(&kinds)
            .bind(&days)
            .bind(&nos)
            .fetch_all(&db.pool)
            .await
            .unwrap();
        testkit::query_plan::assert_reads_by_index(
            &testkit::query_plan::text(&plan),
            "planned_slot",
            "planned_slot_pkey",
            &[],
        );
        // And it answers: every key is planned, none paused.
        let read = planned_and_paused_many(&db.pool, &keys).await.unwrap();
        assert_eq!(read.len(), 224);
        assert!(read.iter().all(|(_, paused, _)| !paused));
    }
}
