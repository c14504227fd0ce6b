//! Retention: `planner prune` deletes old history without giving up the
//! guard.
//!
//! What goes: `execution` rows that started before the horizon, the stored
//! CMS answers (`publish_slot.response`) of days before it, and the
//! `planned_slot` rows of those days. What stays: every `publish_slot` gate
//! row (small, and the only thing that stops a late duplicate), drafts, and
//! the daily quota rows.
//!
//! A pruned day stays guarded: before anything is deleted, every configured
//! slot of every pruned day that has no gate row yet gets one, `skipped`
//! with reason `pruned` (claimed by `prune`). A later backfill then finds
//! nothing to deliver, and a `redis-cli` delivery for a pruned slot meets
//! the gate and is recorded `skipped/slot_taken`. Sealing is safe because
//! the horizon is at least [`MIN_AGE`], longer than the longest
//! `starting_deadline` a config accepts: no such slot could still run on
//! its own.
//!
//! Every statement touches at most [`BATCH`] rows and commits on its own,
//! so workers never wait on prune for more than one short statement.

use crate::config::Config;
use crate::slot::local_today;
use crate::store::{self, AgedHistory, DayHistory};
use chrono::{DateTime, NaiveDate, Utc};
use serde::Serialize;
use sqlx::PgPool;
use std::time::Duration;

/// The shortest horizon prune accepts: eight days, one more than the
/// longest `starting_deadline` a config may set.
pub const MIN_AGE: Duration = Duration::from_secs(8 * 24 * 3600);

/// The longest horizon prune accepts (100 years), so no value can leave
/// the calendar.
pub const MAX_AGE: Duration = Duration::from_secs(36_500 * 24 * 3600);

/// Rows touched by one statement.
pub const BATCH: i64 = 1000;

/// Why prune stopped.
#[derive(Debug, thiserror::Error)]
pub enum RetentionError {
    /// `--older-than` outside [`MIN_AGE`]..=[`MAX_AGE`]; nothing was touched.
    #[error("--older-than {given} is out of range: from 8d (longer than any starting_deadline) to 36500d")]
    OutOfRange {
        /// The value given, as a humane duration.
        given: String,
    },
    /// Postgres failed; the batches committed before stay done (sealing
    /// comes first, so no pruned day is ever left unguarded).
    #[error("postgres: {0}")]
    Store(#[from] sqlx::Error),
}

/// What prune did (or, with `dry_run`, would do).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Pruned {
    /// Executions that started before this instant are deleted.
    pub executions_before: DateTime<Utc>,
    /// Per kind: local days before this date are pruned.
    pub days_before: std::collections::BTreeMap<String, NaiveDate>,
    /// Gate rows added as `skipped/pruned`.
    pub sealed: u64,
    /// `execution` rows deleted.
    pub executions: u64,
    /// Stored CMS answers cleared (the gate rows themselves stay).
    pub responses: u64,
    /// `planned_slot` rows deleted.
    pub planned: u64,
    /// Operators' `exemption_request` rows deleted (requested before the
    /// executions' horizon).
    pub requests: u64,
    /// Notice outbox rows deleted (written before the executions' horizon).
    pub notices: u64,
    /// `true`: the counts are what would go; nothing was changed.
    pub dry_run: bool,
}

/// Prunes history older than `older_than` ([`MIN_AGE`]..=[`MAX_AGE`]).
pub async fn prune(
    pool: &PgPool,
    config: &Config,
    now: DateTime<Utc>,
    older_than: Duration,
    dry_run: bool,
) -> Result<Pruned, RetentionError> {
    if !(MIN_AGE..=MAX_AGE).contains(&older_than) {
        return Err(RetentionError::OutOfRange {
            given: humantime::format_duration(older_than).to_string(),
        });
    }
    // Bounded above, so this cannot leave chrono's range; saturate anyway.
    let horizon = chrono::Duration::from_std(older_than)
        .ok()
        .and_then(|d| now.checked_sub_signed(d))
        .unwrap_or(DateTime::<Utc>::MIN_UTC);
    let mut out = Pruned {
        executions_before: horizon,
        days_before: Default::default(),
        sealed: 0,
        executions: 0,
        responses: 0,
        planned: 0,
        requests: 0,
        notices: 0,
        dry_run,
    };
    // A local day is pruned when it ended before the horizon: every day
    // before the kind's local date at the horizon.
    for k in &config.kinds {
        let before = local_today(k.timezone, horizon);
        out.days_before.insert(k.name.clone(), before);
        let numbers: Vec<i32> = k.slot_numbers.iter().map(|n| *n as i32).collect();
        out.sealed += seal(pool, &k.name, &numbers, before, dry_run).await?;
    }
    for (kind, before) in &out.days_before {
        out.responses += by_day(pool, dry_run, DayHistory::Responses, kind, *before).await?;
        out.planned += by_day(pool, dry_run, DayHistory::Planned, kind, *before).await?;
    }
    out.executions = by_age(pool, dry_run, AgedHistory::Executions, horizon).await?;
    // An operator's request is history once its slot's day is sealed; kept
    // as long as the executions it explains.
    out.requests = by_age(pool, dry_run, AgedHistory::Requests, horizon).await?;
    out.notices = by_age(pool, dry_run, AgedHistory::Notices, horizon).await?;
    Ok(out)
}

/// Counts (`dry_run`) or prunes, in batches, `what` from before `horizon`.
async fn by_age(
    pool: &PgPool,
    dry_run: bool,
    what: AgedHistory,
    horizon: DateTime<Utc>,
) -> Result<u64, RetentionError> {
    if dry_run {
        return Ok(store::count_aged_history(pool, what, horizon).await?);
    }
    drain(|| store::prune_aged_history(pool, what, horizon, BATCH)).await
}

/// Gives every configured slot (`slots`: their numbers) of the kind's days before `before` a gate
/// row, from the kind's first day with a planned or gate row on. Days with
/// no row at all before that were never planned and are left alone.
async fn seal(
    pool: &PgPool,
    kind: &str,
    slots: &[i32],
    before: NaiveDate,
    dry_run: bool,
) -> Result<u64, RetentionError> {
    let Some(mut from) = store::first_history_day(pool, kind).await? else {
        return Ok(0);
    };
    let mut sealed = 0;
    // A month of days per statement keeps each insert small.
    while from < before {
        let to = (from + chrono::Days::new(31)).min(before);
        sealed += store::seal_days(pool, kind, slots, from, to, dry_run).await?;
        from = to;
    }
    Ok(sealed)
}

/// Counts (`dry_run`) or prunes, in batches, `what` of `kind`'s days
/// before `before`.
async fn by_day(
    pool: &PgPool,
    dry_run: bool,
    what: DayHistory,
    kind: &str,
    before: NaiveDate,
) -> Result<u64, RetentionError> {
    if dry_run {
        return Ok(store::count_day_history(pool, what, kind, before).await?);
    }
    drain(|| store::prune_day_history(pool, what, kind, before, BATCH)).await
}

/// Runs `one` (a statement touching at most [`BATCH`] rows, each its own
/// short transaction) until it touches fewer; the rows touched in all.
async fn drain<F, Fut>(mut one: F) -> Result<u64, RetentionError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<u64, sqlx::Error>>,
{
    let mut n = 0;
    loop {
        let done = one().await?;
        n += done;
        if done < BATCH as u64 {
            return Ok(n);
        }
    }
}
