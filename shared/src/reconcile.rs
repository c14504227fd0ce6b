//! The leader's repair pass: Postgres is the truth, Redis is reconciled
//! against it.
//!
//! - Planned slots past due with no gate row and nothing queued (Redis was
//!   flushed, or the planner died between its commit and its enqueue) are
//!   re-delivered with caller `reconciler`. Slots that are queued — even if
//!   workers are merely slow — are left alone, so nothing piles up.
//! - Open slots whose claim expired (their worker died) and that have no
//!   delivery queued are re-delivered, to be resumed under the same key.
//! - Planned slots past `due + starting_deadline` with no outcome and no
//!   delivery queued are recorded `skipped/missed_deadline` (WARN). A queued
//!   delivery decides for itself: `manual` and `backfill` runs are exempt.
//! - The stream and the consumer group are recreated when missing.
//!
//! A pass costs what is due in its window, not what ever happened: for each
//! configured kind it reads only the planned slots due in
//! `(now − starting_deadline − LOOKBACK_MARGIN, now]` (index
//! `planned_slot_kind_due`). Every slot in that window is decided by some
//! pass (re-delivered, or recorded `missed_deadline` once its deadline is
//! past), so what lies before it is history and is never read again. A slot
//! that fell out of the window unrecorded — no leader ran for longer than
//! the margin after its deadline — stays `planned` in reports; `planner
//! backfill` delivers it if it should still run.

use crate::clock::{unix_ms, SharedClock};
use crate::config::Config;
use crate::outcome::{Outcome, SkipReason};
use crate::queue::{Queue, QueueError};
use crate::slot::SlotKey;
use crate::store::{self, ExecutionRecord, StoreError};
use serde_json::json;
use sqlx::PgPool;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

/// Why a pass stopped early; what it did before stays done, and the next
/// pass picks up the rest.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// Redis failed (group creation, the queued-slots snapshot, a
    /// re-delivery).
    #[error(transparent)]
    Queue(#[from] QueueError),
    /// Postgres failed; a `missed_deadline` record in flight was rolled back.
    #[error("postgres: {0}")]
    Store(#[from] StoreError),
}

/// What one pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pass {
    /// Planned slots past due with no gate row and nothing queued, delivered
    /// again with caller `reconciler`.
    pub redelivered: usize,
    /// Open slots whose claim expired with nothing queued, delivered again
    /// to be resumed under the same key.
    pub resumed: usize,
    /// Slots past their starting deadline recorded `skipped/missed_deadline`.
    pub missed: usize,
    /// Planned slots whose number this config does not know (a planner on
    /// another config): left alone, never re-delivered to be dead-lettered.
    pub unknown: usize,
}

/// Rows looked at per pass; the rest waits for the next pass.
const BATCH: i64 = 1000;

/// How long after its starting deadline a slot stays in the reconciler's
/// window: the time a leaderless fleet may be down and still have its
/// missed slots recorded `missed_deadline` when it comes back.
pub const LOOKBACK_MARGIN: Duration = Duration::from_secs(24 * 3600);

/// Each configured kind with the start of its window at `now`.
pub fn windows(
    config: &Config,
    now: chrono::DateTime<chrono::Utc>,
) -> Vec<(String, chrono::DateTime<chrono::Utc>)> {
    config
        .kinds
        .iter()
        .map(|k| {
            let back = chrono::Duration::from_std(k.starting_deadline + LOOKBACK_MARGIN)
                .ok()
                .and_then(|d| now.checked_sub_signed(d))
                .unwrap_or(chrono::DateTime::<chrono::Utc>::MIN_UTC);
            (k.name.clone(), back)
        })
        .collect()
}

/// The repair pass's inputs; the leading worker builds one and runs
/// [`Reconciler::run_once`] every `--reconcile-every`.
pub struct Reconciler {
    /// The kinds whose windows are read (each kind's `starting_deadline`
    /// sets its window and its deadline).
    pub config: Arc<Config>,
    /// Postgres, the truth the pass reads and records in.
    pub pool: PgPool,
    /// Redis, repaired against Postgres.
    pub queue: Queue,
    /// "Now" for windows and deadlines (a test clock in tests).
    pub clock: SharedClock,
    /// Recorded as the `worker_id` of the `missed_deadline` rows it writes.
    pub worker_id: String,
    /// A slot due less than this long ago is left to the normal path (it may
    /// be in flight between the delayed set and the stream).
    pub grace: Duration,
}

