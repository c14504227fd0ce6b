//! Deliveries, start to finish: prepare → gate (quota, pick) → call →
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
//! [`Executor::handle`] and [`Executor::batch`] are one walk (`walk.rs`,
//! read top to bottom), a file per phase, each entered once: `prepare`,
//! `gate`, `call`, `record`. A batch (a backlog) is one gate commit, its
//! webhook calls concurrent, one commit for their outcomes; it decides only
//! the plain case and leaves everything else to a walk alone. Both run the
//! one gate, [`crate::store::gate_batch`] and [`crate::store::finish_batch`]:
//! a single delivery is a batch of one.
//!
//! This file holds what every phase shares and is no step of its own: the
//! types callers branch on ([`Handled`], [`Gate`], [`ExecError`]), the
//! [`Executor`], the bookkeeping (the transaction deadline, the execution
//! row) and the [`DeliveryHooks`] a test build may install.

mod call;
mod gate;
mod prepare;
mod record;
mod walk;

pub use prepare::{Exemption, InFlight};
pub use walk::{Batchable, Permits, WAVE};

use crate::clock::SharedClock;
use crate::config::Config;
use crate::config::KindConfig;
use crate::outcome::Outcome;
use crate::queue::Delivery;
use crate::queue::{Queue, QueueError};
use crate::receiver::Effect;
use crate::receiver::Receivers;
use crate::retry::{RetryPolicy, SharedEntropy};
use crate::slot::SlotKey;
use crate::store::StoreError;
use crate::store::{ExecutionRecord, SlotRow};
use chrono::{DateTime, Utc};
use futures_util::future::BoxFuture;
use sqlx::PgConnection;
use sqlx::PgPool;
use std::future::Future;
use std::sync::atomic::AtomicI64;
use std::sync::atomic::Ordering;
use std::sync::Arc;
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

    /// Postgres is out for every delivery alike, not for this one: the
    /// connection is gone or refused, or the server lacks a resource (SQLSTATE
    /// classes 08 connection, 53 insufficient resources — a full disk —,
    /// 57P admin/crash shutdown, 58 system error). A batch that fails so
    /// would fail the same delivery by delivery, so its deliveries wait
    /// for their retry together instead.
    pub fn is_outage(&self) -> bool {
        match self {
            ExecError::Store(
                StoreError::Io(_) | StoreError::PoolTimedOut | StoreError::PoolClosed,
            ) => true,
            ExecError::Store(StoreError::Database(d)) => d.code().is_some_and(|c| {
                c.starts_with("08")
                    || c.starts_with("53")
                    || c.starts_with("57P")
                    || c.starts_with("58")
            }),
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
    /// The turn this process's gate statements take, one at a time
    /// ([`crate::store::GateTurn`] says why); shared by all its deliveries.
    pub gate_turn: crate::store::GateTurn,
    /// What a test build bends on a delivery's path; none in production.
    pub hooks: Hooks,
}

/// How much of a delivery's walk the walk decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Reach {
    /// A delivery walked alone ([`Executor::handle`]): everything about it
    /// is decided on this walk (a dead letter, a wait for its slot or its
    /// kind's mirror, `not_due`, a settled skip, a takeover, `slot_taken`).
    Whole,
    /// A batch ([`Executor::batch`]): only the plain case (due, unpaused,
    /// a draft and a cap unit for every slot); any other delivery is left
    /// out, undecided, for a walk of its own.
    Plain,
}

/// The bookkeeping every phase does the same way: the leader epoch an
/// outcome is stamped with, the client-side deadline every transaction
/// runs under, and the execution row each outcome is written as.
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

    /// The execution row `outcome` of the delivery `c` is written as.
    fn execution(
        &self,
        c: &prepare::Ctx<'_>,
        outcome: Outcome,
        detail: serde_json::Value,
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
}

/// The points where a test build may bend a delivery's walk. The chaos
/// suite's judge must be shown to fail, so its self-test runs workers that
/// break one exactly-once rule on purpose (chaos's `Saboteur`); the
/// executor only knows this trait, whoever builds it decides what is
/// installed ([`crate::worker::WorkerOptions::hooks`]; the `worker` binary
/// installs nothing). Each method is a question asked at one phase; every
/// default is production's
/// answer (nothing bent).
pub trait DeliveryHooks: Send + Sync {
    /// Validate: may `d` claim an operator's exemption no request in
    /// Postgres grants? Production: never.
    fn forges_grant(&self, _d: &Delivery) -> bool {
        false
    }

    /// Before the gate of `key` (`now`: when its handling started): a
    /// hook may start other deliveries on `exec`. Production: nothing.
    fn before_gate(
        &self,
        _exec: &Executor,
        _key: &SlotKey,
        _kind: &KindConfig,
        _now: DateTime<Utc>,
    ) {
    }

    /// Gate, a duplicate of a finished slot: instead of `slot_taken`, a
    /// hook may settle it itself inside the gate's transaction (`Ok(true)`:
    /// it did, and wrote `record()`). Production: `Ok(false)`.
    fn settle_duplicate<'a>(
        &'a self,
        _conn: &'a mut PgConnection,
        _row: &'a SlotRow,
        _kind: &'a KindConfig,
        _now: DateTime<Utc>,
        _record: &'a (dyn Fn() -> ExecutionRecord + Send + Sync),
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async { Ok(false) })
    }

    /// Publish: an effect to report *instead of* calling the CMS under
    /// `key`. Production: `None` (call it).
    fn instead_of_call(&self, _key: &str) -> Option<Effect> {
        None
    }

    /// Publish, after a call under `key` (`ok`: it published): a key to
    /// send the same body under again. Production: `None`.
    fn send_again(&self, _key: &str, _ok: bool) -> Option<String> {
        None
    }
}

/// The production answers: nothing bent.
struct Straight;

impl DeliveryHooks for Straight {}

/// The hooks an executor holds; by default none (every answer production's).
#[derive(Clone)]
pub struct Hooks(Arc<dyn DeliveryHooks>);

impl Hooks {
    /// Installs `hooks` (the chaos self-test's sabotage).
    pub fn new(hooks: Arc<dyn DeliveryHooks>) -> Hooks {
        Hooks(hooks)
    }
}

impl Default for Hooks {
    fn default() -> Hooks {
        Hooks(Arc::new(Straight))
    }
}

impl std::ops::Deref for Hooks {
    type Target = dyn DeliveryHooks;
    fn deref(&self) -> &Self::Target {
        &*self.0
    }
}

impl std::fmt::Debug for Hooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Hooks")
    }
}
