//! Intake: reads deliveries from the stream (and reclaims idle ones), cuts
//! them into gate batches and single deliveries, and runs them under the
//! worker's two bounds: `concurrency` walks through the gate at once, and
//! `concurrency × batch` calls in flight, each call's permit held only
//! until that call returns.
//!
//! [`intake_loop`] is the loop and its drain; each turn ([`Intake::turn`])
//! asks, in order: is a walk permit free? does the server take writes? are
//! retries due? do slots waiting for their kinds' calls fit now? is the
//! hand below its bound? are there calls to spare for the read? then reads
//! and dispatches.

use super::calls::{CallPermit, Calls, Tally};
use super::*;
use crate::executor::{Batchable, Permits};
use crate::queue::QueueError;
use std::collections::VecDeque;
use tokio::sync::mpsc::UnboundedReceiver;

pub(super) async fn intake_loop(
    exec: &Executor,
    opts: &WorkerOptions,
    writable: Arc<Writable>,
    cancel: CancellationToken,
) -> Stopped {
    let (retry_tx, retry_rx) = unbounded_channel::<Retry>();
    let later = Later {
        exec: exec.clone(),
        tx: retry_tx,
        cancel: cancel.clone(),
        stalls: Default::default(),
        flowing: Default::default(),
        held: Default::default(),
        in_flight: Default::default(),
        writable,
        quiet: Default::default(),
    };
    let keep_alive = tokio::spawn(later.clone().keep_alive());
    let mut intake = Intake {
        exec,
        opts,
        walks: Arc::new(Semaphore::new(opts.concurrency.max(1))),
        calls: Calls::new(opts, &exec.config),
        tasks: JoinSet::new(),
        later,
        retry_rx,
        backoff: Reconnect::new(exec.entropy.rng()),
        reclaim_every: (opts.visibility / 2)
            .clamp(Duration::from_millis(100), Duration::from_secs(5)),
        last_reclaim: None,
        read_ahead: ReadAhead::Single,
        waiting: HashMap::new(),
        calls_full: false,
        at_bound: false,
    };
    while !cancel.is_cancelled() {
        if intake.turn(&cancel).await == Turn::Stop {
            break;
        }
    }
    keep_alive.abort();
    intake.drain().await
}

/// Whether the loop goes on.
#[derive(Debug, PartialEq, Eq)]
enum Turn {
    Next,
    Stop,
}

/// What the intake loop keeps from one turn to the next.
struct Intake<'a> {
    exec: &'a Executor,
    opts: &'a WorkerOptions,
    /// The `concurrency` walk permits: a batch holds one through its gate,
    /// a delivery alone through its whole walk.
    walks: Arc<Semaphore>,
    /// The `concurrency × batch` call permits: a batch's webhook slot holds
    /// one from before its gate until its call returns; each kind holds at
    /// most its share.
    calls: Calls,
    tasks: JoinSet<()>,
    /// Deliveries held back (stalled kinds, retries, a read-only server).
    later: Later,
    /// Retries that came due.
    retry_rx: UnboundedReceiver<Retry>,
    /// Redis reconnect backoff.
    backoff: Reconnect<rand::rngs::StdRng>,
    reclaim_every: Duration,
    last_reclaim: Option<Instant>,
    read_ahead: ReadAhead,
    /// Webhook slots read while their kind held its share of the call
    /// permits, by kind, in the order read: gated before any new read as
    /// soon as their kind's calls leave room ([`Intake::admit_waiting`]).
    /// Their entries are in [`Later::held`]: kept alive, and counted
    /// against [`MAX_HELD`].
    waiting: HashMap<String, VecDeque<Waiting>>,
    /// Whether the last read brought only slots that wait for their kinds'
    /// calls ([`CALLS_PAUSE`]).
    calls_full: bool,
    /// Whether the hand is full (logged once on the way in and out).
    at_bound: bool,
}

