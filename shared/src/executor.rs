//! One delivery, start to finish: validate → gate → quota → pick → publish →
//! record → acknowledge.
//!
//! The gate is the `publish_slot` unique row; the quota is a conditional
//! upsert; the pick is `FOR UPDATE SKIP LOCKED`. All three commit in one
//! transaction with the draft bound to the slot, so a crash before the commit
//! leaves nothing behind and a crash after it leaves an open claim that the
//! next delivery resumes under the same key with the same draft.
//!
//! Every delivery ends in exactly one `execution` row, written in the same
//! transaction as the state it reports, and the stream entry is acknowledged
//! only after that commit.
//!
//! Postgres never holds a delivery for long: every transaction runs under
//! the session's timeouts and a client-side deadline, and a delivery that
//! hits one rolls back and fails with an [`ExecError`] (the worker retries
//! it later; nothing is acknowledged). Once the CMS has answered, storing
//! the outcome is retried in place with the answer kept in memory, so a
//! store error after the call never leads to a second call.
//!
//! [`Executor::batch`] is the same pipeline for many deliveries at once
//! (a backlog): one gate commit for the batch, its webhook calls concurrent,
//! one commit for their outcomes. It decides only the plain case and leaves
//! everything else to [`Executor::handle`]. Both paths run the one gate,
//! [`store::gate_batch`] and [`store::finish_batch`]: a single delivery is
//! a batch of one.

use crate::clock::{unix_ms, SharedClock};
use crate::config::{Config, KindConfig};
use crate::outcome::{FailReason, Outcome, SkipReason};
use crate::publish::{CallReport, Webhook};
use crate::queue::{Delivery, Queue, QueueError};
use crate::retry::{Reconnect, RetryPolicy};
use crate::slot::{planned_slot, PlannedSlot, SlotKey};
use crate::store::{self, ExecutionRecord, StoreError};
use chrono::{DateTime, Utc};
use rand::SeedableRng;
use serde_json::{json, Value};
use sqlx::PgPool;
use std::collections::HashSet;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A delivery seen more times than this is dead-lettered (`max_deliveries`).
pub const MAX_DELIVERIES: u64 = 10;

/// Callers that asked for a late run on purpose: exempt from `starting_deadline`.
/// `cronjob` (`planner trigger --from-job-name`) is not: a CronJob's run is a
/// scheduled one, and a run that starts too late is `missed_deadline`.
pub const DEADLINE_EXEMPT: &[&str] = &["manual", "backfill"];

/// A `starting_deadline` longer than this (100 years) is treated as this,
/// so it fits a Postgres interval.
const MAX_DEADLINE_MS: i64 = 100 * 366 * 24 * 3600 * 1000;

/// How far ahead of its time a slot may be delivered and still run. A
/// minute absorbs clock differences between the planner, Redis and the
/// workers; a delivery earlier than that (a day that has not come, injected
/// with `redis-cli` or by a confused caller) is recorded `not_due` and runs
/// nothing.
pub const EARLY_TOLERANCE: Duration = Duration::from_secs(60);

/// The stream field (`early=1`, with caller `manual`) by which `planner
/// trigger --early` asks to run a slot before its time.
pub const EARLY_FIELD: &str = "early";

/// Whether `d` asked to run its slot before its time: `early=1` from
/// caller `manual`, which is what `planner trigger --early` sends.
pub fn asks_early(d: &Delivery) -> bool {
    d.caller() == "manual" && d.early() == Some("1")
}

/// How long before `runs_at` the instant `now` is, when that is more than
/// [`EARLY_TOLERANCE`]: a slot must not run yet. The one statement of the
/// rule "a slot never runs before its time"; both delivery paths and
/// `planner trigger` ask it.
pub fn ahead_of_time(runs_at: DateTime<Utc>, now: DateTime<Utc>) -> Option<chrono::Duration> {
    let ahead = runs_at.signed_duration_since(now);
    (ahead.to_std().is_ok_and(|a| a > EARLY_TOLERANCE)).then_some(ahead)
}

/// What handling a delivery came to.
#[derive(Debug, Clone, PartialEq)]
pub enum Handled {
    /// The delivery's outcome was recorded and the entry acknowledged.
    Recorded(Outcome),
    /// The entry's outcome had been recorded before (a redelivery after a
    /// crash between commit and acknowledgement); acknowledged, no new row.
    AlreadyHandled,
}

