//! The worker runtime: intake, reclaim, the leader's chores, shutdown.
//!
//! - **Intake** reads deliveries from the stream and runs them through the
//!   [`Executor`]: valid ones in batches of up to `batch` (one gate commit
//!   per batch), the rest one by one; at most `concurrency` batches or single
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
//!   full-jitter backoff; nothing crashes, nothing is acknowledged early.

use crate::clock::{unix_ms, SharedClock};
use crate::config::Config;
use crate::executor::Executor;
use crate::lease::{Change, Lease};
use crate::publish::Webhook;
use crate::queue::{Delivery, Queue};
use crate::reconcile::Reconciler;
use crate::retry::{Reconnect, RetryPolicy};
use rand::rngs::StdRng;
use rand::SeedableRng;
use sqlx::PgPool;
use std::sync::atomic::AtomicI64;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// Promotion moves at most this many slots per script call.
pub const PROMOTE_BATCH: usize = 500;

/// Default of [`WorkerOptions::batch`]: large enough that a backlog of
/// slots shares one gate commit per few dozen slots, small enough that a
/// batch's transaction stays a few milliseconds long and its webhook calls
/// (which run concurrently) stay a modest load on the CMS.
pub const DEFAULT_BATCH: usize = 32;

/// Tuning of one worker.
#[derive(Debug, Clone)]
pub struct WorkerOptions {
    pub id: String,
    pub concurrency: usize,
    /// Most deliveries taken through the gate in one transaction (1 = off).
    /// A batch holds one of the `concurrency` permits; its webhook calls run
    /// concurrently, so up to `concurrency × batch` calls may be in flight.
    pub batch: usize,
    pub lease_ttl: Duration,
    pub visibility: Duration,
    /// Time in-flight deliveries get to finish after shutdown starts.
    pub shutdown_grace: Duration,
    /// How often the leader reconciles.
    pub reconcile_every: Duration,
    /// Replaces the kinds' webhook retry policies (tests).
    pub retry_override: Option<RetryPolicy>,
    /// A consumer idle this long with nothing pending, and a heartbeat this
    /// old, are removed by the leader ([`Queue::forget_gone`]).
    pub forget_after: Duration,
}

/// Default of [`WorkerOptions::forget_after`]: far beyond any pause a live
/// worker survives, short enough that the group does not keep every worker
/// id of a year of deploys.
pub const DEFAULT_FORGET_AFTER: Duration = Duration::from_secs(24 * 3600);

impl WorkerOptions {
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
            forget_after: DEFAULT_FORGET_AFTER,
        }
    }
}