impl Intake<'_> {
    /// One turn: a free walk permit, writes taken, retries first, room in
    /// the hand, calls to spare, then one read dispatched.
    async fn turn(&mut self, cancel: &CancellationToken) -> Turn {
        while self.tasks.try_join_next().is_some() {}
        let free = self.walks.available_permits();
        if free == 0 {
            tokio::select! {
                _ = cancel.cancelled() => return Turn::Stop,
                _ = self.walks.acquire() => return Turn::Next,
            }
        }
        // A server that refuses writes (a standby behind the address after
        // a failover): reading more would only fill the hand with
        // deliveries that cannot be recorded, and retrying the ones in
        // hand would only meet the refusal again. `role` logs why, once.
        // Retries that came due meanwhile are held again (their entries kept
        // alive), not left in the channel where nothing touches them.
        if self.later.writable.read_only() {
            while let Ok(r) = self.retry_rx.try_recv() {
                self.later.wait_for_writes(r.d, r.failures);
            }
            self.later.writable.wait(ROLE_EVERY_READ_ONLY, cancel).await;
            return Turn::Next;
        }
        if self.run_due_retries(free).await {
            return Turn::Next;
        }
        // Slots already read go before new ones.
        let admitted = self.admit_waiting().await;
        // Held deliveries take no permit; the bound on what a worker has in
        // hand is what keeps a stalled kind from reading the whole stream
        // into memory.
        let held = self.later.in_hand();
        if held >= MAX_HELD {
            if !self.at_bound {
                self.at_bound = true;
                tracing::warn!(worker = %self.opts.id, held, bound = MAX_HELD, "holding back the most deliveries a worker may (stalled kinds, retries, slots waiting for their kind's calls); reading nothing more until some go");
            }
            // Waiting slots are let in as soon as calls return.
            let room = self.calls.enough_to_resume();
            tokio::select! {
                _ = cancel.cancelled() => return Turn::Stop,
                _ = tokio::time::timeout(Duration::from_millis(100), self.calls.wait_free(room)), if !self.waiting.is_empty() => {}
                _ = tokio::time::sleep(Duration::from_millis(100)), if self.waiting.is_empty() => {}
            }
            return Turn::Next;
        }
        if self.at_bound {
            self.at_bound = false;
            tracing::info!(worker = %self.opts.id, held, "below the bound of held-back deliveries again; reading");
        }
        // The last read brought nothing but slots whose kinds hold their
        // share of the calls, and none of the waiting fit yet: reading on at
        // once would only add to them (a burst of one kind piled up to
        // `MAX_HELD` that way). Wait until a gate's worth of them fits
        // (`enough_to_resume`), or `CALLS_PAUSE`: a kind whose calls are
        // slow must not keep the other kinds' slots unread for long.
        if std::mem::take(&mut self.calls_full) && !admitted {
            let room = self.calls.enough_to_resume();
            return match self.calls_free_within(room, cancel).await {
                None => Turn::Stop,
                Some(_) => Turn::Next,
            };
        }
        // A read that may bring webhook slots waits until a batch's worth
        // of calls is free (less when a kind's share leaves less), so that
        // calls returning one by one do not cut the backlog into gates of
        // a few slots; but not for longer than `CALLS_PAUSE`: while kinds
        // whose calls hang hold the share and their footholds, a read's
        // worth may not be free until their timeouts, and the slots not
        // read yet may be other kinds'. Then the read takes what is free
        // (one at least).
        let spare = self.calls.free();
        let enough = self.calls.enough_to_read();
        if self.read_ahead == ReadAhead::PerCall && spare < enough {
            match self.calls_free_within(enough, cancel).await {
                None => return Turn::Stop,
                Some(true) => return Turn::Next,
                Some(false) => {}
            }
        }
        // A read never takes more than the bound has room for, should all
        // of it be held back.
        let want = self
            .read_ahead
            .want(free, spare, self.opts.concurrency, self.opts.batch)
            .min(MAX_HELD - held);
        match self.take(held, want).await {
            Ok(batch) => {
                self.backoff.reset();
                self.dispatch(batch).await;
            }
            Err(e) => {
                let d = self.backoff.next_delay();
                tracing::warn!(worker = %self.opts.id, error = %e, retry_in_ms = d.as_millis() as u64, failures = self.backoff.failures(), "redis unavailable for intake; backing off");
                sleep_or_cancel(d, cancel).await;
            }
        }
        Turn::Next
    }

    /// Waits up to [`CALLS_PAUSE`] for `n` call permits free at once →
    /// whether they were (`None`: cancelled).
    async fn calls_free_within(&self, n: usize, cancel: &CancellationToken) -> Option<bool> {
        tokio::select! {
            _ = cancel.cancelled() => None,
            freed = tokio::time::timeout(CALLS_PAUSE, self.calls.wait_free(n)) => Some(freed.is_ok()),
        }
    }

    /// Deliveries whose retry is due go first: those of batched kinds cut
    /// into gate groups as a read's are (after an outage the whole backlog
    /// comes back in batches, not one delivery per permit), the others one
    /// permit each (at most `free`); one of a stalled kind waits again
    /// without taking a permit. Whether any ran.
    async fn run_due_retries(&mut self, free: usize) -> bool {
        let most = free.max(1) * self.opts.batch.max(1);
        let mut fast: Vec<(Delivery, Option<String>)> = Vec::new();
        let mut fast_failures = 0;
        let mut single: Vec<Retry> = Vec::new();
        let mut tally = self.calls.tally();
        while single.len() < free && fast.len() < most {
            match self.retry_rx.try_recv() {
                Ok(Retry { d, failures }) => match self.route(&mut tally, d, failures) {
                    Route::Gate(d, kind) => {
                        // A group counts as often failed as its most
                        // failed delivery.
                        fast_failures = fast_failures.max(failures);
                        fast.push((d, kind));
                    }
                    Route::Alone(d) => single.push(Retry { d, failures }),
                    Route::Held | Route::Waits => {}
                },
                Err(_) => break,
            }
        }
        drop(tally);
        let any = !fast.is_empty() || !single.is_empty();
        self.spawn_gates(fast, fast_failures).await;
        for r in single {
            self.spawn(Group::single(r.d), r.failures).await;
        }
        any
    }

    /// Idle deliveries of other workers when a reclaim is due and finds
    /// some, else up to `want` new ones (waiting up to a second, or
    /// [`CALLS_PAUSE`] while slots wait for their kinds' calls).
    async fn take(&mut self, held: usize, want: usize) -> Result<Vec<Delivery>, QueueError> {
        let (exec, opts) = (self.exec, self.opts);
        if self
            .last_reclaim
            .is_none_or(|t| t.elapsed() >= self.reclaim_every)
        {
            self.last_reclaim = Some(Instant::now());
            // As many as a read may take at most: a worker that died holding
            // a stalled kind's backlog (up to MAX_HELD) is taken over in
            // seconds, not at a few entries per pass.
            let take_over = (opts.concurrency.max(1) * opts.batch.max(1)).min(MAX_HELD - held);
            let v = exec
                .queue
                .reclaim(&opts.id, opts.visibility, take_over)
                .await?;
            if !v.is_empty() {
                tracing::info!(worker = %opts.id, count = v.len(), "reclaimed idle deliveries");
                return Ok(v);
            }
        }
        // Slots waiting for their kinds' calls are looked at between reads:
        // a read that waits for the stream to fill must not keep them past
        // `CALLS_PAUSE`.
        let block = if self.waiting.is_empty() {
            Duration::from_millis(1000)
        } else {
            CALLS_PAUSE
        };
        exec.queue.read(&opts.id, want, block).await
    }

    /// Sends each delivery of a read where [`Intake::route`] says, cuts
    /// the batchable ones into gate groups and starts each group and
    /// single under its permits.
    async fn dispatch(&mut self, batch: Vec<Delivery>) {
        let mut fast: Vec<(Delivery, Option<String>)> = Vec::new();
        let mut single: Vec<Delivery> = Vec::new();
        let mut waits = 0;
        let mut tally = self.calls.tally();
        for d in batch {
            match self.route(&mut tally, d, 0) {
                Route::Gate(d, kind) => fast.push((d, kind)),
                Route::Alone(d) => single.push(d),
                Route::Held => {}
                Route::Waits => waits += 1,
            }
        }
        drop(tally);
        // A read that brought only slots that wait for their kinds' calls
        // (a kind at its share): the next one waits for calls to return.
        self.calls_full = waits > 0 && fast.is_empty() && single.is_empty();
        let (mut work, next) = gate_groups(fast, self.calls.total());
        self.read_ahead = next;
        work.extend(single.into_iter().map(Group::single));
        for group in work {
            self.spawn(group, 0).await;
        }
    }

    /// Where one delivery of a read or a due retry goes. Held back, and
    /// handed to [`Later`] here: one whose kind's first mirror is not read
    /// yet, one of a stalled kind. Put among the [`Intake::waiting`]: a
    /// webhook slot whose kind holds its share of the call permits
    /// (counted in `tally` otherwise). The mirror first: `stalled` makes
    /// the caller its kind's probe, and a probe must run. With `--batch 1`
    /// every delivery goes alone; no need to ask.
    fn route(&mut self, tally: &mut Tally, d: Delivery, failures: u32) -> Route {
        if self.later.awaits_mirror(&d) {
            self.later.wait_for_mirror(d, failures);
            return Route::Held;
        }
        if self.later.stalled(&d) {
            self.later.wait_for_kind(d, failures);
            return Route::Held;
        }
        let batched = if self.opts.batch > 1 {
            self.exec.batch_kind(&d)
        } else {
            None
        };
        match batched {
            None => Route::Alone(d),
            Some(Batchable::RecordOnly) => Route::Gate(d, None),
            Some(Batchable::Calls(kind)) if tally.admit(kind) => {
                Route::Gate(d, Some(kind.to_owned()))
            }
            Some(Batchable::Calls(kind)) => {
                let kind = kind.to_owned();
                self.later.hold(&d);
                let waiting = self.waiting.entry(kind).or_default();
                waiting.push_back(Waiting {
                    since: Instant::now(),
                    retry: Retry { d, failures },
                });
                Route::Waits
            }
        }
    }

    /// Gates the slots waiting for their kinds' calls that fit their kinds'
    /// shares now, oldest first, in gate groups as a read's (a waiting
    /// slot whose kind stalled meanwhile waits for its kind instead).
    /// Whether any went.
    async fn admit_waiting(&mut self) -> bool {
        if self.waiting.is_empty() {
            return false;
        }
        let mut fast: Vec<(Delivery, Option<String>)> = Vec::new();
        let mut most_failures = 0;
        let mut tally = self.calls.tally();
        let enough = self.calls.enough_to_read();
        for (kind, waiting) in self.waiting.iter_mut() {
            // A gate's worth at once (or all that wait): let in as each
            // call returned, a busy kind's slots went through gates of one
            // or two, which queue one after another on its quota row. But
            // none waits on that for longer than `CALLS_PAUSE` (a kind
            // whose few calls left open hang).
            let long = waiting
                .front()
                .is_some_and(|w| w.since.elapsed() >= CALLS_PAUSE);
            if tally.room(kind) < enough.min(waiting.len()) && !long {
                continue;
            }
            while !waiting.is_empty() && tally.admit(kind) {
                let Some(Waiting { retry, .. }) = waiting.pop_front() else {
                    break;
                };
                let Retry { d, failures } = retry;
                self.later.release(&d);
                if self.later.stalled(&d) {
                    self.later.wait_for_kind(d, failures);
                    continue;
                }
                most_failures = most_failures.max(failures);
                fast.push((d, Some(kind.clone())));
            }
        }
        self.waiting.retain(|_, waiting| !waiting.is_empty());
        drop(tally);
        let any = !fast.is_empty();
        self.spawn_gates(fast, most_failures).await;
        any
    }

    /// Starts the gate groups of slots already read (due retries, waiting
    /// slots let in), each counted as failed `failures` times.
    async fn spawn_gates(&mut self, fast: Vec<(Delivery, Option<String>)>, failures: u32) {
        let (groups, _) = gate_groups(fast, self.calls.total());
        for group in groups {
            self.spawn(group, failures).await;
        }
    }

    /// Runs `group` as a task of its own: a walk permit, and a call permit
    /// for each of its webhook slots, each released by the walk as soon as
    /// it may be.
    async fn spawn(&mut self, mut group: Group, failures: u32) {
        let walk = (self.walks.clone())
            .acquire_owned()
            .await
            .expect("semaphore never closed");
        let call_permits = self.calls.take(std::mem::take(&mut group.call_kinds)).await;
        let later = self.later.clone();
        let n = group.deliveries.len();
        later
            .in_flight
            .fetch_add(n, std::sync::atomic::Ordering::SeqCst);
        self.tasks.spawn(async move {
            let permits = Permits {
                gate: Some(walk),
                calls: call_permits,
            };
            handle_group(&later, group, permits, failures).await;
            later
                .in_flight
                .fetch_sub(n, std::sync::atomic::Ordering::SeqCst);
        });
    }

    /// Shutdown: waits up to the grace for the deliveries in flight; the
    /// rest stay pending for another worker.
    async fn drain(mut self) -> Stopped {
        let opts = self.opts;
        let waiting: usize = self.waiting.values().map(VecDeque::len).sum();
        if waiting > 0 {
            tracing::info!(worker = %opts.id, waiting, "slots waiting for their kinds' calls stay pending for another worker");
        }
        let in_flight = self.tasks.len();
        if in_flight > 0 {
            tracing::info!(worker = %opts.id, in_flight, grace_ms = opts.shutdown_grace.as_millis() as u64, "intake stopped; draining in-flight deliveries");
        }
        let tasks = &mut self.tasks;
        let drained = tokio::time::timeout(opts.shutdown_grace, async {
            while tasks.join_next().await.is_some() {}
        })
        .await;
        let left = if drained.is_err() {
            self.tasks.len()
        } else {
            0
        };
        if left > 0 {
            tracing::warn!(worker = %opts.id, left, "grace period over; unfinished deliveries stay pending for another worker");
            self.tasks.abort_all();
        }
        Stopped {
            abandoned_in_flight: left,
        }
    }
}