/// Infrastructure failures: the delivery is *not* acknowledged and will be
/// handled again.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error("postgres: {0}")]
    Store(#[from] StoreError),
    #[error(transparent)]
    Queue(#[from] QueueError),
    /// A transaction outlived the client-side deadline (the server went
    /// silent); it was abandoned and rolls back.
    #[error("postgres: no answer within the transaction deadline of {0:?}")]
    Deadline(Duration),
    /// Another delivery of the same slot is being handled by this process
    /// right now; this one waits its turn.
    #[error("slot {0} is being handled by this worker already")]
    Busy(String),
}

impl ExecError {
    /// Postgres kept the delivery waiting past a limit: a lock held by
    /// another session (`lock_timeout`, SQLSTATE 55P03), a statement past
    /// `statement_timeout` (57014), a transaction past its deadline. The
    /// same is likely for the next deliveries of the kind.
    pub fn is_stall(&self) -> bool {
        match self {
            ExecError::Deadline(_) => true,
            ExecError::Store(StoreError::Database(d)) => {
                matches!(d.code().as_deref(), Some("55P03" | "57014"))
            }
            _ => false,
        }
    }
}

/// The gate's answer.
#[derive(Debug)]
pub enum Gate {
    /// This delivery owns the slot, with a draft bound to it.
    Claimed(Claim),
    /// Someone else owns or finished the slot; `slot_taken` is recorded.
    Taken(Outcome),
    /// This delivery decided the slot inside the gate transaction
    /// (`quota_full`, `no_ready_draft`, `missed_deadline`, or a record-only
    /// publish); the outcome is recorded.
    Settled(Outcome),
    /// The slot's previous owner died mid-publish; this delivery resumes it.
    Resume(Claim),
    /// This stream entry's outcome is already recorded (a redelivery after a
    /// crash between commit and acknowledgement): nothing new is written.
    /// The `execution.entry_id` upsert detects it, so the hot path needs no
    /// separate look-up.
    Handled,
}

/// What the plain gate ([`Executor::gate_one`]) left to do.
enum GateOne {
    /// Claimed or settled.
    Decided(Gate),
    /// Not taken; the slot is settled as skipped for this reason.
    Settle(SkipReason),
    /// The slot has a gate row already.
    Exists,
}

/// A slot's plan as a delivery finds it.
#[derive(Debug, Clone)]
struct Plan {
    slot: PlannedSlot,
    /// `false`: nobody planned the slot (a delivery injected by hand); the
    /// plan is the config's, stored only once the slot is due and runs.
    stored: bool,
}

impl Plan {
    /// When the slot may run: its stored due time, or for a slot nobody
    /// planned, its nominal time.
    fn runs_at(&self) -> DateTime<Utc> {
        if self.stored {
            self.slot.due_at
        } else {
            self.slot.nominal_at
        }
    }
}

/// A slot this delivery owns, fenced by `(worker, attempt)`.
#[derive(Debug, Clone)]
pub struct Claim {
    pub row_id: i64,
    pub attempt: i32,
    pub post_id: i64,
}

/// The slots this process is handling right now: one delivery per slot at a
/// time. A delivery takes its slot here before the gate and keeps it until
/// its outcome is committed (or it gives up); a second delivery of the same
/// slot meanwhile (a reclaimed copy, a redelivery) waits its turn
/// ([`ExecError::Busy`]) instead of meeting its own worker's claim and
/// mistaking it for a duplicate.
///
/// Holding the slot also tells the gate that a live claim under this
/// worker's id was *not* made by this process: it was left by an earlier
/// run under the same id, and is resumed at once.
#[derive(Debug, Clone, Default)]
pub struct InFlight(Arc<Mutex<HashSet<SlotKey>>>);

impl InFlight {
    fn try_hold(&self, key: &SlotKey) -> Option<Held> {
        let mut set = self.0.lock().expect("in-flight set poisoned");
        set.insert(key.clone()).then(|| Held {
            set: self.clone(),
            key: key.clone(),
        })
    }
}

/// A slot held in [`InFlight`]; released when dropped (also when a
/// delivery's future is dropped half-way).
#[derive(Debug)]
struct Held {
    set: InFlight,
    key: SlotKey,
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Ok(mut set) = self.set.0.lock() {
            set.remove(&self.key);
        }
    }
}

/// Executes deliveries. Cheap to clone; one per worker.
#[derive(Clone)]
pub struct Executor {
    pub config: Arc<Config>,
    pub pool: PgPool,
    pub queue: Queue,
    pub webhook: Webhook,
    pub clock: SharedClock,
    /// Also the consumer name in the stream group.
    pub worker_id: String,
    /// How long a claim lives without a heartbeat.
    pub visibility: Duration,
    /// The leader epoch this worker last saw (0 = none yet).
    pub epoch_seen: Arc<AtomicI64>,
    /// Replaces each kind's webhook retry policy (tests use short delays).
    pub retry_override: Option<RetryPolicy>,
    /// Client-side deadline of each transaction (`--pg-transaction-deadline`).
    pub tx_deadline: Duration,
    /// The slots this process is handling; shared by all its deliveries.
    pub in_flight: InFlight,
}

struct Ctx<'a> {
    d: &'a Delivery,
    key: SlotKey,
    kind: &'a KindConfig,
    started_at: DateTime<Utc>,
}

impl Executor {
    fn epoch(&self) -> Option<i64> {
        Some(self.epoch_seen.load(Ordering::Relaxed)).filter(|e| *e > 0)
    }

    /// Runs `f` (one or more transactions) under the transaction deadline.
    /// When it expires the future is dropped: its transaction rolls back
    /// and its connection is tested before reuse.
    async fn deadline<T, E>(&self, f: impl Future<Output = Result<T, E>>) -> Result<T, ExecError>
    where
        ExecError: From<E>,
    {
        match tokio::time::timeout(self.tx_deadline, f).await {
            Ok(r) => r.map_err(ExecError::from),
            Err(_) => Err(ExecError::Deadline(self.tx_deadline)),
        }
    }

    fn record(
        &self,
        c: &Ctx<'_>,
        outcome: Outcome,
        detail: Value,
        due_at: Option<DateTime<Utc>>,
    ) -> ExecutionRecord {
        ExecutionRecord {
            slot_key: c.key.to_string(),
            key: Some(c.key.clone()),
            entry_id: Some(c.d.entry_id.clone()),
            caller: c.d.caller().to_owned(),
            worker_id: self.worker_id.clone(),
            leader_epoch: self.epoch(),
            outcome: outcome.as_str(),
            reason: outcome.reason(),
            detail,
            due_at,
            started_at: c.started_at,
            finished_at: self.clock.now(),
        }
    }

