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
//! [`crate::store::gate_batch`] and [`crate::store::finish_batch`]: a single delivery is
//! a batch of one.

mod batch;
mod dead_letter;
mod delivery;
mod finish;
mod gate;
mod handle;
mod heartbeat;
mod hooks;
mod in_flight;
mod plan;
mod publish;
mod validate;

use delivery::Ctx;
pub use hooks::{DeliveryHooks, Hooks};
pub use in_flight::InFlight;
pub use validate::Exemption;

use crate::clock::SharedClock;
use crate::config::Config;
use crate::outcome::Outcome;
use crate::queue::{Queue, QueueError};
use crate::receiver::Receivers;
use crate::retry::{RetryPolicy, SharedEntropy};
use crate::store::StoreError;
use sqlx::PgPool;
use std::sync::atomic::AtomicI64;
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
    /// What a test build bends on a delivery's path; none in production.
    pub hooks: Hooks,
}
