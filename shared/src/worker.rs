//! The worker runtime: intake, reclaim, the leader's chores, shutdown.
//!
//! - **Intake** reads deliveries from the stream and runs them through the
//!   [`Executor`]: valid ones in batches of up to `batch` (one gate commit
//!   per batch; record-only slots of one kind read together in one batch),
//!   the rest one by one; at most `concurrency` batches or single
//!   deliveries at once. A delivery is acknowledged only after its outcome
//!   committed.
//! - **Reclaim**: with spare capacity, every worker claims deliveries idle
//!   longer than the visibility timeout (their consumer died) and runs them.
//! - **Leader chores** (only while holding the lease): promotion of due
//!   slots, waking at the next due time; the reconciler; and forgetting
//!   consumers and workers gone longer than `forget_after`.
//! - **Shutdown**: cancellation stops intake first, then in-flight deliveries
//!   get `shutdown_grace` to finish; whatever is left stays pending in the
//!   stream for another worker. The lease is released last.
//! - **Outages**: every store error is logged at WARN and retried with
//!   full-jitter backoff; nothing crashes, nothing is acknowledged early. A
//!   delivery that failed (a lock timeout on a stuck quota row, a
//!   transaction past its deadline, a lost connection) gives its in-flight
//!   permit back at once and waits for its retry outside it, its stream
//!   entry kept pending and alive: a stuck kind never starves the others.
//! - **Clock**: the worker measures its clock against Postgres's at start
//!   and every [`CLOCK_EVERY`], warns when it is more than a second off, and
//!   stores the offset for `planner status`.

use crate::clock::measure_skew;
use crate::clock::{unix_ms, SharedClock};
use crate::config::Config;
use crate::executor::{ExecError, Executor};
use crate::lease::{Change, Leading, Lease};
use crate::publish::Webhook;
use crate::queue::{Delivery, Queue};
use crate::reconcile::Reconciler;
use crate::retry::{full_jitter, Reconnect, RetryPolicy};
use crate::slot::SlotKey;
use crate::store;
use rand::rngs::StdRng;
use rand::SeedableRng;
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

/// After this many failures in a row (stalls of the kind not counted) a
/// delivery is left pending for the reclaim by any worker instead of being
/// retried here.
pub const RETRY_LIMIT: u32 = 30;

/// How often a worker measures and stores its clock's offset.
pub const CLOCK_EVERY: Duration = Duration::from_secs(10);

/// Tuning of one worker.
#[derive(Debug, Clone)]
pub struct WorkerOptions {
    /// The worker's id: its consumer name, the owner of its claims and the
    /// holder named in the lease. Unique per live process.
    pub id: String,
    /// Deliveries (or batches) handled at once.
    pub concurrency: usize,
    /// Most webhook deliveries taken through the gate in one transaction
    /// (1 = off); the record-only slots of one kind read together share one
    /// transaction, up to `concurrency × batch` (see `gate_groups`).
    /// A batch holds one of the `concurrency` permits; its webhook calls run
    /// concurrently, so up to `concurrency × batch` calls may be in flight.
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
            webhook: Webhook::for_config(&self.config, self.clock.clone()),
            clock: self.clock.clone(),
            worker_id: self.opts.id.clone(),
            visibility: self.opts.visibility,
            epoch_seen: epoch_seen.clone(),
            retry_override: self.opts.retry_override,
            tx_deadline: self.opts.tx_deadline,
            in_flight: Default::default(),
        };
        tracing::info!(worker = %self.opts.id, concurrency = self.opts.concurrency, prefix = %self.queue.keys().prefix(), "worker starting");
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
            },
            background.clone(),
        ));
        let alive = tokio::spawn(liveness_loop(
            self.queue.clone(),
            self.clock.clone(),
            self.opts.id.clone(),
            background.clone(),
        ));
        let clock = tokio::spawn(clock_loop(exec.clone(), background.clone()));
        let stopped = intake_loop(&exec, &self.opts, cancel).await;
        background.cancel();
        let _ = leader.await;
        let _ = alive.await;
        let _ = clock.await;
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

