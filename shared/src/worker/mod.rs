//! The worker runtime: intake, reclaim, the leader's chores, shutdown.
//!
//! - **Intake** reads deliveries from the stream and runs them through the
//!   [`Executor`]: valid ones in batches of up to `batch` (one gate commit
//!   per batch; the slots of every kind read together in one gate),
//!   the rest one by one; at most `concurrency` gates or single
//!   deliveries at once, and `concurrency × batch` webhook calls in flight,
//!   each holding its permit until it returns, no kind more than its share
//!   (`calls`). A delivery is acknowledged only after its outcome
//!   committed.
//! - **Reclaim**: with spare capacity, every worker claims deliveries idle
//!   longer than the visibility timeout (their consumer died) and runs them.
//! - **Leader chores** (only while holding the lease): promotion of due
//!   slots, waking at the next due time; the reconciler; forgetting
//!   consumers and workers gone longer than `forget_after`; and, with
//!   `[notify]`, sending the notice outbox (`notices`).
//! - **Shutdown**: cancellation stops intake first, then in-flight deliveries
//!   get `shutdown_grace` to finish; whatever is left stays pending in the
//!   stream for another worker. The lease is released last.
//! - **Outages**: every store error is logged at WARN and retried with
//!   full-jitter backoff; nothing crashes, nothing is acknowledged early. A
//!   delivery that failed (a lock timeout on a stuck quota row, a
//!   transaction past its deadline, a lost connection) gives its in-flight
//!   permit back at once and waits for its retry outside it, its stream
//!   entry kept pending and alive: a stuck kind never starves the others.
//!   A batch that fails because Postgres is out for everyone waits and
//!   comes back as one batch; such failures are logged once per 5 s with
//!   a count (`later.rs`'s `Quiet`), not once per delivery.
//! - **Drafts at a CMS** (`drafts`): one background task per kind whose
//!   drafts live in WordPress mirrors them every `refresh_every`; no
//!   delivery waits for a CMS listing except its own kind's first one.
//! - **Clock**: the worker measures its clock against Postgres's at start
//!   and every [`CLOCK_EVERY`], warns when it is more than a second off
//!   (again every minute while it stays off), exports the offset as
//!   `slotgate_worker_clock_skew_seconds`, and
//!   stores the offset for `planner status`.
//! - **Server role** (`role`): the worker asks Postgres every few seconds
//!   whether it takes writes and whether its commits wait for a synchronous
//!   standby. While it refuses writes (a standby behind the address after a
//!   failover) intake reads nothing and no delivery counts the refusal as a
//!   failure; a primary without a synchronous standby is named at start.

mod calls;
pub mod drafts;
mod intake;
mod later;
mod leader;
mod notices;
mod role;
mod skew;

use intake::intake_loop;
use later::{Later, Retry};
use leader::{leader_loop, LeaderChores};
use role::{role_loop, Writable};
pub use role::{ROLE_EVERY, ROLE_EVERY_READ_ONLY};

use crate::clock::{unix_ms, SharedClock};
use crate::config::Config;
use crate::executor::{ExecError, Executor};
use crate::lease::{Change, Leading, Lease};
use crate::queue::{Delivery, Queue};
use crate::receiver::Receivers;
use crate::reconcile::Reconciler;
use crate::retry::{full_jitter, Reconnect, RetryPolicy, SharedEntropy};
use crate::slot::SlotKey;
use crate::store;
use skew::measure_skew;
use sqlx::PgPool;
use std::collections::HashMap;
use std::sync::atomic::AtomicI64;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc::{unbounded_channel, UnboundedSender};
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// Promotion moves at most this many slots per script call.
pub const PROMOTE_BATCH: usize = 500;

/// Default of [`WorkerOptions::batch`]: large enough that a backlog of
/// slots shares one gate commit per few dozen slots, small enough that a
/// batch's transaction stays a few milliseconds long and its webhook calls
/// (which run concurrently) stay a modest load on the CMS.
pub const DEFAULT_BATCH: usize = 32;

/// Backoff of a delivery that failed on an infrastructure error (Postgres
/// or Redis gone, a connection lost), full jitter between these bounds.
pub const RETRY_BASE: Duration = Duration::from_millis(250);
/// Upper bound of that backoff (see [`RETRY_BASE`]): a worker facing a
/// dead dependency keeps probing at least this often.
pub const RETRY_CAP: Duration = Duration::from_secs(30);

