//! The leader's duties while it holds the lease: lease upkeep, promotion
//! of due slots, the slow chores (reconcile, forget) and, with `[notify]`,
//! sending notices (`notices.rs`), as tasks that never wait on each other.

use super::*;

/// How the leader runs its chores (from [`WorkerOptions`]).
#[derive(Debug, Clone)]
pub(super) struct LeaderChores {
    pub(super) reconcile_every: Duration,
    pub(super) forget_after: Duration,
    pub(super) promote_by: crate::queue::PromoteBy,
    /// With `[notify]`: what the notices duty needs.
    pub(super) notices: Option<super::notices::Notices>,
}

/// What the lease loop last published: `Some` while this worker holds the
/// lease (the chores check [`Leading::valid`] themselves before acting).
pub(super) type Authority = watch::Receiver<Option<Leading>>;

/// The leader's duties, as tasks that never wait on each other: lease
/// upkeep, promotion, the slow chores (reconcile, forget) and, with
/// `[notify]`, the notices. A
/// reconcile pass that crawls under load (a busy Postgres, two starved
/// cores) must not delay a renewal past TTL/2 — that made a healthy leader
/// step down again and again and stalled promotion for the whole fleet.
pub(super) async fn leader_loop(
    lease: Lease,
    reconciler: Reconciler,
    queue: Queue,
    clock: SharedClock,
    chores: LeaderChores,
    entropy: SharedEntropy,
    cancel: CancellationToken,
) {
    let (tx, rx) = watch::channel(None);
    let notify = chores
        .notices
        .clone()
        .map(|n| tokio::spawn(super::notices::notices_loop(n, rx.clone(), cancel.clone())));
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
    lease_loop(lease, tx, entropy, cancel).await;
    let _ = promote.await;
    let _ = upkeep.await;
    if let Some(n) = notify {
        let _ = n.await;
    }
}

/// Renews (or tries to take) the lease every `renew_every` and publishes
/// the result; releases it when cancelled.
async fn lease_loop(
    mut lease: Lease,
    tx: watch::Sender<Option<Leading>>,
    entropy: SharedEntropy,
    cancel: CancellationToken,
) {
    let mut backoff = Reconnect::new(entropy.rng());
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
pub(super) fn acting(rx: &Authority) -> Option<Leading> {
    rx.borrow().clone().filter(Leading::valid)
}

/// Sleeps up to `d`, waking early when the lease changes hands; `false`
/// when cancelled.
pub(super) async fn wait_or_change(
    d: Duration,
    rx: &mut Authority,
    cancel: &CancellationToken,
) -> bool {
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
            match promote_due(&queue, &clock, &lead, by).await {
                Ok(Some(head)) => wake = wake.min(head.wake_in(unix_ms(clock.now()))),
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

/// The delayed set's head after a promotion, and the time that promotion
/// was asked to promote up to (both Unix ms).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Head {
    due_ms: i64,
    asked_ms: i64,
}

/// How long a held-back head waits before the next look: Redis's clock
/// is behind this worker's, and looking again at once would spin.
const HELD_BACK: Duration = Duration::from_millis(25);

impl Head {
    /// When to promote again, at `now_ms`.
    ///
    /// A head that came due after the promotion asked (between its call
    /// and this look, a fraction of a millisecond at 200 slots a second)
    /// is promoted at once. It used to wait [`HELD_BACK`] like a head held
    /// back by Redis's clock, and one slot in fifty started about 25 ms
    /// late (`slotgate-bench lag`; docs/BENCHMARKS.md). Only a head that was due
    /// when the promotion asked, and is still there, was held back.
    fn wake_in(self, now_ms: i64) -> Duration {
        if self.due_ms <= self.asked_ms {
            HELD_BACK
        } else {
            Duration::from_millis(u64::try_from(self.due_ms - now_ms).unwrap_or(0))
        }
    }
}

/// Promotes every due slot in bounded batches; returns the head left.
///
/// The tenure is checked again before every batch, not only once before
/// the first: a leader paused (SIGSTOP, a VM stall) between two batches
/// must not send the next one on a lease it no longer holds. Redis's fence
/// refuses such a batch anyway; checking here keeps a stale leader from
/// even asking, except for the one call a pause caught under way.
async fn promote_due(
    queue: &Queue,
    clock: &SharedClock,
    lead: &Leading,
    by: crate::queue::PromoteBy,
) -> Result<Option<Head>, crate::queue::QueueError> {
    loop {
        if !lead.valid() {
            return Ok(None);
        }
        let asked_ms = unix_ms(clock.now());
        match queue
            .promote(asked_ms, PROMOTE_BATCH, Some(&lead.fence), by)
            .await?
        {
            None => {
                tracing::warn!("promotion refused: this worker no longer holds the lease");
                return Ok(None);
            }
            Some(p) if p.moved as usize >= PROMOTE_BATCH => continue,
            Some(p) => return Ok(p.head_ms.map(|due_ms| Head { due_ms, asked_ms })),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_head_ahead_of_now_is_promoted_at_its_time() {
        let head = Head {
            due_ms: 1_040,
            asked_ms: 1_000,
        };
        assert_eq!(head.wake_in(1_001), Duration::from_millis(39));
    }

    #[test]
    fn a_head_that_came_due_after_the_promotion_asked_is_promoted_at_once() {
        let head = Head {
            due_ms: 1_001,
            asked_ms: 1_000,
        };
        assert_eq!(head.wake_in(1_001), Duration::ZERO);
        assert_eq!(head.wake_in(1_003), Duration::ZERO);
    }

    #[test]
    fn a_head_due_when_the_promotion_asked_was_held_back_by_redis() {
        for due_ms in [990, 1_000] {
            let head = Head {
                due_ms,
                asked_ms: 1_000,
            };
            assert_eq!(head.wake_in(1_002), HELD_BACK);
        }
    }
}