async fn intake_loop(exec: &Executor, opts: &WorkerOptions, cancel: CancellationToken) -> Stopped {
    let sem = Arc::new(Semaphore::new(opts.concurrency.max(1)));
    let mut tasks: JoinSet<()> = JoinSet::new();
    let mut backoff = Reconnect::new(StdRng::from_entropy());
    let reclaim_every =
        (opts.visibility / 2).clamp(Duration::from_millis(100), Duration::from_secs(5));
    let mut last_reclaim: Option<Instant> = None;
    let mut read_ahead = ReadAhead::Single;
    let (retry_tx, mut retry_rx) = unbounded_channel::<Retry>();
    let later = Later {
        exec: exec.clone(),
        tx: retry_tx,
        cancel: cancel.clone(),
        stalls: Default::default(),
        flowing: Default::default(),
    };
    while !cancel.is_cancelled() {
        while tasks.try_join_next().is_some() {}
        let free = sem.available_permits();
        if free == 0 {
            tokio::select! {
                _ = cancel.cancelled() => break,
                _ = tasks.join_next() => continue,
            }
        }
        // Deliveries whose retry is due go first, one permit each; one of
        // a stalled kind waits again without taking a permit.
        let mut retries = Vec::new();
        while retries.len() < free {
            match retry_rx.try_recv() {
                Ok(r) if later.stalled(&r.d) => later.wait_for_kind(r.d, r.failures),
                Ok(r) => retries.push(r),
                Err(_) => break,
            }
        }
        if !retries.is_empty() {
            for r in retries {
                spawn_group(&sem, &mut tasks, &later, vec![r.d], r.failures).await;
            }
            continue;
        }
        let mut batch: Vec<Delivery> = Vec::new();
        let mut failed = None;
        let want = read_ahead.want(free, opts.concurrency, opts.batch);
        if last_reclaim.is_none_or(|t| t.elapsed() >= reclaim_every) {
            last_reclaim = Some(Instant::now());
            match exec.queue.reclaim(&opts.id, opts.visibility, free).await {
                Ok(v) => {
                    if !v.is_empty() {
                        tracing::info!(worker = %opts.id, count = v.len(), "reclaimed idle deliveries");
                    }
                    batch = v;
                }
                Err(e) => failed = Some(e),
            }
        }
        if batch.is_empty() && failed.is_none() {
            match exec
                .queue
                .read(&opts.id, want, Duration::from_millis(1000))
                .await
            {
                Ok(v) => batch = v,
                Err(e) => failed = Some(e),
            }
        }
        if let Some(e) = failed {
            let d = backoff.next_delay();
            tracing::warn!(worker = %opts.id, error = %e, retry_in_ms = d.as_millis() as u64, failures = backoff.failures(), "redis unavailable for intake; backing off");
            sleep_or_cancel(d, &cancel).await;
            continue;
        }
        backoff.reset();
        let batch: Vec<Delivery> = batch
            .into_iter()
            .filter_map(|d| {
                if later.stalled(&d) {
                    later.wait_for_kind(d, 0);
                    None
                } else {
                    Some(d)
                }
            })
            .collect();
        let (fast, single): (Vec<Delivery>, Vec<Delivery>) = if opts.batch > 1 {
            batch.into_iter().partition(|d| exec.batchable(d))
        } else {
            (Vec::new(), batch)
        };
        let size = fast.len().div_ceil(free.max(1)).clamp(1, opts.batch.max(1));
        let (mut work, next) = gate_groups(exec, fast, size);
        read_ahead = next;
        work.extend(single.into_iter().map(|d| vec![d]));
        for group in work {
            spawn_group(&sem, &mut tasks, &later, group, 0).await;
        }
    }
    let in_flight = tasks.len();
    if in_flight > 0 {
        tracing::info!(worker = %opts.id, in_flight, grace_ms = opts.shutdown_grace.as_millis() as u64, "intake stopped; draining in-flight deliveries");
    }
    let drained = tokio::time::timeout(opts.shutdown_grace, async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    let left = if drained.is_err() { tasks.len() } else { 0 };
    if left > 0 {
        tracing::warn!(worker = %opts.id, left, "grace period over; unfinished deliveries stay pending for another worker");
        tasks.abort_all();
    }
    Stopped {
        abandoned_in_flight: left,
    }
}

/// Cuts the batchable deliveries of one read into gate batches.
///
/// Neighbouring slots of one kind go to one group: groups then rarely share
/// a kind's drafts and quota row, which a batch locks until its commit.
/// Webhook slots are cut into groups of `size`, because a batch waits for
/// its slowest call. The slots of one record-only kind stay one group
/// however many the read brought (at most `concurrency × batch`): their
/// groups would otherwise only queue one after another on the kind's quota
/// row and scan past each other's locked drafts, and their whole effect is
/// the one gate transaction. (Burst of 10,000 record-only slots, 2
/// workers: groups of 32 reached 0.26× the batched-write ceiling, one
/// group per kind 0.38×; docs/BENCHMARKS.md.)
///
/// Also says how far the next read may look ahead ([`ReadAhead`]).
fn gate_groups(
    exec: &Executor,
    mut fast: Vec<Delivery>,
    size: usize,
) -> (Vec<Vec<Delivery>>, ReadAhead) {
    fast.sort_by(|a, b| a.slot().cmp(&b.slot()));
    let mut work: Vec<Vec<Delivery>> = Vec::new();
    let mut cut: Vec<Delivery> = Vec::new();
    let mut last_kind: Option<String> = None;
    for d in fast {
        match exec.gate_kind(&d) {
            Some((kind, true)) => {
                let same = last_kind.as_deref() == Some(kind.as_str());
                match work.last_mut() {
                    Some(g) if same => g.push(d),
                    _ => work.push(vec![d]),
                }
                last_kind = Some(kind);
            }
            _ => cut.push(d),
        }
    }
    let next = match (work.is_empty(), cut.is_empty()) {
        (true, true) => ReadAhead::Single,
        (false, true) => ReadAhead::Window,
        _ => ReadAhead::PerPermit,
    };
    while !cut.is_empty() {
        let rest = cut.split_off(size.min(cut.len()));
        work.push(std::mem::replace(&mut cut, rest));
    }
    (work, next)
}

/// How many deliveries intake reads next, judged by what the last read
/// brought.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReadAhead {
    /// The stream served work for the one-delivery path (malformed,
    /// redelivered too often), or nothing: one per free permit. Each such
    /// delivery holds a permit of its own; reading more than there are
    /// permits would only let them age unseen.
    Single,
    /// Batchable work with webhook slots: `batch` per free permit, since a
    /// webhook batch holds its permit until its slowest call returns.
    PerPermit,
    /// Only record-only slots: a whole window (`concurrency × batch`)
    /// even with one permit free, because their slots of one kind go
    /// through one gate transaction ([`gate_groups`]). Reading only what
    /// the free permits cover kept their batches at `batch` in a burst
    /// (a permit frees, 32 more are read), and same-kind batches then
    /// queue on the kind's quota row.
    Window,
}