/// Longest pause of a stalled kind (see `Later`) between two probes, and
/// longest wait of its deliveries between two looks. Each probe holds a
/// permit for up to `lock_timeout`: with 2 s and 5 s, a stuck kind costs
/// at most 0.4 of a permit, and resumes within about 5 s of its row
/// being free.
pub const STALL_CAP: Duration = Duration::from_secs(5);

/// Most deliveries one worker holds back at a time (waiting for a stalled
/// kind, or for a retry): past it, intake stops reading until some go.
/// Held deliveries take no permit, so without a bound a stalled kind let
/// intake read the whole stream (20,001 deliveries took a worker from
/// 14 MB to 401 MB). A held delivery costs about a kilobyte and one entry
/// in the batched touch, so this keeps a worker well under its pod limit;
/// the entries beyond it stay unread in the stream for any worker. While
/// a worker is at the bound, other kinds wait with it: memory is the
/// harder limit (the stuck-kind case of a few hundred deliveries never
/// reaches it).
pub const MAX_HELD: usize = 2_000;

/// After this many failures in a row (stalls of the kind not counted) a
/// delivery is left pending for the reclaim by any worker instead of being
/// retried here.
pub const RETRY_LIMIT: u32 = 30;

/// How often a worker measures and stores its clock's offset.
pub const CLOCK_EVERY: Duration = Duration::from_secs(10);

/// How often a worker whose clock stays off repeats its WARN.
pub const CLOCK_WARN_EVERY: Duration = Duration::from_secs(60);

/// Tuning of one worker.
#[derive(Debug, Clone)]
pub struct WorkerOptions {
    /// The worker's id: its consumer name, the owner of its claims and the
    /// holder named in the lease. Unique per live process.
    pub id: String,
    /// Gates (or single deliveries) at once: a gate holds one of these
    /// permits until its own decisions are acknowledged, a delivery alone
    /// until it is done.
    pub concurrency: usize,
    /// The batch size (1 = off): `concurrency × batch` is both the most
    /// slots one read takes (twice that of record-only slots, which call no
    /// one; see `gate_groups`), all through one gate transaction, and the
    /// most webhook calls in flight, each holding its permit until it
    /// returns. A read of webhook slots waits until `batch` calls are free.
    pub batch: usize,
    /// TTL of the leader lease: a dead leader is replaced within about this.
    pub lease_ttl: Duration,
    /// How long a claim or a pending entry lives without a heartbeat before
    /// another worker may take it over.
    pub visibility: Duration,
    /// Time in-flight deliveries get to finish after shutdown starts.
    pub shutdown_grace: Duration,
    /// How often the leader reconciles.
    pub reconcile_every: Duration,
    /// Replaces the kinds' webhook retry policies (tests).
    pub retry_override: Option<RetryPolicy>,
    /// Client-side deadline of each Postgres transaction.
    pub tx_deadline: Duration,
    /// A consumer idle this long with nothing pending, and a heartbeat this
    /// old, are removed by the leader ([`Queue::forget_gone`]).
    pub forget_after: Duration,
    /// Whose clock decides promotion (default: never past Redis's).
    pub promote_by: crate::queue::PromoteBy,
    /// What a test build bends on each delivery's path (the chaos
    /// self-test's sabotage); none by default.
    pub hooks: crate::executor::Hooks,
}

/// Default of [`WorkerOptions::forget_after`]: far beyond any pause a live
/// worker survives, short enough that the group does not keep every worker
/// id of a year of deploys.
pub const DEFAULT_FORGET_AFTER: Duration = Duration::from_secs(24 * 3600);

impl WorkerOptions {
    /// The defaults the `worker` binary starts from, under `id`.
    pub fn new(id: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            concurrency: 8,
            batch: DEFAULT_BATCH,
            lease_ttl: Duration::from_secs(10),
            visibility: Duration::from_secs(30),
            shutdown_grace: Duration::from_secs(30),
            reconcile_every: Duration::from_secs(5),
            retry_override: None,
            tx_deadline: crate::session::Session::default().transaction_deadline,
            forget_after: DEFAULT_FORGET_AFTER,
            promote_by: Default::default(),
            hooks: Default::default(),
        }
    }
}