/// A webhook slot waiting for its kind's calls ([`Intake::waiting`]).
struct Waiting {
    since: Instant,
    retry: Retry,
}

/// Where [`Intake::route`] sends a delivery.
enum Route {
    /// Through a gate with others, with the kind of the call permit it
    /// takes (none for a record-only slot).
    Gate(Delivery, Option<String>),
    /// On its own, through [`Executor::handle`].
    Alone(Delivery),
    /// Held back for its kind (mirror, stall).
    Held,
    /// Among the slots waiting for their kind's calls.
    Waits,
}

/// Deliveries that go through the gate together, and the call permits
/// they take: none for a delivery alone (its walk permit bounds it) or a
/// record-only slot, one of its kind's for each webhook slot of a batch.
#[derive(Debug)]
struct Group {
    deliveries: Vec<Delivery>,
    /// Beside each delivery, the kind of the call permit it takes.
    call_kinds: Vec<Option<String>>,
    /// Whether it goes through [`Executor::handle`] (a delivery alone).
    alone: bool,
}

impl Group {
    /// One delivery on its own: the one-delivery path.
    fn single(d: Delivery) -> Group {
        Group {
            deliveries: vec![d],
            call_kinds: vec![None],
            alone: true,
        }
    }
}

/// Cuts the batchable deliveries of one read (each with the kind of the
/// call permit it takes, none for a record-only slot) into gate groups: all of them, of every kind, in one
/// gate transaction (none for an empty read), taking a call permit per
/// webhook slot; a group per `calls` webhook slots (all the permits there
/// are) should a read hold more.
///
/// The slots read together go through one gate however many the read
/// brought (at most `concurrency × batch`, or [`RECORD_ONLY_WINDOWS`] times
/// that of record-only slots) and however many kinds they
/// belong to. Gate transactions of one kind only queue one after another on
/// the kind's quota row, which each holds through its commit. And real
/// schedules interleave kinds in due order, so a read holds a few slots of
/// each kind: a gate per kind of a read was then a transaction for a
/// handful of slots (`slotgate-bench burst --shapes interleaved`; figures
/// in docs/BENCHMARKS.md, the A/B runs in docs/benchmarks-archive.md,
/// 2026-12-01 and 2026-12-04). The gate's lock order (gate rows in
/// (kind, day, slot) order, quota rows last in (kind, day) order) holds
/// across kinds as within one, so one gate of many kinds cannot deadlock
/// with another.
///
/// Record-only slots are settled inside the gate transaction. The webhook
/// slots' calls each hold a call permit until they return, and are
/// recorded in waves as they return ([`Executor::batch_holding`]), so a
/// slow call holds one permit and its own record, nothing of the calls
/// beside it.
///
/// Also says how far the next read may look ahead ([`ReadAhead`]).
fn gate_groups(fast: Vec<(Delivery, Option<String>)>, calls: usize) -> (Vec<Group>, ReadAhead) {
    // The gate sorts its slots into its lock order itself.
    let webhook = fast.iter().filter(|(_, kind)| kind.is_some()).count();
    let next = if fast.is_empty() {
        ReadAhead::Single
    } else if webhook == 0 {
        ReadAhead::Window
    } else {
        ReadAhead::PerCall
    };
    // One group, unless the read holds more webhook slots than the worker
    // has call permits (a read of two windows, sized by a read of only
    // record-only slots, that brought webhook slots): then a group per
    // `calls` of them, so every call holds a permit.
    let mut groups: Vec<Group> = Vec::new();
    // Call permits the last group takes.
    let mut taken = 0;
    for (d, kind) in fast {
        if groups.is_empty() || (kind.is_some() && taken == calls.max(1)) {
            groups.push(Group {
                deliveries: Vec::new(),
                call_kinds: Vec::new(),
                alone: false,
            });
            taken = 0;
        }
        let g = groups.last_mut().expect("pushed above");
        taken += usize::from(kind.is_some());
        g.deliveries.push(d);
        g.call_kinds.push(kind);
    }
    (groups, next)
}