impl ReadAhead {
    fn want(self, free: usize, concurrency: usize, batch: usize) -> usize {
        match self {
            ReadAhead::Single => free,
            ReadAhead::PerPermit => free * batch.max(1),
            ReadAhead::Window => concurrency.max(1) * batch.max(1),
        }
    }
}

/// Runs `group` as a task of its own holding one in-flight permit.
async fn spawn_group(
    sem: &Arc<Semaphore>,
    tasks: &mut JoinSet<()>,
    later: &Later,
    group: Vec<Delivery>,
    failures: u32,
) {
    let permit = sem
        .clone()
        .acquire_owned()
        .await
        .expect("semaphore never closed");
    let later = later.clone();
    tasks.spawn(async move {
        handle_group(&later, group, failures).await;
        drop(permit);
    });
}

/// Runs a group of deliveries: one alone through [`Executor::handle`];
/// several (all batchable) through the batch first, then whatever it
/// deferred — or all of them, if the batch failed — one at a time. One that
/// fails is handed to [`Later`]; the caller's permit is released when this
/// returns. `failures`: how often the group's (single) delivery failed
/// before.
async fn handle_group(later: &Later, group: Vec<Delivery>, failures: u32) {
    let exec = &later.exec;
    let mut settled = Vec::new();
    if group.len() > 1 {
        match exec.batch(&group).await {
            Ok(s) => {
                for i in &s {
                    later.unstall(&group[*i]);
                }
                settled = s;
            }
            Err(e) => {
                tracing::warn!(error = %e, deliveries = group.len(), "batch failed; handling its deliveries one at a time");
            }
        }
    }
    let rest = group
        .into_iter()
        .enumerate()
        .filter(|(i, _)| !settled.contains(i))
        .map(|(_, d)| d);
    for d in rest {
        match exec.handle(&d).await {
            Ok(_) => later.unstall(&d),
            Err(e) => later.failed(d, failures, &e),
        }
    }
}