    /// Handles one delivery completely, acknowledging it at the end. An
    /// `Err` means nothing was acknowledged; the entry stays pending.
    pub async fn handle(&self, d: &Delivery) -> Result<Handled, ExecError> {
        let started_at = self.clock.now();
        if d.deliveries > MAX_DELIVERIES {
            let detail = json!({"deliveries": d.deliveries});
            return self
                .dead_letter(d, FailReason::MaxDeliveries, detail, started_at)
                .await;
        }
        let (key, kind) = match self.validate(d) {
            Ok(v) => v,
            Err((reason, why)) => {
                return self
                    .dead_letter(d, reason, json!({"error": why}), started_at)
                    .await
            }
        };
        let Some(_held) = self.in_flight.try_hold(&key) else {
            return Err(ExecError::Busy(key.to_string()));
        };
        crate::sabotage::early(self, &key, kind, started_at); // test-only hook, see crate::sabotage
        let c = Ctx {
            d,
            key,
            kind,
            started_at,
        };
        let (plan, db_now, paused) = self.deadline(self.planned(&c)).await?;
        let planned = &plan.slot;
        let outcome = match self.deadline(self.gate(&c, &plan, db_now, paused)).await? {
            Gate::Taken(o) | Gate::Settled(o) => o,
            Gate::Claimed(claim) => self.publish(&c, planned, claim, false).await?,
            Gate::Resume(claim) => self.publish(&c, planned, claim, true).await?,
            Gate::Handled => {
                self.queue.ack(&d.entry_id).await?;
                tracing::info!(entry = %d.entry_id, slot = %c.key, "entry already handled; acknowledged again");
                return Ok(Handled::AlreadyHandled);
            }
        };
        self.queue.ack(&d.entry_id).await?;
        crate::telemetry::execution(&c.key.kind, outcome.as_str(), outcome.reason());
        Ok(Handled::Recorded(outcome))
    }

    /// Whether `d` may go through [`Executor::batch`]: a valid delivery
    /// under the delivery limit. Anything else (malformed, poisoned) needs
    /// the one-delivery path, which dead-letters it.
    pub fn batchable(&self, d: &Delivery) -> bool {
        d.deliveries <= MAX_DELIVERIES && self.validate(d).is_ok()
    }

    /// The batch path: takes the plain deliveries of `ds` (all
    /// [`Executor::batchable`]) through the gate in one statement and one
    /// commit; record-only slots are settled there, webhook slots are
    /// claimed, published concurrently and recorded together in a second
    /// statement. Then everything it decided is acknowledged at once.
    /// Returns the indexes into `ds` it decided; the others were left
    /// untouched and go through [`Executor::handle`].
    ///
    /// On `Err` the caller runs *every* delivery through `handle`: one whose
    /// outcome committed is found by its entry id (`Gate::Handled`). An
    /// `Err` never comes after a webhook call: once the calls are made,
    /// their outcomes are stored in place until they commit. A claim whose
    /// commit was in doubt (the gate's answer lost) is this worker's own
    /// open claim, which `handle` resumes at once under the same key; the
    /// CMS has not been called for it yet.
    pub async fn batch(&self, ds: &[Delivery]) -> Result<Vec<usize>, ExecError> {
        let started_at = self.clock.now();
        // Slots held until this returns; one held elsewhere in this process
        // is left out (its delivery goes through `handle`, which waits).
        let mut held = Vec::with_capacity(ds.len());
        let now = self.clock.now();
        // A slot not yet due is left to `handle`, which records `not_due`.
        // (A slot nobody planned is left to it by the gate function.)
        let keys: Vec<SlotKey> = ds
            .iter()
            .filter_map(|d| self.validate(d).ok())
            .map(|(k, _)| k)
            .collect();
        let not_yet: std::collections::HashSet<SlotKey> = self
            .deadline(store::get_planned_many(&self.pool, &keys))
            .await?
            .into_iter()
            .filter(|p| ahead_of_time(p.due_at, now).is_some())
            .map(|p| p.key)
            .collect();
        // Deliveries of a paused kind are left to `handle`, which records
        // them skipped/paused (one read per batch).
        let paused = crate::pause::paused_kinds(&self.pool, started_at).await?;
        let mut items: Vec<(usize, store::BatchSlot)> = ds
            .iter()
            .enumerate()
            .filter_map(|(i, d)| {
                let (key, kind) = self.validate(d).ok()?;
                if not_yet.contains(&key) && !asks_early(d) {
                    return None;
                }
                if paused.contains(&key.kind) {
                    return None;
                }
                held.push(self.in_flight.try_hold(&key)?);
                let deadline_ms = i64::try_from(kind.starting_deadline.as_millis())
                    .unwrap_or(i64::MAX)
                    .min(MAX_DEADLINE_MS);
                Some((
                    i,
                    store::BatchSlot {
                        key,
                        entry_id: d.entry_id.clone(),
                        caller: d.caller().to_owned(),
                        exempt: DEADLINE_EXEMPT.contains(&d.caller()),
                        deadline_ms,
                        cap: kind.daily_cap,
                        started_at,
                        record_only: kind.publish_url.is_none(),
                    },
                ))
            })
            .collect();
        // The gate's lock order (see `store::gate_batch`).
        items.sort_by(|a, b| {
            (&a.1.key.kind, a.1.key.day, a.1.key.slot_no).cmp(&(
                &b.1.key.kind,
                b.1.key.day,
                b.1.key.slot_no,
            ))
        });
        let (index, slots): (Vec<usize>, Vec<store::BatchSlot>) = items.into_iter().unzip();
        let expires = crate::clock::later(now, self.visibility);
        let Some(rows) = self
            .deadline(store::gate_batch(
                &self.pool,
                &slots,
                &self.worker_id,
                self.epoch(),
                now,
                expires,
            ))
            .await?
        else {
            tracing::debug!(
                deliveries = ds.len(),
                "a daily cap cannot cover the whole batch; deciding its slots one at a time"
            );
            return Ok(Vec::new());
        };
        let rows = rows.claims;
        for r in &rows {
            crate::telemetry::lag(&slots[r.idx as usize].key.kind, started_at - r.due_at);
        }
        let (settled, claimed): (Vec<_>, Vec<_>) = rows.into_iter().partition(|r| r.settled);
        let recorded = self.publish_claimed(ds, &index, &slots, claimed).await?;
        let entries: Vec<&str> = settled
            .iter()
            .map(|r| slots[r.idx as usize].entry_id.as_str())
            .chain(recorded.iter().map(|(i, _)| slots[*i].entry_id.as_str()))
            .collect();
        self.queue.ack_all(&entries).await?;
        let mut done = Vec::with_capacity(entries.len());
        for r in &settled {
            let b = &slots[r.idx as usize];
            crate::telemetry::execution(&b.key.kind, "published", None);
            let lag_ms = (started_at - r.due_at).num_milliseconds();
            tracing::info!(slot = %b.key, caller = %b.caller, draft = r.post_id, lag_ms, "published (record-only, batched)");
            done.push(index[r.idx as usize]);
        }
        for (i, o) in &recorded {
            crate::telemetry::execution(&slots[*i].key.kind, o.as_str(), o.reason());
            done.push(index[*i]);
        }
        Ok(done)
    }

