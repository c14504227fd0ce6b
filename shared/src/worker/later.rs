//! Retries of failed deliveries outside any permit, and stalled kinds:
//! a kind Postgres keeps waiting pauses alone while the others flow; the
//! held deliveries' entries kept alive (with intake's slots waiting for
//! their kinds' calls).

use super::*;
use crate::queue::EntryRef;
use std::collections::HashSet;

/// A delivery waiting for its next try, and how often it failed so far.
pub(super) struct Retry {
    pub(super) d: Delivery,
    pub(super) failures: u32,
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
pub(super) struct Later {
    pub(super) exec: Executor,
    pub(super) tx: UnboundedSender<Retry>,
    pub(super) cancel: CancellationToken,
    pub(super) stalls: Arc<Mutex<HashMap<String, Stall>>>,
    /// Wakes the deliveries waiting for a stalled kind when one flows again.
    pub(super) flowing: Arc<tokio::sync::Notify>,
    /// Entry ids of the deliveries held here (at most [`MAX_HELD`] as
    /// intake keeps it): what [`Later::keep_alive`] touches, in batches.
    pub(super) held: Arc<Mutex<HashSet<(u16, String)>>>,
    /// Deliveries read and handed to a task that has not finished: with
    /// [`Later::held`], what this worker has in hand.
    pub(super) in_flight: Arc<std::sync::atomic::AtomicUsize>,
    /// Whether Postgres takes writes (see `role`).
    pub(super) writable: Arc<Writable>,
    /// Failures logged in summary (see [`Quiet`]).
    pub(super) quiet: Arc<Mutex<Quiet>>,
}

/// How often a delivery waiting for its kind's first mirror looks again.
const MIRROR_POLL: Duration = Duration::from_millis(100);

/// How often at most the worker logs a delivery's failure on
/// infrastructure; the ones in between are counted and named in the next
/// line. A 20 s outage at 15 slots/s once gave 1,740 WARN lines.
pub(super) const FAILURE_LOG_EVERY: Duration = Duration::from_secs(5);

/// The failures on infrastructure not logged one by one since the last
/// line.
#[derive(Default)]
pub(super) struct Quiet {
    /// When the last line was written.
    last_line: Option<Instant>,
    /// Failures since then, not logged.
    unlogged: u64,
}

impl Quiet {
    /// `Some(failures not logged since the last line)` when this failure
    /// gets a line of its own; `None` when it is only counted.
    fn line(&mut self) -> Option<u64> {
        if self
            .last_line
            .is_some_and(|t| t.elapsed() < FAILURE_LOG_EVERY)
        {
            self.unlogged += 1;
            return None;
        }
        self.last_line = Some(Instant::now());
        Some(std::mem::take(&mut self.unlogged))
    }

    /// Failures not logged yet, once deliveries go through again.
    fn settle(&mut self) -> u64 {
        let n = std::mem::take(&mut self.unlogged);
        if n > 0 {
            self.last_line = None;
        }
        n
    }
}

/// A stalled kind.
pub(super) struct Stall {
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

impl Later {
    /// A full-jitter delay from the executor's injected entropy.
    fn jitter(&self, cap: Duration, attempt: u32) -> Duration {
        full_jitter(&mut self.exec.entropy.rng(), RETRY_BASE, cap, attempt)
    }

