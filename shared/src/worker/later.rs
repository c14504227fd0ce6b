//! Retries of failed deliveries outside any permit, and stalled kinds:
//! a kind Postgres keeps waiting pauses alone while the others flow.

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
    }

    /// Handles a failure: logs it, stalls the kind when Postgres kept the
    /// delivery waiting, and schedules the retry.
    pub(super) fn failed(&self, d: Delivery, failures: u32, e: &ExecError) {
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
            tracing::warn!(%entry, %slot, error = %e, %kind, strikes, pause_ms = pause.as_millis() as u64, "Postgres kept a delivery waiting; rolled back, its kind pauses and it is retried later");
            self.schedule(d, failures, delay, true);
            return;
        }
        let failures = failures + 1;
        if failures > RETRY_LIMIT {
            tracing::warn!(%entry, %slot, error = %e, failures, "giving up on this delivery for now; it stays pending and will be reclaimed");
            return;
        }
        let delay = self.jitter(RETRY_CAP, failures - 1);
        tracing::warn!(%entry, %slot, error = %e, retry_in_ms = delay.as_millis() as u64, failures, "delivery failed on infrastructure; rolled back, retrying later");
        self.schedule(d, failures, delay, false);
    }

    /// A delivery of a stalled kind waits without trying.
    pub(super) fn wait_for_kind(&self, d: Delivery, failures: u32) {
        let delay = self.jitter(STALL_CAP, u32::MAX);
        tracing::debug!(entry = %d.entry_id, slot = d.slot().unwrap_or(""), retry_in_ms = delay.as_millis() as u64, "its kind is stalled; waiting");
        self.schedule(d, failures, delay, true);
    }

    /// How many deliveries this worker has in hand: held here, or being
    /// handled. Bounded by [`MAX_HELD`] as intake reads.
    pub(super) fn in_hand(&self) -> usize {
        self.held.lock().expect("held poisoned").len()
            + self.in_flight.load(std::sync::atomic::Ordering::SeqCst)
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
        held.lock()
            .expect("held poisoned")
            .insert((d.partition, d.entry_id.clone()));
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
                .remove(&(d.partition, d.entry_id.clone()));
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