    /// Publishes the webhook slots a batch claimed, all at once, and records
    /// their outcomes in one statement. Returns (slot index, outcome).
    async fn publish_claimed(
        &self,
        ds: &[Delivery],
        index: &[usize],
        slots: &[store::BatchSlot],
        claimed: Vec<store::BatchClaim>,
    ) -> Result<Vec<(usize, Outcome)>, ExecError> {
        if claimed.is_empty() {
            return Ok(Vec::new());
        }
        let work: Vec<(Ctx<'_>, PlannedSlot, Claim, DraftText, usize)> = claimed
            .into_iter()
            .map(|r| {
                let b = &slots[r.idx as usize];
                let kind = self.config.kind(&b.key.kind).expect("validated kind");
                let planned = PlannedSlot {
                    key: b.key.clone(),
                    nominal_at: r.nominal_at,
                    due_at: r.due_at,
                    jitter_ms: (r.due_at - r.nominal_at).num_milliseconds(),
                };
                let c = Ctx {
                    d: &ds[index[r.idx as usize]],
                    key: b.key.clone(),
                    kind,
                    started_at: b.started_at,
                };
                let claim = Claim {
                    row_id: r.gate_id,
                    attempt: 1,
                    post_id: r.post_id,
                };
                let draft = DraftText {
                    id: r.post_id,
                    title: r.title,
                    body: r.body,
                };
                (c, planned, claim, draft, r.idx as usize)
            })
            .collect();
        // Every claim keeps its heartbeat until the batch's outcomes are
        // committed, not just until its own call returned: the batch waits
        // for its slowest call, and a finished slot's claim must not lapse
        // meanwhile. (Dropped on an early return, they stop by themselves.)
        let heartbeats: Vec<Heartbeat> = work
            .iter()
            .map(|(c, _, claim, _, _)| self.heartbeat(claim, &c.d.entry_id))
            .collect();
        let effects = futures_util::future::join_all(
            work.iter()
                .map(|(c, planned, claim, draft, _)| self.calls(c, planned, claim, draft, false)),
        )
        .await;
        let (rows, outcomes): (Vec<store::BatchFinish>, Vec<Outcome>) = work
            .iter()
            .zip(effects)
            .zip(&heartbeats)
            .map(|(((c, planned, claim, _, _), (publish, detail)), hb)| {
                self.finish_row(c, planned, claim, &publish, detail, &hb.lost)
            })
            .unzip();
        // The calls are made: from here on the outcomes are stored, retried
        // in place until they are, never by calling again.
        let now = self.clock.now();
        let finished = self
            .store_outcome("batch", || {
                store::finish_batch(&self.pool, &rows, &self.worker_id, now)
            })
            .await;
        for hb in heartbeats {
            hb.stop().await;
        }
        let mut out = Vec::with_capacity(finished.len());
        for (i, f) in finished.into_iter().enumerate() {
            let (c, planned, claim, _, si) = &work[i];
            out.push((
                *si,
                self.finished(c, planned, claim, outcomes[i], &rows[i], f),
            ));
        }
        Ok(out)
    }

    /// What [`store::finish_batch`] records for one publish: its outcome
    /// when the claim's fence holds, `slot_taken` (claim lost) when not.
    fn finish_row(
        &self,
        c: &Ctx<'_>,
        planned: &PlannedSlot,
        claim: &Claim,
        publish: &Result<(String, Value, u32), CallReport>,
        detail: serde_json::Map<String, Value>,
        claim_lost: &AtomicBool,
    ) -> (store::BatchFinish, Outcome) {
        let due = Some(planned.due_at);
        let (outcome, response, url, detail) = settle_fields(publish, detail);
        let saw_loss = claim_lost.load(Ordering::Relaxed);
        let lost_detail =
            json!({"claim_lost": true, "attempt": claim.attempt, "heartbeat_saw_loss": saw_loss});
        let row = store::BatchFinish {
            id: claim.row_id,
            attempt: claim.attempt,
            post_id: claim.post_id,
            state: outcome.as_str(),
            reason: outcome.reason(),
            response,
            url,
            record: self.record(c, outcome, detail, due),
            lost: self.record(c, Outcome::Skipped(SkipReason::SlotTaken), lost_detail, due),
        };
        (row, outcome)
    }

    /// Logs how a finish went; returns the delivery's outcome.
    fn finished(
        &self,
        c: &Ctx<'_>,
        planned: &PlannedSlot,
        claim: &Claim,
        outcome: Outcome,
        row: &store::BatchFinish,
        f: store::Finished,
    ) -> Outcome {
        match f {
            store::Finished::Recorded => {
                self.log_finished(c, planned, claim, outcome, &row.record.detail);
                outcome
            }
            store::Finished::Earlier => {
                // Settled under this very claim: an earlier try of this
                // transaction committed and only its answer was lost.
                tracing::info!(slot = %c.key, "the outcome was committed by an earlier try");
                self.log_finished(c, planned, claim, outcome, &row.record.detail);
                outcome
            }
            store::Finished::Lost => {
                // Another worker took the slot over while we were away: our
                // result must not land. It finishes the slot under the same key.
                tracing::warn!(slot = %c.key, attempt = claim.attempt, "claim lost to a takeover; recorded slot_taken (claim_lost) and changed nothing");
                Outcome::Skipped(SkipReason::SlotTaken)
            }
        }
    }

    fn validate(&self, d: &Delivery) -> Result<(SlotKey, &KindConfig), (FailReason, String)> {
        if let Some(defect) = d.defect() {
            return Err((FailReason::BadMessage, defect.to_string()));
        }
        let raw = d
            .slot()
            .ok_or((FailReason::BadMessage, "missing field `slot`".to_owned()))?;
        let key: SlotKey = raw
            .parse()
            .map_err(|e| (FailReason::BadMessage, format!("slot {raw:?}: {e}")))?;
        let kind = self.config.kind(&key.kind).ok_or((
            FailReason::UnknownKind,
            format!("kind {:?} is not configured", key.kind),
        ))?;
        if key.slot_no as usize > kind.slots.len() {
            return Err((
                FailReason::UnknownSlot,
                format!("slot_no {} outside 1..={}", key.slot_no, kind.slots.len()),
            ));
        }
        Ok((key, kind))
    }

    /// Records a malformed or hopeless delivery, then moves it to `P:dead`.
    async fn dead_letter(
        &self,
        d: &Delivery,
        reason: FailReason,
        detail: Value,
        started_at: DateTime<Utc>,
    ) -> Result<Handled, ExecError> {
        let raw = d.slot().unwrap_or("");
        // A defective entry's slot is not believed, even when it parses.
        let key: Option<SlotKey> = raw.parse().ok().filter(|_| d.defect().is_none());
        let rec = ExecutionRecord {
            slot_key: raw.to_owned(),
            key: key.filter(|k| {
                self.config
                    .kind(&k.kind)
                    .is_some_and(|kc| k.slot_no as usize <= kc.slots.len())
            }),
            entry_id: Some(d.entry_id.clone()),
            caller: d.caller().to_owned(),
            worker_id: self.worker_id.clone(),
            leader_epoch: self.epoch(),
            outcome: "failed",
            reason: Some(reason.as_str()),
            detail,
            due_at: None,
            started_at,
            finished_at: self.clock.now(),
        };
        self.deadline(async {
            let mut conn = self.pool.acquire().await?;
            store::insert_execution(&mut conn, &rec).await
        })
        .await?;
        self.queue
            .dead_letter(d, reason.as_str(), unix_ms(self.clock.now()))
            .await?;
        tracing::warn!(entry = %d.entry_id, slot = raw, caller = d.caller(), reason = reason.as_str(), deliveries = d.deliveries, "delivery dead-lettered");
        crate::telemetry::dead_letter(reason.as_str());
        crate::telemetry::execution(
            rec.key.as_ref().map_or("", |k| k.kind.as_str()),
            "failed",
            Some(reason.as_str()),
        );
        Ok(Handled::Recorded(Outcome::Failed(reason)))
    }

    /// The slot's stored plan, Postgres's clock and whether the slot's kind
    /// is paused, in one statement; for a slot that was never planned
    /// (injected by hand) the config's plan — a pure function of the config,
    /// so the same row the planner would write. The gate stores it once the
    /// slot runs ([`Executor::store_plan`]): storing the plan of a slot that
    /// is not due would keep the planner from scheduling it.
    async fn planned(&self, c: &Ctx<'_>) -> Result<(Plan, DateTime<Utc>, bool), ExecError> {
        let mut conn = self.pool.acquire().await?;
        let read = crate::pause::planned_and_paused(&mut conn, &c.key, self.clock.now()).await?;
        if let Some(slot) = read.planned {
            return Ok((Plan { slot, stored: true }, read.db_now, read.paused));
        }
        let slot = planned_slot(c.kind, c.key.day, c.key.slot_no, &self.config.jitter_seed)
            .expect("validated slot_no");
        Ok((
            Plan {
                slot,
                stored: false,
            },
            read.db_now,
            read.paused,
        ))
    }

    /// Stores the plan of a slot nobody planned, as it runs.
    async fn store_plan(&self, plan: &Plan) -> Result<(), ExecError> {
        if !plan.stored {
            let mut conn = self.pool.acquire().await?;
            store::insert_planned(&mut conn, std::slice::from_ref(&plan.slot), "delivery").await?;
        }
        Ok(())
    }

    /// Records a delivery that came more than [`EARLY_TOLERANCE`] before
    /// its slot's time: an execution row and nothing else — no gate row, no
    /// draft, no unit of the cap — so the slot still runs at its time.
    async fn skip_not_due(
        &self,
        c: &Ctx<'_>,
        plan: &Plan,
        ahead: chrono::Duration,
    ) -> Result<Gate, ExecError> {
        let o = Outcome::Skipped(SkipReason::NotDue);
        let runs_at = plan.runs_at();
        let ahead_ms = ahead.num_milliseconds();
        let detail =
            json!({"runs_at": runs_at.to_rfc3339(), "ahead_ms": ahead_ms, "planned": plan.stored});
        let mut conn = self.pool.acquire().await?;
        let rec = self.record(c, o, detail, Some(plan.slot.due_at));
        if !store::insert_execution(&mut conn, &rec).await? {
            return Ok(Gate::Handled);
        }
        tracing::warn!(slot = %c.key, caller = c.d.caller(), %runs_at, ahead_ms, "delivery came before its slot's time; recorded skipped/not_due and ran nothing (the slot still runs at its time; planner trigger --early runs it now)");
        Ok(Gate::Settled(o))
    }

    /// Gate → pick → quota, in one transaction: the plain case is the one
    /// gate as a batch of one ([`Executor::gate_one`]); what it leaves (a
    /// settled skip, an existing row to take over or refuse) is decided here.
    ///
    /// The quota unit is taken last, just before the commit: concurrent slots
    /// of one kind and day serialize on its row, so the shorter that lock is
    /// held the more slots of a kind commit per second. When the cap turns out
    /// to be full, the transaction is rolled back (the draft returns to the
    /// pool) and a fresh one records `quota_full`. A quota row locked by a
    /// stuck session ends the wait at `lock_timeout` with an error: the
    /// delivery is retried later and other kinds keep flowing.
    ///
    /// `db_now` is Postgres's clock: the starting deadline is judged by it.
    async fn gate(
        &self,
        c: &Ctx<'_>,
        plan: &Plan,
        db_now: DateTime<Utc>,
        paused: bool,
    ) -> Result<Gate, ExecError> {
        let planned = &plan.slot;
        let now = self.clock.now();
        let deadline = crate::clock::later(planned.due_at, c.kind.starting_deadline);
        let late = db_now > deadline && !DEADLINE_EXEMPT.contains(&c.d.caller());
        // A slot never runs before its time, whoever calls (see
        // `ahead_of_time`). Judged by this worker's (injected) clock, like
        // the batch path's filter: the minute of tolerance dwarfs the skew a
        // worker is warned about (1 s).
        match ahead_of_time(plan.runs_at(), now) {
            Some(ahead) if !asks_early(c.d) => return self.skip_not_due(c, plan, ahead).await,
            _ => self.store_plan(plan).await?,
        }
        let expires = crate::clock::later(now, self.visibility);
        let due = Some(planned.due_at);
        let first = |kind: &str| crate::telemetry::lag(kind, c.started_at - planned.due_at);
        // An outcome known before claiming: the slot is settled by the gate
        // insert itself.
        // A paused kind's slot is settled as paused, late or not.
        let late = late && !paused;
        let mut settle = if paused {
            Some(SkipReason::Paused)
        } else {
            late.then_some(SkipReason::MissedDeadline)
        };
        loop {
            if settle.is_none() {
                match self.gate_one(c, planned, now, expires).await? {
                    GateOne::Decided(g) => return Ok(g),
                    GateOne::Settle(reason) => {
                        settle = Some(reason);
                        continue;
                    }
                    GateOne::Exists => {}
                }
            }
            let mut tx = self.pool.begin().await?;
            if let Some(reason) = settle {
                if store::gate_insert(
                    &mut tx,
                    &c.key,
                    "skipped",
                    Some(reason.as_str()),
                    &self.worker_id,
                    None,
                    now,
                )
                .await?
                .is_some()
                {
                    let o = Outcome::Skipped(reason);
                    let late_ms = (db_now - planned.due_at).num_milliseconds();
                    let detail = if late {
                        json!({"late_ms": late_ms})
                    } else {
                        json!({})
                    };
                    store::insert_execution(&mut tx, &self.record(c, o, detail, due)).await?;
                    tx.commit().await?;
                    first(&c.key.kind);
                    if late {
                        tracing::warn!(slot = %c.key, caller = c.d.caller(), late_ms, "slot missed its starting deadline; skipped");
                    } else {
                        tracing::info!(slot = %c.key, caller = c.d.caller(), reason = reason.as_str(), "slot skipped");
                    }
                    return Ok(Gate::Settled(o));
                }
            }
            // The row exists: a duplicate, or a slot whose owner died
            // mid-publish. Whether its claim lapsed is Postgres's call
            // (`take_over`); a claim under this worker's id is resumed at
            // once, since this delivery holds the slot in this process.
            let row = store::get_slot(&mut tx, &c.key)
                .await?
                .ok_or(StoreError::RowNotFound)?;
            if row.is_open() {
                if let Some(taken) = store::take_over(
                    &mut tx,
                    row.id,
                    row.attempt,
                    &self.worker_id,
                    now,
                    self.visibility,
                )
                .await?
                {
                    if let Some(post_id) = taken.post_id {
                        tx.commit().await?;
                        tracing::info!(slot = %c.key, attempt = taken.attempt, previous = %row.claimed_by, "resuming a slot whose claim expired (or was left by an earlier run of this worker)");
                        return Ok(Gate::Resume(Claim {
                            row_id: taken.id,
                            attempt: taken.attempt,
                            post_id,
                        }));
                    }
                }
            }
            // Test-only hook (see crate::sabotage): a duplicate the gate lets through.
            let rec = || self.record(c, Outcome::Published, json!({"sabotage": "skip-gate"}), due);
            if crate::sabotage::skip_gate(&mut tx, &row, c.kind, now, rec)
                .await?
                .is_some()
            {
                tx.commit().await?;
                return Ok(Gate::Settled(Outcome::Published));
            }
            let o = Outcome::Skipped(SkipReason::SlotTaken);
            let detail = json!({"replay": {"state": row.state, "reason": row.reason, "claimed_by": row.claimed_by, "attempt": row.attempt}});
            let recorded =
                store::insert_execution(&mut tx, &self.record(c, o, detail, due)).await?;
            tx.commit().await?;
            if !recorded {
                // This very entry's outcome was committed before (its worker
                // died before acknowledging it): not a duplicate.
                return Ok(Gate::Handled);
            }
            tracing::warn!(slot = %c.key, caller = c.d.caller(), state = %row.state, "duplicate delivery blocked by the gate (slot_taken)");
            return Ok(Gate::Taken(o));
        }
    }

    /// The plain case of the gate for one delivery: a [`store::gate_batch`]
    /// of one, so both paths run the same statements. The starting deadline
    /// was judged by the caller (the slot goes in as exempt).
    async fn gate_one(
        &self,
        c: &Ctx<'_>,
        planned: &PlannedSlot,
        now: DateTime<Utc>,
        expires: DateTime<Utc>,
    ) -> Result<GateOne, ExecError> {
        let slot = store::BatchSlot {
            key: c.key.clone(),
            entry_id: c.d.entry_id.clone(),
            caller: c.d.caller().to_owned(),
            exempt: true,
            deadline_ms: 0,
            cap: c.kind.daily_cap,
            started_at: c.started_at,
            record_only: c.kind.publish_url.is_none(),
        };
        let Some(gated) = store::gate_batch(
            &self.pool,
            std::slice::from_ref(&slot),
            &self.worker_id,
            self.epoch(),
            now,
            expires,
        )
        .await?
        else {
            return Ok(GateOne::Settle(SkipReason::QuotaFull));
        };
        if let Some(r) = gated.claims.into_iter().next() {
            crate::telemetry::lag(&c.key.kind, c.started_at - planned.due_at);
            if r.settled {
                let lag_ms = (c.started_at - planned.due_at).num_milliseconds();
                tracing::info!(slot = %c.key, caller = c.d.caller(), draft = r.post_id, lag_ms, "published (record-only)");
                return Ok(GateOne::Decided(Gate::Settled(Outcome::Published)));
            }
            return Ok(GateOne::Decided(Gate::Claimed(Claim {
                row_id: r.gate_id,
                attempt: 1,
                post_id: r.post_id,
            })));
        }
        if gated.no_draft.is_empty() {
            return Ok(GateOne::Exists);
        }
        // No ready draft. With the cap used up as well, the cap is the reason.
        let mut conn = self.pool.acquire().await?;
        let used = store::quota_used(&mut conn, &c.key.kind, c.key.day).await?;
        Ok(GateOne::Settle(if used >= i64::from(c.kind.daily_cap) {
            SkipReason::QuotaFull
        } else {
            SkipReason::NoReadyDraft
        }))
    }

    fn policy(&self, kind: &KindConfig) -> RetryPolicy {
        self.retry_override.unwrap_or(RetryPolicy {
            max_attempts: kind.http_attempts,
            base: kind.retry_base,
            cap: kind.retry_cap,
        })
    }

    /// Publish → index → record, for a slot this delivery owns.
    async fn publish(
        &self,
        c: &Ctx<'_>,
        planned: &PlannedSlot,
        claim: Claim,
        resumed: bool,
    ) -> Result<Outcome, ExecError> {
        let draft = self
            .deadline(async {
                let mut conn = self.pool.acquire().await?;
                store::get_draft(&mut conn, claim.post_id)
                    .await?
                    .ok_or(StoreError::RowNotFound)
            })
            .await?;
        let draft = DraftText {
            id: draft.id,
            title: draft.title,
            body: draft.body,
        };
        // The heartbeat keeps the claim and the stream entry alive while the
        // calls run and until their outcome is stored.
        let heartbeat = self.heartbeat(&claim, &c.d.entry_id);
        let (publish, detail) = self.calls(c, planned, &claim, &draft, resumed).await;
        let effect = Effect { publish, detail };
        let outcome = self
            .store_outcome(&c.key.to_string(), || {
                self.finish(c, planned, &claim, &effect, &heartbeat.lost)
            })
            .await;
        heartbeat.stop().await;
        Ok(outcome)
    }

    /// Stores what the CMS answered: `store` (one transaction, under the
    /// deadline) is retried in place with full-jitter backoff until it
    /// commits. The answer stays in memory and the claim's heartbeat keeps
    /// running meanwhile, so a store error after the call never leads to a
    /// second call. (Only a crash or a shutdown past its grace leaves the
    /// claim open, to be resumed under the same key.)
    async fn store_outcome<T, E, F, Fut>(&self, what: &str, mut store: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, E>>,
        ExecError: From<E>,
    {
        let mut backoff = Reconnect::new(rand::rngs::StdRng::from_entropy());
        loop {
            match self.deadline(store()).await {
                Ok(v) => return v,
                Err(e) => {
                    let delay = backoff.next_delay();
                    tracing::warn!(slot = what, error = %e, retry_in_ms = delay.as_millis() as u64, failures = backoff.failures(), "storing the outcome failed; retrying in place (the CMS's answer is kept; it is not called again)");
                    tokio::time::sleep(delay).await;
                }
            }
        }
    }

    /// The external calls for a claimed slot: publish (or record-only), then
    /// the index push. Records nothing; the caller keeps the claim's
    /// heartbeat running around it.
    async fn calls(
        &self,
        c: &Ctx<'_>,
        planned: &PlannedSlot,
        claim: &Claim,
        draft: &DraftText,
        resumed: bool,
    ) -> (
        Result<(String, Value, u32), CallReport>,
        serde_json::Map<String, Value>,
    ) {
        let key_s = c.key.to_string();
        let mut rng = rand::rngs::StdRng::from_entropy();
        let policy = self.policy(c.kind);
        let mut detail = serde_json::Map::new();
        if resumed {
            detail.insert("resumed".into(), json!(true));
            detail.insert("attempt".into(), json!(claim.attempt));
        }
        // Publish (or record-only).
        let publish: Result<(String, Value, u32), CallReport> = match &c.kind.publish_url {
            None => {
                let url = format!("record-only://{}/{}", c.key.kind, draft.id);
                Ok((url.clone(), json!({"url": url, "record_only": true}), 0))
            }
            // Test-only hook (see crate::sabotage): a publish that never calls.
            Some(_) if crate::sabotage::phantom(&key_s) => {
                Ok(crate::sabotage::phantom_answer(&key_s))
            }
            Some(url) => {
                let body = json!({
                    "slot": key_s, "kind": c.key.kind, "day": c.key.day.to_string(), "slot_no": c.key.slot_no,
                    "nominal_at": planned.nominal_at.to_rfc3339(), "due_at": planned.due_at.to_rfc3339(),
                    "draft": {"id": draft.id, "title": draft.title, "body": draft.body},
                });
                // Test-only: crate::sabotage may have it sent again.
                let mut key = key_s.clone();
                let report = loop {
                    let report = self
                        .webhook
                        .call(
                            "publish",
                            url,
                            &key,
                            &body,
                            &c.kind.auth,
                            c.kind.http_timeout,
                            policy,
                            &mut rng,
                        )
                        .await;
                    match crate::sabotage::send_again(&key_s, report.result.is_ok()) {
                        Some(again) => key = again,
                        None => break report,
                    }
                };
                match &report.result {
                    Ok(answer) => {
                        let url = answer
                            .url
                            .clone()
                            .unwrap_or_else(|| format!("{url}#{key_s}"));
                        Ok((url.clone(), answer.stored(&url), report.attempts))
                    }
                    Err(_) => Err(report),
                }
            }
        };
        // Index push: its failure never undoes the publish.
        if let (Ok((url, _, _)), Some(index_url)) = (&publish, &c.kind.index_url) {
            let body = json!({"slot": key_s, "url": url, "draft_id": draft.id});
            let report = self
                .webhook
                .call(
                    "index",
                    index_url,
                    &format!("{key_s}:index"),
                    &body,
                    &c.kind.auth,
                    c.kind.http_timeout,
                    policy,
                    &mut rng,
                )
                .await;
            if let Some(e) = report.error_detail() {
                tracing::warn!(slot = %c.key, error = %e, "index push failed; the slot stays published");
                detail.insert("index_error".into(), e);
            }
        }
        (publish, detail)
    }

    /// Records a publish's outcome, fenced on the claim: a
    /// [`store::finish_batch`] of one. One transaction; the caller retries it.
    async fn finish(
        &self,
        c: &Ctx<'_>,
        planned: &PlannedSlot,
        claim: &Claim,
        effect: &Effect,
        claim_lost: &AtomicBool,
    ) -> Result<Outcome, ExecError> {
        let (row, outcome) = self.finish_row(
            c,
            planned,
            claim,
            &effect.publish,
            effect.detail.clone(),
            claim_lost,
        );
        let now = self.clock.now();
        let f = store::finish_batch(&self.pool, std::slice::from_ref(&row), &self.worker_id, now)
            .await?;
        let f = f.first().copied().ok_or(StoreError::RowNotFound)?;
        Ok(self.finished(c, planned, claim, outcome, &row, f))
    }

    fn log_finished(
        &self,
        c: &Ctx<'_>,
        planned: &PlannedSlot,
        claim: &Claim,
        outcome: Outcome,
        detail: &Value,
    ) {
        match outcome {
            Outcome::Published => {
                let lag_ms = (c.started_at - planned.due_at).num_milliseconds();
                tracing::info!(slot = %c.key, caller = c.d.caller(), draft = claim.post_id, lag_ms, "published");
            }
            _ => {
                tracing::warn!(slot = %c.key, draft = claim.post_id, detail = %detail, "publish failed; the slot keeps its draft until an operator retries or abandons it")
            }
        }
    }

    /// Keeps the claim and the stream entry alive while the webhook runs.
    fn heartbeat(&self, claim: &Claim, entry_id: &str) -> Heartbeat {
        let lost = Arc::new(AtomicBool::new(false));
        let stop = tokio_util::sync::CancellationToken::new();
        let (this, claim, entry, lost2, stop2) = (
            self.clone(),
            claim.clone(),
            entry_id.to_owned(),
            lost.clone(),
            stop.clone(),
        );
        let every = (self.visibility / 3).max(Duration::from_millis(50));
        let task = tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = stop2.cancelled() => return,
                    _ = tokio::time::sleep(every) => {}
                }
                match this
                    .deadline(store::extend_claim(
                        &this.pool,
                        claim.row_id,
                        &this.worker_id,
                        claim.attempt,
                        this.clock.now(),
                        this.visibility,
                    ))
                    .await
                {
                    Ok(true) => {}
                    Ok(false) => {
                        lost2.store(true, Ordering::Relaxed);
                        tracing::warn!(row = claim.row_id, "heartbeat found the claim taken over");
                        return;
                    }
                    Err(e) => tracing::warn!(error = %e, "claim heartbeat failed; will retry"),
                }
                if let Err(e) = this.queue.touch(&this.worker_id, &entry).await {
                    tracing::warn!(error = %e, "stream heartbeat failed; will retry");
                }
            }
        });
        Heartbeat { stop, task, lost }
    }
}

