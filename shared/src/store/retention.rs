//! The statements of `planner prune` (the logic, batching and the
//! horizon, is `crate::retention`'s): counting and deleting old history a
//! batch at a time, and sealing pruned days with `skipped/pruned` gate rows.

use super::StoreError;
use crate::outcome::SkipReason;
use chrono::{DateTime, NaiveDate, Utc};
use sqlx::PgPool;

/// History kept per kind and local day, pruned for days before a date.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DayHistory {
    /// The stored CMS answers of gate rows (`publish_slot.response`),
    /// cleared; the gate rows themselves stay.
    Responses,
    /// `planned_slot` rows, deleted.
    Planned,
}

/// History kept by the instant it happened, pruned before a horizon.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgedHistory {
    /// `execution` rows, by `started_at`.
    Executions,
    /// Operators' `exemption_request` rows, by `requested_at`.
    Requests,
    /// The notice outbox's rows, by `created_at` (sent or not: a notice
    /// older than the history it reports on tells nobody anything).
    Notices,
}

impl DayHistory {
    fn count_sql(self) -> &'static str {
        match self {
            DayHistory::Responses => {
                "SELECT count(*) FROM publish_slot
                  WHERE kind = $1 AND day < $2 AND response IS NOT NULL"
            }
            DayHistory::Planned => "SELECT count(*) FROM planned_slot WHERE kind = $1 AND day < $2",
        }
    }
    fn prune_sql(self) -> &'static str {
        match self {
            DayHistory::Responses => {
                "UPDATE publish_slot SET response = NULL
                  WHERE id IN (SELECT id FROM publish_slot
                                WHERE kind = $1 AND day < $2 AND response IS NOT NULL
                                LIMIT $3)"
            }
            DayHistory::Planned => {
                "DELETE FROM planned_slot
                  WHERE (kind, day, slot) IN (SELECT kind, day, slot FROM planned_slot
                                               WHERE kind = $1 AND day < $2 LIMIT $3)"
            }
        }
    }
}

impl AgedHistory {
    fn count_sql(self) -> &'static str {
        match self {
            AgedHistory::Executions => "SELECT count(*) FROM execution WHERE started_at < $1",
            AgedHistory::Requests => {
                "SELECT count(*) FROM exemption_request WHERE requested_at < $1"
            }
            AgedHistory::Notices => "SELECT count(*) FROM notice WHERE created_at < $1",
        }
    }
    fn prune_sql(self) -> &'static str {
        match self {
            AgedHistory::Executions => {
                "DELETE FROM execution WHERE id IN
                   (SELECT id FROM execution WHERE started_at < $1 LIMIT $2)"
            }
            AgedHistory::Requests => {
                "DELETE FROM exemption_request WHERE id IN
                   (SELECT id FROM exemption_request WHERE requested_at < $1 LIMIT $2)"
            }
            AgedHistory::Notices => {
                "DELETE FROM notice WHERE id IN
                   (SELECT id FROM notice WHERE created_at < $1 LIMIT $2)"
            }
        }
    }
}

fn count(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

/// Rows of `what` of `kind`'s days before `before`.
pub async fn count_day_history(
    pool: &PgPool,
    what: DayHistory,
    kind: &str,
    before: NaiveDate,
) -> Result<u64, StoreError> {
    let n: i64 = sqlx::query_scalar(what.count_sql())
        .bind(kind)
        .bind(before)
        .fetch_one(pool)
        .await?;
    Ok(count(n))
}

/// Prunes at most `limit` rows of `what` of `kind`'s days before
/// `before`, in one short statement; how many it touched.
pub async fn prune_day_history(
    pool: &PgPool,
    what: DayHistory,
    kind: &str,
    before: NaiveDate,
    limit: i64,
) -> Result<u64, StoreError> {
    Ok(sqlx::query(what.prune_sql())
        .bind(kind)
        .bind(before)
        .bind(limit)
        .execute(pool)
        .await?
        .rows_affected())
}

/// Rows of `what` from before `horizon`.
pub async fn count_aged_history(
    pool: &PgPool,
    what: AgedHistory,
    horizon: DateTime<Utc>,
) -> Result<u64, StoreError> {
    let n: i64 = sqlx::query_scalar(what.count_sql())
        .bind(horizon)
        .fetch_one(pool)
        .await?;
    Ok(count(n))
}

/// Deletes at most `limit` rows of `what` from before `horizon`, in one
/// short statement; how many it deleted.
pub async fn prune_aged_history(
    pool: &PgPool,
    what: AgedHistory,
    horizon: DateTime<Utc>,
    limit: i64,
) -> Result<u64, StoreError> {
    Ok(sqlx::query(what.prune_sql())
        .bind(horizon)
        .bind(limit)
        .execute(pool)
        .await?
        .rows_affected())
}

/// The kind's first day with a planned or a gate row; `None` when it has
/// neither (never planned).
pub async fn first_history_day(pool: &PgPool, kind: &str) -> Result<Option<NaiveDate>, StoreError> {
    sqlx::query_scalar(
        "SELECT least((SELECT min(day) FROM planned_slot WHERE kind = $1),
                      (SELECT min(day) FROM publish_slot WHERE kind = $1))",
    )
    .bind(kind)
    .fetch_one(pool)
    .await
}

/// Gives every slot numbered in `slots` of `kind`'s days `from..to` that
/// has no gate row one, `skipped/pruned` claimed by `prune`; with
/// `dry_run`, only counts them. How many (would be) sealed.
pub async fn seal_days(
    pool: &PgPool,
    kind: &str,
    slots: &[i32],
    from: NaiveDate,
    to: NaiveDate,
    dry_run: bool,
) -> Result<u64, StoreError> {
    let sql = if dry_run {
        "SELECT count(*) FROM generate_series($2::date, $3::date - 1, interval '1 day') d,
                              UNNEST($4::int[]) s
          WHERE NOT EXISTS (SELECT 1 FROM publish_slot p
                             WHERE p.day = d::date AND p.slot = s AND p.kind = $1)"
    } else {
        "WITH ins AS (
           INSERT INTO publish_slot (day, slot, kind, state, claimed_by, reason)
           SELECT d::date, s, $1, 'skipped', 'prune', $5
             FROM generate_series($2::date, $3::date - 1, interval '1 day') d,
                  UNNEST($4::int[]) s
           ON CONFLICT (day, slot, kind) DO NOTHING
           RETURNING 1)
         SELECT count(*) FROM ins"
    };
    let n: i64 = sqlx::query_scalar(sql)
        .bind(kind)
        .bind(from)
        .bind(to)
        .bind(slots)
        .bind(SkipReason::Pruned.as_str())
        .fetch_one(pool)
        .await?;
    Ok(count(n))
}
