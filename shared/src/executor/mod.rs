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

mod batch;
mod dead_letter;
mod gate;
mod heartbeat;
mod hooks;
mod publish;
mod validate;

pub use hooks::{DeliveryHooks, Hooks};
pub use validate::Exemption;

use crate::clock::SharedClock;
use crate::config::{Config, KindConfig};
use crate::outcome::{FailReason, Outcome};
use crate::queue::{Delivery, Queue, QueueError};
use crate::receiver::Receivers;
use crate::retry::{RetryPolicy, SharedEntropy};
use crate::slot::SlotKey;
use crate::store::{self, ExecutionRecord, StoreError};
use chrono::{DateTime, Utc};
use serde_json::{json, Value};
use sqlx::PgPool;
use std::collections::HashSet;
use std::future::Future;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A delivery seen more times than this is dead-lettered (`max_deliveries`).
pub const MAX_DELIVERIES: u64 = 10;

/// A `starting_deadline` longer than this (100 years) is treated as this,
/// so it fits a Postgres interval.
const MAX_DEADLINE_MS: i64 = 100 * 366 * 24 * 3600 * 1000;

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
    /// A Postgres statement failed (connection lost, timeout, conflict);
    /// the transaction rolled back, so the delivery can simply run again.
    #[error("postgres: {0}")]
    Store(#[from] StoreError),
    /// Redis failed while acknowledging or dead-lettering; the outcome may
    /// be committed already, which the redelivery detects by its entry id.
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

    /// The server refused the write because it takes none (SQLSTATE 25006,
    /// `read_only_sql_transaction`): a standby in recovery behind the
    /// address, or `default_transaction_read_only`. Nothing was written; the
    /// delivery can run once a primary answers.
    pub fn is_read_only(&self) -> bool {
        matches!(self, ExecError::Store(StoreError::Database(d)) if d.code().as_deref() == Some("25006"))
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

/// A slot this delivery owns, fenced by `(worker, attempt)`.
#[derive(Debug, Clone)]
pub struct Claim {
    /// The `publish_slot` row this delivery owns.
    pub row_id: i64,
    /// The fencing counter: a finish with a stale attempt changes nothing,
    /// so a claim taken over by someone else cannot be overwritten.
    pub attempt: i32,
    /// The draft bound to the slot; a resumed claim publishes the same one.
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
    /// The validated configuration: the kinds a delivery may name.
    pub config: Arc<Config>,
    /// Where the gate, the drafts and the outcomes live.
    pub pool: PgPool,
    /// The stream deliveries are acknowledged on and dead-lettered to.
    pub queue: Queue,
    /// Each kind's receiver (webhook, WordPress, record-only) and indexer.
    pub receivers: Receivers,
    /// Injected so deadlines and lag are testable.
    pub clock: SharedClock,
    /// The randomness of the webhook retries' and the store retries'
    /// jitter; injected like the clock.
    pub entropy: SharedEntropy,
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
    /// What a test build bends on a delivery's path; none in production.
    pub hooks: Hooks,
}

struct Ctx<'a> {
    d: &'a Delivery,
    key: SlotKey,
    kind: &'a KindConfig,
    started_at: DateTime<Utc>,
    /// What an operator's request grants this delivery.
    exempt: Exemption,
}

impl Ctx<'_> {
    /// This delivery as one slot of a gate batch, exempt from the starting
    /// deadline when an operator's request grants it.
    fn batch_slot(&self) -> store::BatchSlot {
        let deadline_ms = i64::try_from(self.kind.starting_deadline.as_millis())
            .unwrap_or(i64::MAX)
            .min(MAX_DEADLINE_MS);
        store::BatchSlot {
            key: self.key.clone(),
            entry_id: self.d.entry_id.clone(),
            partition: self.d.partition,
            caller: self.d.caller().to_owned(),
            exempt: self.exempt.deadline,
            deadline_ms,
            cap: self.kind.daily_cap,
            started_at: self.started_at,
            record_only: self.kind.record_only(),
        }
    }
}

impl Executor {
    /// The one gate ([`store::gate_batch`]) for `slots`, under this
    /// worker's id and epoch, a webhook claim lasting `visibility`. `None`:
    /// a cap could not cover them and nothing was written.
    async fn gate_slots(
        &self,
        slots: &[store::BatchSlot],
        now: DateTime<Utc>,
        pick: store::DraftPick,
    ) -> Result<Option<store::BatchGate>, StoreError> {
        let expires = crate::clock::later(now, self.visibility);
        store::gate_batch(
            &self.pool,
            slots,
            &self.worker_id,
            self.epoch(),
            now,
            expires,
            pick,
        )
        .await
    }

    /// Before a gate: each of these kinds whose drafts live at its CMS
    /// (WordPress) mirrors them first, so a post made ready shortly before
    /// its slot is seen ([`crate::receiver::Receiver::refresh_drafts`],
    /// bounded by the receiver; nothing for the other kinds). Both
    /// delivery paths call it, each kind once.
    async fn refresh_drafts(&self, kinds: &[&str]) {
        let mut seen = HashSet::new();
        for &kind in kinds {
            if let (true, Some(route)) = (seen.insert(kind), self.receivers.route(kind)) {
                route.receiver.refresh_drafts(&self.pool).await;
            }
        }
    }

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
        ExecutionRecord::new(
            c.key.to_string(),
            Some(c.key.clone()),
            outcome,
            c.started_at,
            self.clock.now(),
        )
        .entry(c.d.entry_id.as_str())
        .by(c.d.caller(), self.worker_id.as_str())
        .epoch(self.epoch())
        .detail(detail)
        .due(due_at)
    }

    /// Handles one delivery completely, acknowledging it at the end. An
    /// `Err` means nothing was acknowledged; the entry stays pending.
    #[tracing::instrument(name = "handle", skip_all, fields(slot = d.slot().unwrap_or(""), entry = %d.entry_id))]
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
        self.hooks.before_gate(self, &key, kind, started_at);
        let exempt = self.exemption(d, &key).await?;
        let c = Ctx {
            d,
            key,
            kind,
            started_at,
            exempt,
        };
        self.refresh_drafts(&[c.key.kind.as_str()]).await;
        let (plan, db_now, paused) = self.deadline(self.planned(&c)).await?;
        let planned = &plan.slot;
        let outcome = match self.deadline(self.gate(&c, &plan, db_now, paused)).await? {
            Gate::Taken(o) | Gate::Settled(o) => o,
            Gate::Claimed(claim) => self.publish(&c, planned, claim, false).await?,
            Gate::Resume(claim) => self.publish(&c, planned, claim, true).await?,
            Gate::Handled => {
                self.queue.ack(d.entry()).await?;
                tracing::info!(entry = %d.entry_id, slot = %c.key, "entry already handled; acknowledged again");
                return Ok(Handled::AlreadyHandled);
            }
        };
        self.queue.ack(d.entry()).await?;
        crate::telemetry::execution(&c.key.kind, outcome.as_str(), outcome.reason());
        Ok(Handled::Recorded(outcome))
    }
}