struct Heartbeat {
    stop: tokio_util::sync::CancellationToken,
    task: tokio::task::JoinHandle<()>,
    lost: Arc<AtomicBool>,
}

impl Heartbeat {
    /// Stops it; `true` when it saw the claim taken over.
    async fn stop(mut self) -> bool {
        self.stop.cancel();
        let _ = (&mut self.task).await;
        self.lost.load(Ordering::Relaxed)
    }
}

/// A publish abandoned half-way (its future dropped: a shutdown past the
/// grace period, an aborted task) must stop renewing its claim, or the slot
/// could never be resumed by anyone else while this process lives.
impl Drop for Heartbeat {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// The parts of a draft a publish sends.
struct DraftText {
    id: i64,
    title: String,
    body: String,
}

/// What publishing a claimed slot produced, before it is recorded.
struct Effect {
    /// The URL, the CMS's answer and the attempts it took; or the failure.
    publish: Result<(String, Value, u32), CallReport>,
    detail: serde_json::Map<String, Value>,
}

/// What a finished publish records: the outcome, the gate row's response,
/// the draft's URL (`None` when it failed) and the execution's detail.
fn settle_fields(
    publish: &Result<(String, Value, u32), CallReport>,
    mut detail: serde_json::Map<String, Value>,
) -> (Outcome, Option<Value>, Option<String>, Value) {
    match publish {
        Ok((url, response, attempts)) => {
            detail.insert("url".into(), json!(url));
            if *attempts > 0 {
                detail.insert("attempts".into(), json!(attempts));
            }
            (
                Outcome::Published,
                Some(response.clone()),
                Some(url.clone()),
                Value::Object(detail),
            )
        }
        Err(report) => {
            detail.insert(
                "publish_error".into(),
                report.error_detail().unwrap_or(Value::Null),
            );
            (
                Outcome::Failed(FailReason::PublishError),
                None,
                None,
                Value::Object(detail),
            )
        }
    }
}