/// How many deliveries intake reads next, judged by what the last read
/// brought.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReadAhead {
    /// The stream served work for the one-delivery path (malformed,
    /// redelivered too often), or nothing: one per free walk permit. Each
    /// such delivery holds a walk permit of its own; reading more than
    /// there are permits would only let them age unseen.
    Single,
    /// Batchable work with webhook slots: as many as there are call
    /// permits free (`batch` at least, which intake waits for up to
    /// [`CALLS_PAUSE`]; one at least).
    PerCall,
    /// Only record-only slots: [`RECORD_ONLY_WINDOWS`] whole windows
    /// (`concurrency × batch` each) even with one walk permit free, because
    /// their slots go through one gate transaction ([`gate_groups`]).
    /// Reading only what the free permits cover kept their batches at
    /// `batch` in a burst (a permit frees, 32 more are read), and
    /// same-kind batches then queue on the kind's quota row.
    Window,
}

/// The longest intake waits for calls to return after a read that brought
/// only slots that wait for their kinds' calls, or for a read's worth of
/// free call permits before a webhook read ([`Intake::turn`]).
const CALLS_PAUSE: Duration = Duration::from_millis(50);

/// How many `concurrency × batch` windows one read takes while the stream
/// serves only record-only slots. Their gate is their whole effect and
/// calls no one, so the bound `batch` keeps on the calls in flight against
/// a CMS does not apply to them; a read of two windows (512 slots by
/// default) halves the gate statements per slot, and in a burst ran ahead
/// of one window in most alternating pairs (docs/BENCHMARKS.md, issue 43's
/// rows). Its price is the wait it may add to a slot: one gate of the
/// read, a few tens of milliseconds on a busy 2-core machine (DESIGN
/// section 2, "Batches"). Webhook reads take what the free call permits
/// cover.
pub(crate) const RECORD_ONLY_WINDOWS: usize = 2;