/// A worker, ready to run.
pub struct Worker {
    pub opts: WorkerOptions,
    pub config: Arc<Config>,
    pub pool: PgPool,
    pub queue: Queue,
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
            webhook: Webhook::new(),
            clock: self.clock.clone(),
            worker_id: self.opts.id.clone(),
            visibility: self.opts.visibility,
            epoch_seen: epoch_seen.clone(),
            retry_override: self.opts.retry_override,
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
            self.opts.reconcile_every,
            self.opts.forget_after,
            background.clone(),
        ));
        let alive = tokio::spawn(liveness_loop(
            self.queue.clone(),
            self.clock.clone(),
            self.opts.id.clone(),
            background.clone(),
        ));
        let stopped = intake_loop(&exec, &self.opts, cancel).await;
        background.cancel();
        let _ = leader.await;
        let _ = alive.await;
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
    let mut read_ahead = false;
    while !cancel.is_cancelled() {
        while tasks.try_join_next().is_some() {}
        let free = sem.available_permits();
        if free == 0 {
            tokio::select! {
                _ = cancel.cancelled() => break,
                _ = tasks.join_next() => continue,
            }
        }
        let mut batch: Vec<Delivery> = Vec::new();
        let mut failed = None;
        // Read ahead (up to `batch` per free permit) only while the stream
        // serves batchable work; a delivery that needs the one-delivery path
        // (malformed, redelivered too often) holds a permit of its own, and
        // reading more of those than there are permits would only let them
        // age unseen.
        let want = if read_ahead {
            free * opts.batch.max(1)
        } else {
            free
        };
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
        let (mut fast, single): (Vec<Delivery>, Vec<Delivery>) = if opts.batch > 1 {
            batch.into_iter().partition(|d| exec.batchable(d))
        } else {
            (Vec::new(), batch)
        };
        read_ahead = !fast.is_empty();
        let size = fast.len().div_ceil(free.max(1)).clamp(1, opts.batch.max(1));
        // Neighbouring slots of one kind go to one group: groups then rarely
        // share a kind's drafts and quota row, which a batch locks until its
        // commit.
        fast.sort_by(|a, b| a.slot().cmp(&b.slot()));
        let mut work: Vec<Vec<Delivery>> = Vec::new();
        while !fast.is_empty() {
            let rest = fast.split_off(size.min(fast.len()));
            work.push(std::mem::replace(&mut fast, rest));
        }
        work.extend(single.into_iter().map(|d| vec![d]));
        for group in work {
            let permit = sem
                .clone()
                .acquire_owned()
                .await
                .expect("semaphore never closed");
            let exec = exec.clone();
            let cancel = cancel.clone();
            tasks.spawn(async move {
                handle_group(&exec, group, &cancel).await;
                drop(permit);
            });
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

/// Runs a group of deliveries: one alone through [`Executor::handle`];
/// several (all batchable) through the batch first, then whatever it
/// deferred — or all of them, if the batch failed — one at a time.
async fn handle_group(exec: &Executor, group: Vec<Delivery>, cancel: &CancellationToken) {
    let mut settled = Vec::new();
    if group.len() > 1 {
        match exec.batch(&group).await {
            Ok(s) => settled = s,
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
        handle_with_retry(exec, d, cancel).await;
    }
}

/// Runs a delivery, retrying store failures with backoff. Gives up (leaving
/// the entry pending, to be reclaimed) on shutdown or after many failures.
async fn handle_with_retry(exec: &Executor, d: Delivery, cancel: &CancellationToken) {
    let mut backoff = Reconnect::new(StdRng::from_entropy());
    loop {
        match exec.handle(&d).await {
            Ok(_) => return,
            Err(e) => {
                let delay = backoff.next_delay();
                if cancel.is_cancelled() || backoff.failures() > 30 {
                    tracing::warn!(entry = %d.entry_id, slot = d.slot().unwrap_or(""), error = %e, "giving up on this delivery for now; it stays pending and will be reclaimed");
                    return;
                }
                tracing::warn!(entry = %d.entry_id, slot = d.slot().unwrap_or(""), error = %e, retry_in_ms = delay.as_millis() as u64, "delivery hit a store error; retrying");
                tokio::time::sleep(delay).await;
            }
        }
    }
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

/// Lease upkeep plus, while leading, promotion and reconciliation.
async fn leader_loop(
    mut lease: Lease,
    reconciler: Reconciler,
    queue: Queue,
    clock: SharedClock,
    reconcile_every: Duration,
    forget_after: Duration,
    cancel: CancellationToken,
) {
    let mut backoff = Reconnect::new(StdRng::from_entropy());
    let mut next_tick = Instant::now();
    let mut last_reconcile: Option<Instant> = None;
    loop {
        if cancel.is_cancelled() {
            break;
        }
        if Instant::now() >= next_tick {
            match lease.tick().await {
                Ok(Change::Acquired(_)) => {
                    crate::telemetry::lease_change("acquired", true);
                    // A fresh leader repairs at once: whatever happened while
                    // no one led is found now.
                    last_reconcile = None;
                    backoff.reset();
                }
                Ok(Change::Lost) => {
                    crate::telemetry::lease_change("lost", false);
                    backoff.reset();
                }
                Ok(_) => backoff.reset(),
                Err(e) => {
                    let d = backoff.next_delay();
                    tracing::warn!(error = %e, retry_in_ms = d.as_millis() as u64, "lease tick failed; retrying");
                    next_tick = Instant::now() + d.min(lease.renew_every());
                    sleep_or_cancel(d.min(lease.renew_every()), &cancel).await;
                    continue;
                }
            }
            next_tick = Instant::now() + lease.renew_every();
        }
        let mut wake = next_tick;
        if let (Some(fence), Some(epoch)) = (lease.fence().map(str::to_owned), lease.epoch()) {
            match promote_due(&queue, &clock, &fence).await {
                Ok(next_due) => {
                    if let Some(ms) = next_due {
                        let wait = (ms - unix_ms(clock.now())).max(0) as u64;
                        wake = wake.min(Instant::now() + Duration::from_millis(wait));
                    }
                }
                Err(e) => tracing::warn!(error = %e, "promotion failed; will retry"),
            }
            if last_reconcile.is_none_or(|t| t.elapsed() >= reconcile_every) {
                last_reconcile = Some(Instant::now());
                let still = || lease.fence().is_some();
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
                match queue.forget_gone(unix_ms(clock.now()), forget_after).await {
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
            // New slots may be planned earlier than the current head: look
            // again at least every second.
            wake = wake.min(Instant::now() + Duration::from_secs(1));
        }
        let d = wake.saturating_duration_since(Instant::now());
        if !sleep_or_cancel(d, &cancel).await {
            break;
        }
    }
    if let Err(e) = lease.release().await {
        tracing::warn!(error = %e, "could not release the lease; it expires by itself");
    }
}

/// Promotes every due slot in bounded batches; returns the next due time.
async fn promote_due(
    queue: &Queue,
    clock: &SharedClock,
    fence: &str,
) -> Result<Option<i64>, crate::queue::QueueError> {
    loop {
        match queue
            .promote(unix_ms(clock.now()), PROMOTE_BATCH, Some(fence))
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
/// (intake stops, in-flight work drains); a second one exits at once with
/// status 130, leaving unfinished deliveries pending for another worker.
pub fn stop_on_signals(cancel: CancellationToken) {
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
                std::process::exit(130);
            }
        }
    });
}