impl Reconciler {
    /// One pass. `still_leader` is checked before each group of writes.
    pub async fn run_once(
        &self,
        epoch: i64,
        still_leader: impl Fn() -> bool,
    ) -> Result<Pass, ReconcileError> {
        let mut pass = Pass::default();
        self.queue.ensure_group().await?;
        let now = self.clock.now();
        // Postgres first, Redis second, Postgres again: see below.
        let unstarted =
            store::unstarted_due(&self.pool, &windows(&self.config, now), now, BATCH).await?;
        let expired = store::expired_claims(&self.pool, now, BATCH).await?;
        if unstarted.is_empty() && expired.is_empty() {
            return Ok(pass);
        }
        // Redis is asked only about these slots, not read whole: the
        // unstarted ones first (in their order), then the expired claims'.
        let asked: Vec<String> = unstarted
            .iter()
            .map(|p| p.key.to_string())
            .chain(expired.iter().map(|r| r.key().to_string()))
            .collect();
        let queued = self.queue.queued_among(&asked).await?;
        // Postgres again, for what Redis did not have: a slot handled between
        // the first read and the snapshot (gate row committed, then its entry
        // acknowledged and deleted) now has its row and is left alone. What
        // is still without a row here was neither queued nor handled: lost.
        let candidates: Vec<SlotKey> = unstarted
            .iter()
            .zip(&asked)
            .filter(|(_, k)| !queued.contains(*k))
            .map(|(p, _)| p.key.clone())
            .collect();
        let still: HashSet<SlotKey> = store::without_gate(&self.pool, &candidates)
            .await?
            .into_iter()
            .collect();
        let unstarted: Vec<_> = unstarted
            .into_iter()
            .filter(|p| still.contains(&p.key))
            .collect();
        let open: HashSet<(i64, i32)> = store::expired_claims(&self.pool, now, BATCH)
            .await?
            .iter()
            .map(|r| (r.id, r.attempt))
            .collect();
        let expired: Vec<_> = expired
            .into_iter()
            .filter(|r| open.contains(&(r.id, r.attempt)))
            .collect();
        let grace = chrono::Duration::from_std(self.grace).unwrap_or_default();
        // A lost slot is re-delivered only once it is due by Redis's clock
        // too, as promotion would: a leader whose clock runs ahead must not
        // re-deliver a slot (after a Redis wipe, say) before its time.
        let server = chrono::DateTime::from_timestamp_millis(self.queue.server_time_ms().await?)
            .unwrap_or(now);
        let due_now = now.min(server);
        for p in unstarted {
            if !still_leader() {
                return Ok(pass);
            }
            let Some(kind) = self.config.kind(&p.key.kind) else {
                continue;
            };
            // A slot number this config does not know (a planner on a newer
            // config planned it): re-delivered, every worker on this config
            // would dead-letter it, and the next pass re-deliver it again.
            if kind.slot_time_on(p.key.day, p.key.slot_no).is_none() {
                pass.unknown += 1;
                continue;
            }
            let key_s = p.key.to_string();
            let deadline = crate::clock::later(p.due_at, kind.starting_deadline);
            // (Queued slots were filtered out above: their delivery decides,
            // and a manual or backfill run is exempt from the deadline.)
            if now > deadline {
                let mut tx = self.pool.begin().await?;
                // A blacked-out day's slot was never to run: its fate is
                // the calendar's, not a missed deadline.
                let reason = if kind.day(p.key.day).blackout {
                    SkipReason::Blackout
                } else {
                    SkipReason::MissedDeadline
                };
                let late_ms = (now - p.due_at).num_milliseconds();
                let rec = || {
                    ExecutionRecord::new(
                        key_s.as_str(),
                        Some(p.key.clone()),
                        Outcome::Skipped(reason),
                        now,
                        self.clock.now(),
                    )
                    .by("reconciler", self.worker_id.as_str())
                    .epoch(Some(epoch))
                    .detail(json!({"late_ms": late_ms}))
                    .due(Some(p.due_at))
                };
                if store::settle_skipped(&mut tx, &p.key, reason, &self.worker_id, now, rec).await?
                {
                    tx.commit().await?;
                    pass.missed += 1;
                    tracing::warn!(slot = %key_s, late_ms, "slot never ran before its starting deadline; recorded skipped/missed_deadline");
                }
            } else if due_now - p.due_at > grace {
                self.queue
                    .deliver(&key_s, "reconciler", unix_ms(now))
                    .await?;
                pass.redelivered += 1;
                tracing::info!(slot = %key_s, "planned slot was due and not queued; re-delivered");
            }
        }
        if pass.unknown > 0 {
            tracing::warn!(unknown = pass.unknown, fingerprint = %self.config.fingerprint(), "planned slots this worker's config does not know were left alone (not re-delivered): the planner and the workers run different configs; `planner status` shows whose differs");
        }
        for row in expired {
            if !still_leader() {
                return Ok(pass);
            }
            let key_s = row.key().to_string();
            if !queued.contains(&key_s) {
                self.queue
                    .deliver(&key_s, "reconciler", unix_ms(now))
                    .await?;
                pass.resumed += 1;
                tracing::info!(slot = %key_s, previous = %row.claimed_by, attempt = row.attempt, "claim expired with nothing queued; re-delivered for resumption");
            }
        }
        Ok(pass)
    }
}