    /// Whether `d` must wait for its kind. After the stall's window the
    /// first caller becomes the probe and gets `false`.
    pub(super) fn stalled(&self, d: &Delivery) -> bool {
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

    /// `d` failed: if it was its kind's probe, another may try (a new
    /// stall starts a new window anyway). Every failure path calls this:
    /// a probe that ends without it leaves the kind waiting for good (a
    /// probe whose batch met a Postgres outage once held a kind's 17
    /// deliveries until the run ended).
    pub(super) fn probe_ended(&self, d: &Delivery) {
        let Some(kind) = kind_of(d) else {
            return;
        };
        if let Some(s) = self.stalls.lock().expect("stalls poisoned").get_mut(&kind) {
            s.probing = false;
        }
    }

    /// A delivery of `d`'s kind went through: the kind flows.
    pub(super) fn unstall(&self, d: &Delivery) {
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
        let unlogged = self.quiet.lock().expect("quiet poisoned").settle();
        if unlogged > 0 {
            tracing::info!(unlogged, "deliveries go through again; {unlogged} failures on infrastructure since the last line were retried with backoff");
        }
    }

    /// Handles a failure: logs it, stalls the kind when Postgres kept the
    /// delivery waiting, and schedules the retry.
    pub(super) fn failed(&self, d: Delivery, failures: u32, e: &ExecError) {
        let slot = d.slot().unwrap_or("").to_owned();
        let entry = d.entry_id.clone();
        let kind = kind_of(&d);
        self.probe_ended(&d);
        // The server refuses writes (SQLSTATE 25006): not the delivery's
        // failure. Intake stops reading at once (the role loop confirms,
        // logs why and says when writes are taken again); this one waits
        // without counting it, so no refusal, however long, leads to a
        // give-up or a dead letter.
        if e.is_read_only() {
            self.writable.set_read_only(true);
            tracing::warn!(%entry, %slot, error = %e, "Postgres refused the write (read-only: a standby in recovery?); nothing was recorded, the delivery waits for a writable primary");
            self.wait_for_writes(d, failures);
            return;
        }
        if matches!(e, ExecError::Busy(_)) {
            let delay = self.jitter(STALL_CAP, 1);
            tracing::debug!(%entry, %slot, retry_in_ms = delay.as_millis() as u64, "slot busy in this worker; retrying later");
            self.schedule(d, failures, delay, false);
            return;
        }
        if let (true, Some(kind)) = (e.is_stall(), kind.as_ref()) {
            let mut stalls = self.stalls.lock().expect("stalls poisoned");
            let strikes = stalls.get(kind).map_or(0, |s| s.strikes) + 1;
            let pause = self.jitter(STALL_CAP, strikes - 1).max(RETRY_BASE);
            stalls.insert(
                kind.clone(),
                Stall {
                    until: Instant::now() + pause,
                    strikes,
                    probing: false,
                },
            );
            drop(stalls);
            let delay = self.jitter(STALL_CAP, u32::MAX);
            match self.quiet.lock().expect("quiet poisoned").line() {
                Some(unlogged) => {
                    tracing::warn!(%entry, %slot, error = %e, %kind, strikes, pause_ms = pause.as_millis() as u64, unlogged, "Postgres kept a delivery waiting; rolled back, its kind pauses and it is retried later ({unlogged} more failures since the last line)")
                }
                None => {
                    tracing::debug!(%entry, %slot, error = %e, %kind, strikes, "Postgres kept a delivery waiting; rolled back, retried later")
                }
            }
            self.schedule(d, failures, delay, true);
            return;
        }
        let failures = failures + 1;
        if failures > RETRY_LIMIT {
            tracing::warn!(%entry, %slot, error = %e, failures, "giving up on this delivery for now; it stays pending and will be reclaimed");
            return;
        }
        let delay = self.jitter(RETRY_CAP, failures - 1);
        match self.quiet.lock().expect("quiet poisoned").line() {
            Some(unlogged) => {
                tracing::warn!(%entry, %slot, error = %e, retry_in_ms = delay.as_millis() as u64, failures, unlogged, "delivery failed on infrastructure; rolled back, retrying later with its batch ({unlogged} more failures since the last line, at most one line per {FAILURE_LOG_EVERY:?})")
            }
            None => {
                tracing::debug!(%entry, %slot, error = %e, retry_in_ms = delay.as_millis() as u64, failures, "delivery failed on infrastructure; rolled back, retrying later")
            }
        }
        self.schedule(d, failures, delay, false);
    }

    /// A group that failed because Postgres is out for everyone (see
    /// [`ExecError::is_outage`]): its deliveries wait one delay together,
    /// so they come due at once and go back through the gate as one batch;
    /// one line at most is logged for them (see [`Quiet`]).
    pub(super) fn failed_together(&self, group: Vec<Delivery>, failures: u32, e: &ExecError) {
        for d in &group {
            self.probe_ended(d);
        }
        let failures = failures + 1;
        if failures > RETRY_LIMIT {
            tracing::warn!(error = %e, deliveries = group.len(), failures, "giving up on these deliveries for now; they stay pending and will be reclaimed");
            return;
        }
        let delay = self.jitter(RETRY_CAP, failures - 1);
        let n = group.len();
        {
            let mut quiet = self.quiet.lock().expect("quiet poisoned");
            if let Some(unlogged) = quiet.line() {
                tracing::warn!(error = %e, deliveries = n, retry_in_ms = delay.as_millis() as u64, failures, unlogged, "Postgres is out (a batch of {n} failed on infrastructure); rolled back, the batch is retried together later ({unlogged} more failures since the last line, at most one line per {FAILURE_LOG_EVERY:?})");
            }
            quiet.unlogged += n.saturating_sub(1) as u64;
        }
        for d in group {
            self.schedule(d, failures, delay, false);
        }
    }

    /// Whether `d`'s kind has drafts at its CMS that this worker has not
    /// mirrored yet (its first background refresh still running).
    pub(super) fn awaits_mirror(&self, d: &Delivery) -> bool {
        kind_of(d).is_some_and(|k| !self.exec.receivers.mirror_ready(&k))
    }

    /// A delivery whose kind's first mirror is not read yet waits for it
    /// outside any permit, then comes back with the others and is gated in
    /// a batch. Handled at once instead, a read of such deliveries went
    /// one by one through the single path, each waiting for the listing.
    pub(super) fn wait_for_mirror(&self, d: Delivery, failures: u32) {
        self.schedule(d, failures, MIRROR_POLL, false);
    }

    /// A delivery of a stalled kind waits without trying.
    pub(super) fn wait_for_kind(&self, d: Delivery, failures: u32) {
        let delay = self.jitter(STALL_CAP, u32::MAX);
        tracing::debug!(entry = %d.entry_id, slot = d.slot().unwrap_or(""), retry_in_ms = delay.as_millis() as u64, "its kind is stalled; waiting");
        self.schedule(d, failures, delay, true);
    }

    /// A delivery that cannot be recorded while the server refuses writes
    /// waits (up to [`STALL_CAP`] at a time, held and kept alive), its
    /// failures not counted.
    pub(super) fn wait_for_writes(&self, d: Delivery, failures: u32) {
        let delay = self.jitter(STALL_CAP, u32::MAX);
        tracing::debug!(entry = %d.entry_id, slot = d.slot().unwrap_or(""), retry_in_ms = delay.as_millis() as u64, "Postgres refuses writes; waiting");
        self.schedule(d, failures, delay, false);
    }

    /// How many deliveries this worker has in hand: held here, or being
    /// handled. Bounded by [`MAX_HELD`] as intake reads.
    pub(super) fn in_hand(&self) -> usize {
        self.held.lock().expect("held poisoned").len()
            + self.in_flight.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Keeps `d`'s entry alive while this worker holds it outside any task
    /// (counted by [`Later::in_hand`]), until [`Later::release`].
    pub(super) fn hold(&self, d: &Delivery) {
        self.held
            .lock()
            .expect("held poisoned")
            .insert((d.partition, d.entry().id.to_owned()));
    }

    /// `d` is no longer held (handed to a task, or back to intake).
    pub(super) fn release(&self, d: &Delivery) {
        self.held
            .lock()
            .expect("held poisoned")
            .remove(&(d.partition, d.entry().id.to_owned()));
    }

    /// Hands `d` back to the intake loop after `delay` (earlier when
    /// `for_kind` and a stalled kind flows again); meanwhile its entry is
    /// in [`Later::held`], kept alive by [`Later::keep_alive`]. On shutdown
    /// it is left pending.
    pub(super) fn schedule(&self, d: Delivery, failures: u32, delay: Duration, for_kind: bool) {
        let (cancel, tx, flowing, held) = (
            self.cancel.clone(),
            self.tx.clone(),
            self.flowing.clone(),
            self.held.clone(),
        );
        self.hold(&d);
        tokio::spawn(async move {
            // Registered before the check below, so a wake-up between the
            // two is not missed.
            let woken = flowing.notified();
            tokio::select! {
                _ = cancel.cancelled() => {}
                _ = woken, if for_kind => {}
                _ = tokio::time::sleep(delay) => {}
            }
            held.lock()
                .expect("held poisoned")
                .remove(&(d.partition, d.entry().id.to_owned()));
            if !cancel.is_cancelled() {
                let _ = tx.send(Retry { d, failures });
            }
        });
    }

    /// Keeps every held delivery's entry alive (no one reclaims it, which
    /// would count a delivery, while this worker still means to run it):
    /// every third of the visibility timeout, one `XCLAIM … JUSTID` per
    /// [`TOUCH_CHUNK`] entries, however many are held. (Touching each
    /// entry from its own timer cost ~17,000 Redis calls a second during a
    /// stall of 20,001 deliveries.) Runs until `cancel`.
    pub(super) async fn keep_alive(self) {
        let every = (self.exec.visibility / 3).max(Duration::from_millis(50));
        loop {
            tokio::select! {
                _ = self.cancel.cancelled() => return,
                _ = tokio::time::sleep(every) => {}
            }
            let ids: Vec<(u16, String)> = self
                .held
                .lock()
                .expect("held poisoned")
                .iter()
                .cloned()
                .collect();
            for chunk in ids.chunks(TOUCH_CHUNK) {
                let chunk: Vec<EntryRef> = chunk
                    .iter()
                    .map(|(partition, id)| EntryRef {
                        partition: *partition,
                        id,
                    })
                    .collect();
                if let Err(e) = self
                    .exec
                    .queue
                    .touch_all(&self.exec.worker_id, &chunk)
                    .await
                {
                    tracing::debug!(error = %e, held = ids.len(), "could not keep held deliveries' entries alive");
                    break;
                }
            }
        }
    }
}

/// Entries kept alive per Redis call by [`Later::keep_alive`].
const TOUCH_CHUNK: usize = 500;