/// A delivery waiting for its next try, and how often it failed so far.
struct Retry {
    d: Delivery,
    failures: u32,
}

/// Retries of failed deliveries, outside any permit.
///
/// A delivery that failed (nothing was acknowledged; every transaction it
/// ran rolled back or committed whole) waits `full_jitter(RETRY_BASE,
/// RETRY_CAP, failures)`, then goes back to the intake loop. Meanwhile its
/// stream entry stays pending and is touched, so no one reclaims it (which
/// would count a delivery) while this worker still means to run it. On
/// shutdown, or after [`RETRY_LIMIT`] failures in a row, it is left pending
/// for the reclaim.
///
/// A failure that says Postgres kept the delivery waiting (a lock held by
/// another session, a statement or transaction past its limit) *stalls*
/// the delivery's kind instead: for a window of `full_jitter(RETRY_BASE,
/// STALL_CAP, stalls in a row)` none of the kind's deliveries is tried;
/// they wait (up to [`STALL_CAP`] at a time) without a permit and without
/// touching Postgres. After the window one delivery probes; while it runs
/// the others keep waiting. A success of the kind ends the stall and wakes
/// every delivery waiting for it. Such waits are not failures: a kind held
/// for an hour is never given up on.
#[derive(Clone)]
struct Later {
    exec: Executor,
    tx: UnboundedSender<Retry>,
    cancel: CancellationToken,
    stalls: Arc<Mutex<HashMap<String, Stall>>>,
    /// Wakes the deliveries waiting for a stalled kind when one flows again.
    flowing: Arc<tokio::sync::Notify>,
}

/// A stalled kind.
struct Stall {
    /// No delivery of the kind is tried before this.
    until: Instant,
    /// Stalls in a row (the window's backoff).
    strikes: u32,
    /// One delivery is trying the kind after the window.
    probing: bool,
}

fn kind_of(d: &Delivery) -> Option<String> {
    d.slot()?.parse::<SlotKey>().ok().map(|k| k.kind)
}

fn jitter(cap: Duration, attempt: u32) -> Duration {
    full_jitter(&mut StdRng::from_entropy(), RETRY_BASE, cap, attempt)
}

impl Later {
    /// Whether `d` must wait for its kind. After the stall's window the
    /// first caller becomes the probe and gets `false`.
    fn stalled(&self, d: &Delivery) -> bool {
        let Some(kind) = kind_of(d) else {
            return false;
        };
        let mut stalls = self.stalls.lock().expect("stalls poisoned");
        let Some(stall) = stalls.get_mut(&kind) else {
            return false;
        };
        if stall.probing || Instant::now() < stall.until {
            return true;
        }
        stall.probing = true;
        false
    }

    /// A delivery of `d`'s kind went through: the kind flows.
    fn unstall(&self, d: &Delivery) {
        let Some(kind) = kind_of(d) else {
            return;
        };
        if self
            .stalls
            .lock()
            .expect("stalls poisoned")
            .remove(&kind)
            .is_some()
        {
            tracing::info!(%kind, "the kind flows again; its waiting deliveries resume");
            self.flowing.notify_waiters();
        }
    }