impl ReadAhead {
    /// `walks`: walk permits free; `calls`: call permits free.
    fn want(self, walks: usize, calls: usize, concurrency: usize, batch: usize) -> usize {
        match self {
            ReadAhead::Single => walks,
            ReadAhead::PerCall => calls.max(1),
            ReadAhead::Window => RECORD_ONLY_WINDOWS * concurrency.max(1) * batch.max(1),
        }
    }
}

/// Runs a group of deliveries: one alone through [`Executor::handle`]
/// under its walk permit; a batch through [`Executor::batch_holding`]
/// first, then whatever it deferred — or all of them, if the batch failed
/// — one at a time. One that fails is handed to [`Later`].
/// `failures`: how often the group's (single) delivery failed before.
async fn handle_group(
    later: &Later,
    group: Group,
    permits: Permits<tokio::sync::OwnedSemaphorePermit, CallPermit>,
    failures: u32,
) {
    let exec = &later.exec;
    let Group {
        deliveries: group,
        alone,
        ..
    } = group;
    let mut settled = Vec::new();
    // A delivery alone keeps its walk permit until it is done.
    let _walk = if alone {
        permits.gate
    } else {
        match exec.batch_holding(&group, permits).await {
            Ok(s) => {
                for i in &s {
                    later.unstall(&group[*i]);
                }
                settled = s;
            }
            // Postgres kept the batch waiting (a lock, a statement past its
            // limit): one at a time, each would wait out the same lock, so
            // the first stalls the kind and the rest wait with it.
            // The server refuses writes: every delivery of the group waits
            // for a writable primary.
            Err(e) if e.is_read_only() => {
                for d in group {
                    later.failed(d, failures, &e);
                }
                return;
            }
            Err(e) if e.is_stall() => {
                let mut group = group.into_iter();
                if let Some(first) = group.next() {
                    later.failed(first, failures, &e);
                }
                for d in group {
                    // A batch mixes kinds: one of them may be another
                    // kind's probe, which ends here too.
                    later.probe_ended(&d);
                    later.wait_for_kind(d, failures);
                }
                return;
            }
            // Postgres is out for everyone (a full disk, a lost server):
            // one at a time, each would fail the same way and log it. The
            // group waits for its retry together and comes back as a batch.
            Err(e) if e.is_outage() => {
                later.failed_together(group, failures, &e);
                return;
            }
            Err(e) => {
                tracing::warn!(error = %e, deliveries = group.len(), "batch failed; handling its deliveries one at a time");
            }
        }
        None
    };
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

#[cfg(test)]
mod tests {
    use super::*;

    /// How many call permits `g` takes.
    fn calls(g: &Group) -> usize {
        g.call_kinds.iter().flatten().count()
    }

    fn read(
        kind: &str,
        slots: std::ops::Range<u32>,
        record_only: bool,
    ) -> Vec<(Delivery, Option<String>)> {
        slots
            .map(|n| {
                let key = format!("{kind}:2030-01-15:{n}");
                (
                    Delivery::synthetic(format!("0-{n}"), &key, "planner"),
                    (!record_only).then(|| kind.to_owned()),
                )
            })
            .collect()
    }

    #[test]
    fn the_slots_of_one_read_are_one_gate_with_a_call_permit_per_webhook_slot() {
        // A read of 70 webhook slots of `a`, 5 of `b` and 40 record-only
        // slots of `c`, shuffled by kind; 256 calls in flight at most.
        let mut fast = read("c", 0..40, true);
        fast.extend(read("b", 0..5, false));
        fast.extend(read("a", 0..70, false));
        let (groups, next) = gate_groups(fast, 256);
        // One gate for all 115; a call permit for each of the 75 calls.
        let shape: Vec<(usize, usize, bool)> = groups
            .iter()
            .map(|g| (g.deliveries.len(), calls(g), g.alone))
            .collect();
        assert_eq!(shape, vec![(115, 75, false)]);
        assert_eq!(next, ReadAhead::PerCall);
        // Record-only slots of many kinds: one gate, no call permit.
        let mut fast = read("c", 0..40, true);
        fast.extend(read("d", 0..40, true));
        let (groups, next) = gate_groups(fast, 256);
        assert_eq!(
            (groups.len(), groups[0].deliveries.len(), calls(&groups[0])),
            (1, 80, 0)
        );
        assert_eq!(next, ReadAhead::Window);
        assert!(gate_groups(Vec::new(), 256).0.is_empty());
    }

    #[test]
    fn a_read_of_record_only_slots_takes_two_windows_and_a_webhook_read_what_its_calls_cover() {
        // concurrency 8, batch 32; 3 walk permits and 40 call permits free.
        assert_eq!(ReadAhead::Window.want(3, 40, 8, 32), 512);
        assert_eq!(ReadAhead::PerCall.want(3, 40, 8, 32), 40);
        // No call permit free (after `CALLS_PAUSE`): one, which may wait.
        assert_eq!(ReadAhead::PerCall.want(3, 0, 8, 32), 1);
        assert_eq!(ReadAhead::Single.want(3, 40, 8, 32), 3);
        // `--batch 1`: still two windows of one slot per permit.
        assert_eq!(ReadAhead::Window.want(3, 8, 8, 1), 16);
    }

    #[test]
    fn a_webhook_gate_never_asks_for_more_call_permits_than_there_are() {
        // 600 webhook slots and 10 record-only ones, 256 call permits:
        // three gates, each call with a permit.
        let mut fast = read("a", 0..600, false);
        fast.extend(read("r", 0..10, true));
        let (groups, _) = gate_groups(fast, 256);
        let shape: Vec<(usize, usize)> = groups
            .iter()
            .map(|g| (g.deliveries.len(), calls(g)))
            .collect();
        assert_eq!(shape, vec![(256, 256), (256, 256), (98, 88)]);
        let (groups, next) = gate_groups(read("r", 0..1000, true), 256);
        assert_eq!((groups.len(), calls(&groups[0])), (1, 0));
        assert_eq!(next, ReadAhead::Window);
        assert_eq!(gate_groups(Vec::new(), 256).1, ReadAhead::Single);
    }
}
