//! Retries of failed deliveries outside any permit, and stalled kinds:
//! a kind Postgres keeps waiting pauses alone while the others flow.

use super::*;

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

    /// Hands `d` back to the intake loop after `delay` (earlier when
    /// `for_kind` and a stalled kind flows again), keeping its entry alive
    /// meanwhile. On shutdown it is left pending.
    pub(super) fn schedule(&self, d: Delivery, failures: u32, delay: Duration, for_kind: bool) {
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