    /// Handles a failure: logs it, stalls the kind when Postgres kept the
    /// delivery waiting, and schedules the retry.
    fn failed(&self, d: Delivery, failures: u32, e: &ExecError) {
        let slot = d.slot().unwrap_or("").to_owned();
        let entry = d.entry_id.clone();
        let kind = kind_of(&d);
        if let Some(kind) = &kind {
            // If this was the kind's probe, another may try (a stall
            // below starts a new window anyway).
            if let Some(s) = self.stalls.lock().expect("stalls poisoned").get_mut(kind) {
                s.probing = false;
            }
        }
        if matches!(e, ExecError::Busy(_)) {
            let delay = jitter(STALL_CAP, 1);
            tracing::debug!(%entry, %slot, retry_in_ms = delay.as_millis() as u64, "slot busy in this worker; retrying later");
            self.schedule(d, failures, delay, false);
            return;
        }
        if let (true, Some(kind)) = (e.is_stall(), kind.as_ref()) {
            let mut stalls = self.stalls.lock().expect("stalls poisoned");
            let strikes = stalls.get(kind).map_or(0, |s| s.strikes) + 1;
            let pause = jitter(STALL_CAP, strikes - 1).max(RETRY_BASE);
            stalls.insert(
                kind.clone(),
                Stall {
                    until: Instant::now() + pause,
                    strikes,
                    probing: false,
                },
            );
            drop(stalls);
            let delay = jitter(STALL_CAP, u32::MAX);
            tracing::warn!(%entry, %slot, error = %e, %kind, strikes, pause_ms = pause.as_millis() as u64, "Postgres kept a delivery waiting; rolled back, its kind pauses and it is retried later");
            self.schedule(d, failures, delay, true);
            return;
        }
        let failures = failures + 1;
        if failures > RETRY_LIMIT {
            tracing::warn!(%entry, %slot, error = %e, failures, "giving up on this delivery for now; it stays pending and will be reclaimed");
            return;
        }
        let delay = jitter(RETRY_CAP, failures - 1);
        tracing::warn!(%entry, %slot, error = %e, retry_in_ms = delay.as_millis() as u64, failures, "delivery failed on infrastructure; rolled back, retrying later");
        self.schedule(d, failures, delay, false);
    }

    /// A delivery of a stalled kind waits without trying.
    fn wait_for_kind(&self, d: Delivery, failures: u32) {
        let delay = jitter(STALL_CAP, u32::MAX);
        tracing::debug!(entry = %d.entry_id, slot = d.slot().unwrap_or(""), retry_in_ms = delay.as_millis() as u64, "its kind is stalled; waiting");
        self.schedule(d, failures, delay, true);
    }

    /// Hands `d` back to the intake loop after `delay` (earlier when
    /// `for_kind` and a stalled kind flows again), keeping its entry alive
    /// meanwhile. On shutdown it is left pending.
    fn schedule(&self, d: Delivery, failures: u32, delay: Duration, for_kind: bool) {
        let (queue, worker, cancel, tx, flowing) = (
            self.exec.queue.clone(),
            self.exec.worker_id.clone(),
            self.cancel.clone(),
            self.tx.clone(),
            self.flowing.clone(),
        );
        let touch_every = (self.exec.visibility / 3).max(Duration::from_millis(50));
        tokio::spawn(async move {
            let due = Instant::now() + delay;
            loop {
                let left = due.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = flowing.notified(), if for_kind => break,
                    _ = tokio::time::sleep(left.min(touch_every)) => {}
                }
                if let Err(e) = queue.touch(&worker, &d.entry_id).await {
                    tracing::debug!(error = %e, "could not keep a waiting delivery's entry alive");
                }
            }
            let _ = tx.send(Retry { d, failures });
        });
    }
}