/// A worker, ready to run.
pub struct Worker {
    /// Its tuning.
    pub opts: WorkerOptions,
    /// The kinds it may handle.
    pub config: Arc<Config>,
    /// The gate, drafts and outcomes.
    pub pool: PgPool,
    /// Its deliveries, the lease and the heartbeats.
    pub queue: Queue,
    /// Injected so tests can drive time.
    pub clock: SharedClock,
    /// The randomness of every retry's and reconnect's jitter, injected
    /// like the clock ([`crate::retry::OsEntropy`] in production).
    pub entropy: SharedEntropy,
}

/// What was left when the worker stopped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stopped {
    /// Deliveries still running at the end of the grace period; they stay
    /// pending in the stream for another worker.
    pub abandoned_in_flight: usize,
}

impl Worker {
    /// Runs until `cancel` fires, then shuts down gracefully.
    pub async fn run(self, cancel: CancellationToken) -> Stopped {
        let epoch_seen = Arc::new(AtomicI64::new(0));
        let exec = Executor {
            config: self.config.clone(),
            pool: self.pool.clone(),
            queue: self.queue.clone(),
            receivers: Receivers::for_config(&self.config, self.clock.clone()),
            clock: self.clock.clone(),
            entropy: self.entropy.clone(),
            worker_id: self.opts.id.clone(),
            visibility: self.opts.visibility,
            epoch_seen: epoch_seen.clone(),
            retry_override: self.opts.retry_override,
            tx_deadline: self.opts.tx_deadline,
            in_flight: Default::default(),
            gate_turn: Default::default(),
            hooks: self.opts.hooks.clone(),
        };
        tracing::info!(worker = %self.opts.id, concurrency = self.opts.concurrency, prefix = %self.queue.keys().prefix(), "worker starting");
        // A WordPress site that is misconfigured is named at start, not at
        // the first slot; the worker still runs (the site may come back,
        // and each publish reports its own error).
        // The worker's own receivers, so the check costs no second set of
        // clients; a kind without a CMS to reach answers at once.
        let receivers = exec.receivers.clone();
        tokio::spawn(async move {
            for (kind, problem) in receivers.check().await {
                tracing::error!(kind, problem, "CMS check failed");
            }
        });
        // Leader chores and liveness stop only after intake has drained, so
        // promotion keeps feeding other workers meanwhile.
        let background = CancellationToken::new();
        let lease = Lease::new(
            self.queue.clone(),
            self.pool.clone(),
            self.opts.id.clone(),
            self.opts.lease_ttl,
            epoch_seen,
        );
        let leader = tokio::spawn(leader_loop(
            lease,
            self.reconciler(),
            self.queue.clone(),
            self.clock.clone(),
            LeaderChores {
                reconcile_every: self.opts.reconcile_every,
                forget_after: self.opts.forget_after,
                promote_by: self.opts.promote_by,
                notices: self.config.notify.clone().map(|notify| notices::Notices {
                    pool: self.pool.clone(),
                    notify,
                    entropy: self.entropy.clone(),
                }),
            },
            self.entropy.clone(),
            background.clone(),
        ));
        let alive = tokio::spawn(liveness_loop(
            self.queue.clone(),
            self.clock.clone(),
            self.opts.id.clone(),
            background.clone(),
        ));
        let clock = tokio::spawn(clock_loop(exec.clone(), background.clone()));
        let refreshes = drafts::spawn_refreshes(&exec.receivers, &self.pool, &background);
        let writable = Arc::new(Writable::default());
        let role = tokio::spawn(role_loop(
            self.pool.clone(),
            exec.receivers.clone(),
            writable.clone(),
            self.opts.id.clone(),
            self.opts.tx_deadline,
            background.clone(),
        ));
        // Boxed: the intake's future nests the executor's, the stores'
        // and the Redis clients' futures, and unboxed it would push
        // `Worker::run`'s layout past the compiler's default depth in
        // every crate that awaits it.
        let stopped = Box::pin(intake_loop(&exec, &self.opts, writable, cancel)).await;
        background.cancel();
        let _ = leader.await;
        let _ = alive.await;
        let _ = clock.await;
        let _ = role.await;
        for r in refreshes {
            let _ = r.await;
        }
        tracing::info!(worker = %self.opts.id, left_pending = stopped.abandoned_in_flight, "worker stopped");
        stopped
    }

