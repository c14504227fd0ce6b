//! Keeps claims and their stream entries alive while their publishes run,
//! and says which of them another worker took over.
//!
//! One heartbeat serves every claim of a batch (a single delivery's is a
//! heartbeat of one): each beat is one fenced `UPDATE` for all the claims
//! still held ([`store::extend_claims`]) and one `XCLAIM … JUSTID` for their
//! entries, so a batch of 256 slow calls costs two round trips per beat,
//! not 512, and no task or timer per claim.

use super::{Claim, Executor};
use crate::queue::EntryRef;
use crate::store;
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub(super) struct Heartbeat {
    stop: tokio_util::sync::CancellationToken,
    task: tokio::task::JoinHandle<()>,
    /// Per claim, in the order given: its heartbeat found it taken over.
    lost: Arc<[AtomicBool]>,
}

impl Heartbeat {
    /// Whether the heartbeat found claim `i` (in the order given) taken
    /// over; it stops renewing a claim once it has.
    pub(super) fn lost(&self, i: usize) -> &AtomicBool {
        &self.lost[i]
    }

    /// Stops it.
    pub(super) async fn stop(mut self) {
        self.stop.cancel();
        let _ = (&mut self.task).await;
    }
}

/// A publish abandoned half-way (its future dropped: a shutdown past the
/// grace period, an aborted task) must stop renewing its claims, or those
/// slots could never be resumed by anyone else while this process lives.
impl Drop for Heartbeat {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// A claim the heartbeat still renews.
struct Held {
    /// Its position among the claims given, for its `lost` flag.
    at: usize,
    /// Its gate row and attempt: the fence.
    row: i64,
    attempt: i32,
    /// Its stream entry, touched with it.
    entry: (u16, String),
}

impl Executor {
    /// Keeps `claims` (each with its stream entry) and their entries alive
    /// while their webhooks run, every `visibility/3`, until stopped.
    pub(super) fn heartbeat(&self, claims: &[(&Claim, EntryRef<'_>)]) -> Heartbeat {
        let lost: Arc<[AtomicBool]> = claims.iter().map(|_| AtomicBool::new(false)).collect();
        let stop = tokio_util::sync::CancellationToken::new();
        let mut held: Vec<Held> = claims
            .iter()
            .enumerate()
            .map(|(at, (c, e))| Held {
                at,
                row: c.row_id,
                attempt: c.attempt,
                entry: (e.partition, e.id.to_owned()),
            })
            .collect();
        let (this, lost2, stop2) = (self.clone(), lost.clone(), stop.clone());
        let every = (self.visibility / 3).max(Duration::from_millis(50));
        let task = tokio::spawn(async move {
            while !held.is_empty() {
                tokio::select! {
                    _ = stop2.cancelled() => return,
                    _ = tokio::time::sleep(every) => {}
                }
                let fence: Vec<(i64, i32)> = held.iter().map(|h| (h.row, h.attempt)).collect();
                match this
                    .deadline(store::extend_claims(
                        &this.pool,
                        &fence,
                        &this.worker_id,
                        this.clock.now(),
                        this.visibility,
                    ))
                    .await
                {
                    Ok(still) => {
                        let still: HashSet<i64> = still.into_iter().collect();
                        held.retain(|h| {
                            let kept = still.contains(&h.row);
                            if !kept {
                                lost2[h.at].store(true, Ordering::Relaxed);
                                tracing::warn!(row = h.row, "heartbeat found the claim taken over");
                            }
                            kept
                        });
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, claims = held.len(), "claim heartbeat failed; will retry")
                    }
                }
                let entries: Vec<EntryRef> = held
                    .iter()
                    .map(|h| EntryRef {
                        partition: h.entry.0,
                        id: &h.entry.1,
                    })
                    .collect();
                if let Err(e) = this.queue.touch_all(&this.worker_id, &entries).await {
                    tracing::warn!(error = %e, entries = entries.len(), "stream heartbeat failed; will retry");
                }
            }
        });
        Heartbeat { stop, task, lost }
    }
}