/// Measures this worker's clock against Postgres's at start and every
/// [`CLOCK_EVERY`]; warns when it is off by more than a second (at start,
/// and whenever that changes), and stores each measurement for `planner
/// status`. Postgres's clock judges claims and deadlines anyway; the
/// warning is for the operator (NTP), and for what this worker records.
async fn clock_loop(exec: Executor, cancel: CancellationToken) {
    let mut warned: Option<bool> = None;
    loop {
        let measured =
            tokio::time::timeout(exec.tx_deadline, measure_skew(&exec.pool, &exec.clock)).await;
        match measured {
            Ok(Ok(m)) => {
                let off = m.is_off();
                if off && warned != Some(true) {
                    tracing::warn!(worker = %exec.worker_id, skew_ms = m.skew_ms, rtt_ms = m.rtt_ms, "this worker's clock runs {} Postgres by {} ms (more than 1 s): Postgres's clock judges claims and deadlines, but what this worker records is off; check its time sync", m.direction(), m.skew_ms.abs());
                } else if !off && warned == Some(true) {
                    tracing::info!(worker = %exec.worker_id, skew_ms = m.skew_ms, "this worker's clock is within 1 s of Postgres's again");
                }
                warned = Some(off);
                if let Err(e) =
                    store::record_worker_clock(&exec.pool, &exec.worker_id, m.skew_ms, m.rtt_ms)
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

/// How the leader runs its chores (from [`WorkerOptions`]).
#[derive(Debug, Clone, Copy)]
struct LeaderChores {
    reconcile_every: Duration,
    forget_after: Duration,
    promote_by: crate::queue::PromoteBy,
}

/// What the lease loop last published: `Some` while this worker holds the
/// lease (the chores check [`Leading::valid`] themselves before acting).
type Authority = watch::Receiver<Option<Leading>>;

/// The leader's duties, as three tasks that never wait on each other:
/// lease upkeep, promotion, and the slow chores (reconcile, forget). A
/// reconcile pass that crawls under load (a busy Postgres, two starved
/// cores) must not delay a renewal past TTL/2 — that made a healthy leader
/// step down again and again and stalled promotion for the whole fleet.
async fn leader_loop(
    lease: Lease,
    reconciler: Reconciler,
    queue: Queue,
    clock: SharedClock,
    chores: LeaderChores,
    cancel: CancellationToken,
) {
    let (tx, rx) = watch::channel(None);
    let promote = tokio::spawn(promote_loop(
        queue.clone(),
        clock.clone(),
        chores.promote_by,
        rx.clone(),
        cancel.clone(),
    ));
    let upkeep = tokio::spawn(chores_loop(
        reconciler,
        queue,
        clock,
        chores,
        rx,
        cancel.clone(),
    ));
    lease_loop(lease, tx, cancel).await;
    let _ = promote.await;
    let _ = upkeep.await;
}

/// Renews (or tries to take) the lease every `renew_every` and publishes
/// the result; releases it when cancelled.
async fn lease_loop(
    mut lease: Lease,
    tx: watch::Sender<Option<Leading>>,
    cancel: CancellationToken,
) {
    let mut backoff = Reconnect::new(StdRng::from_entropy());
    loop {
        let wait = match lease.tick().await {
            Ok(change) => {
                match change {
                    Change::Acquired(_) => crate::telemetry::lease_change("acquired", true),
                    Change::Lost => crate::telemetry::lease_change("lost", false),
                    _ => {}
                }
                backoff.reset();
                lease.renew_every()
            }
            Err(e) => {
                let d = backoff.next_delay().min(lease.renew_every());
                tracing::warn!(error = %e, retry_in_ms = d.as_millis() as u64, "lease tick failed; retrying");
                d
            }
        };
        tx.send_if_modified(|cur| {
            let next = lease.leading();
            let changed = *cur != next;
            *cur = next;
            changed
        });
        if !sleep_or_cancel(wait, &cancel).await {
            break;
        }
    }
    // Chores see the tenure end before the lease is given back.
    tx.send_replace(None);
    if let Err(e) = lease.release().await {
        tracing::warn!(error = %e, "could not release the lease; it expires by itself");
    }
}

/// The current tenure, if this worker may act as leader right now.
fn acting(rx: &Authority) -> Option<Leading> {
    rx.borrow().clone().filter(Leading::valid)
}

/// Sleeps up to `d`, waking early when the lease changes hands; `false`
/// when cancelled.
async fn wait_or_change(d: Duration, rx: &mut Authority, cancel: &CancellationToken) -> bool {
    tokio::select! {
        _ = cancel.cancelled() => false,
        _ = tokio::time::sleep(d) => true,
        r = rx.changed() => r.is_ok(),
    }
}

/// While leading: promotes due slots, waking at the next due time.
async fn promote_loop(
    queue: Queue,
    clock: SharedClock,
    by: crate::queue::PromoteBy,
    mut rx: Authority,
    cancel: CancellationToken,
) {
    loop {
        // New slots may be planned earlier than the current head: look
        // again at least every second.
        let mut wake = Duration::from_secs(1);
        if let Some(lead) = acting(&rx) {
            match promote_due(&queue, &clock, &lead.fence, by).await {
                Ok(Some(ms)) => {
                    // A head that is due by this clock but still there was
                    // held back by Redis's clock: look again soon, without
                    // spinning.
                    let wait = match ms - unix_ms(clock.now()) {
                        w if w > 0 => w as u64,
                        _ => 25,
                    };
                    wake = wake.min(Duration::from_millis(wait));
                }
                Ok(None) => {}
                Err(e) => tracing::warn!(error = %e, "promotion failed; will retry"),
            }
        }
        if !wait_or_change(wake, &mut rx, &cancel).await {
            break;
        }
    }
}

/// While leading: reconciles every `reconcile_every` (at once on a new
/// tenure: whatever happened while no one led is found now) and forgets
/// consumers and workers gone longer than `forget_after`.
async fn chores_loop(
    reconciler: Reconciler,
    queue: Queue,
    clock: SharedClock,
    chores: LeaderChores,
    mut rx: Authority,
    cancel: CancellationToken,
) {
    let mut last: Option<(i64, Instant)> = None;
    loop {
        if let Some(lead) = acting(&rx) {
            let due = match last {
                Some((epoch, at)) => epoch != lead.epoch || at.elapsed() >= chores.reconcile_every,
                None => true,
            };
            if due {
                last = Some((lead.epoch, Instant::now()));
                let epoch = lead.epoch;
                let still = || acting(&rx).is_some_and(|l| l.epoch == epoch);
                match reconciler.run_once(epoch, still).await {
                    Ok(p) if p != Default::default() => tracing::info!(
                        redelivered = p.redelivered,
                        resumed = p.resumed,
                        missed = p.missed,
                        "reconciled"
                    ),
                    Ok(_) => {}
                    Err(e) => tracing::warn!(error = %e, "reconcile pass failed; will retry"),
                }
                match queue
                    .forget_gone(unix_ms(clock.now()), chores.forget_after)
                    .await
                {
                    Ok(f) if f != Default::default() => tracing::info!(
                        consumers = f.consumers,
                        workers = f.workers,
                        "forgot consumers and workers gone longer than forget_after"
                    ),
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!(error = %e, "forgetting gone consumers failed; will retry")
                    }
                }
            }
        }
        let wait = match last {
            Some((_, at)) => chores.reconcile_every.saturating_sub(at.elapsed()),
            None => Duration::from_secs(1),
        }
        .clamp(Duration::from_millis(50), Duration::from_secs(1));
        if !wait_or_change(wait, &mut rx, &cancel).await {
            break;
        }
    }
}

/// Promotes every due slot in bounded batches; returns the next due time.
async fn promote_due(
    queue: &Queue,
    clock: &SharedClock,
    fence: &str,
    by: crate::queue::PromoteBy,
) -> Result<Option<i64>, crate::queue::QueueError> {
    loop {
        match queue
            .promote(unix_ms(clock.now()), PROMOTE_BATCH, Some(fence), by)
            .await?
        {
            None => {
                tracing::warn!("promotion refused: this worker no longer holds the lease");
                return Ok(None);
            }
            Some(n) if n as usize >= PROMOTE_BATCH => continue,
            Some(_) => return queue.next_due_ms().await,
        }
    }
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