    fn reconciler(&self) -> Reconciler {
        Reconciler {
            config: self.config.clone(),
            pool: self.pool.clone(),
            queue: self.queue.clone(),
            clock: self.clock.clone(),
            worker_id: self.opts.id.clone(),
            grace: Duration::from_secs(2),
        }
    }
}

async fn sleep_or_cancel(d: Duration, cancel: &CancellationToken) -> bool {
    tokio::select! {
        _ = cancel.cancelled() => false,
        _ = tokio::time::sleep(d) => true,
    }
}

/// Measures this worker's clock against Postgres's at start and every
/// [`CLOCK_EVERY`]; warns when it is off by more than a second (at start,
/// every [`CLOCK_WARN_EVERY`] while it stays off,
/// and whenever that changes), and stores each measurement for `planner
/// status`. Postgres's clock judges claims and deadlines anyway; the
/// warning is for the operator (NTP), and for what this worker records.
async fn clock_loop(exec: Executor, cancel: CancellationToken) {
    let mut warned: Option<bool> = None;
    // While the clock stays off, the WARN repeats every minute: an operator
    // who missed the first one still sees it in a recent log.
    let mut last_warn: Option<Instant> = None;
    let config = exec.config.fingerprint();
    loop {
        let measured =
            tokio::time::timeout(exec.tx_deadline, measure_skew(&exec.pool, &exec.clock)).await;
        match measured {
            Ok(Ok(m)) => {
                let off = m.is_off();
                crate::telemetry::clock_skew(m.skew_ms);
                let again = last_warn.is_some_and(|t| t.elapsed() >= CLOCK_WARN_EVERY);
                if off && (warned != Some(true) || again) {
                    last_warn = Some(Instant::now());
                    tracing::warn!(worker = %exec.worker_id, skew_ms = m.skew_ms, rtt_ms = m.rtt_ms, "this worker's clock runs {} Postgres by {} ms (more than 1 s): Postgres's clock judges claims and deadlines, but what this worker records is off; check its time sync", m.direction(), m.skew_ms.abs());
                } else if !off && warned == Some(true) {
                    tracing::info!(worker = %exec.worker_id, skew_ms = m.skew_ms, "this worker's clock is within 1 s of Postgres's again");
                }
                if !off {
                    last_warn = None;
                }
                warned = Some(off);
                if let Err(e) = store::record_worker_clock(
                    &exec.pool,
                    &exec.worker_id,
                    m.skew_ms,
                    m.rtt_ms,
                    &config,
                )
                .await
                {
                    tracing::debug!(error = %e, "could not store the clock measurement");
                }
            }
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "could not measure the clock against Postgres")
            }
            Err(_) => tracing::debug!("measuring the clock against Postgres timed out"),
        }
        if !sleep_or_cancel(CLOCK_EVERY, &cancel).await {
            break;
        }
    }
    let _ = tokio::time::timeout(
        exec.tx_deadline,
        store::forget_worker_clock(&exec.pool, &exec.worker_id),
    )
    .await;
}

async fn liveness_loop(queue: Queue, clock: SharedClock, id: String, cancel: CancellationToken) {
    loop {
        if let Err(e) = queue.heartbeat_worker(&id, unix_ms(clock.now())).await {
            tracing::debug!(error = %e, "liveness heartbeat failed");
        }
        if !sleep_or_cancel(Duration::from_secs(1), &cancel).await {
            break;
        }
    }
    let _ = queue.forget_worker(&id).await;
}

/// Wires SIGTERM/SIGINT to `cancel`: the first signal starts a graceful stop
/// (intake stops, in-flight work drains). The returned token is cancelled
/// by a second signal; the library never ends the process itself, so the
/// binary decides what that means (both exit at once with status 130,
/// leaving unfinished deliveries pending for another worker).
pub fn stop_on_signals(cancel: CancellationToken) -> CancellationToken {
    let again = CancellationToken::new();
    let second = again.clone();
    tokio::spawn(async move {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(t) => t,
                Err(e) => {
                    tracing::error!(error = %e, "cannot install the SIGTERM handler");
                    return;
                }
            };
        for n in 0.. {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
            if n == 0 {
                tracing::info!(
                    "signal received: stopping intake and draining (send again to exit at once)"
                );
                cancel.cancel();
            } else {
                tracing::warn!(
                    "second signal: exiting at once; unfinished deliveries stay pending"
                );
                second.cancel();
                return;
            }
        }
    });
    again
}
