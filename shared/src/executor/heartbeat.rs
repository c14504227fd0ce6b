//! Keeps a claim and its stream entry alive while a publish runs, and
//! says when another worker took the claim over.

use super::{Claim, Executor};
use crate::store::{self};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub(super) struct Heartbeat {
    pub(super) stop: tokio_util::sync::CancellationToken,
    pub(super) task: tokio::task::JoinHandle<()>,
    pub(super) lost: Arc<AtomicBool>,
}

impl Heartbeat {
    /// Stops it; `true` when it saw the claim taken over.
    pub(super) async fn stop(mut self) -> bool {
        self.stop.cancel();
        let _ = (&mut self.task).await;
        self.lost.load(Ordering::Relaxed)
    }
}

/// A publish abandoned half-way (its future dropped: a shutdown past the
/// grace period, an aborted task) must stop renewing its claim, or the slot
/// could never be resumed by anyone else while this process lives.
impl Drop for Heartbeat {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl Executor {
    /// Keeps the claim and the stream entry alive while the webhook runs.
    pub(super) fn heartbeat(&self, claim: &Claim, entry_id: &str) -> Heartbeat {
        let lost = Arc::new(AtomicBool::new(false));
        let stop = tokio_util::sync::CancellationToken::new();
        let (this, claim, entry, lost2, stop2) = (
            self.clone(),
            claim.clone(),
            entry_id.to_owned(),
            lost.clone(),
            stop.clone(),
        );
        let every = (self.visibility / 3).max(Duration::from_millis(50));
        let task = tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = stop2.cancelled() => return,
                    _ = tokio::time::sleep(every) => {}
                }
                match this
                    .deadline(store::extend_claim(
                        &this.pool,
                        claim.row_id,
                        &this.worker_id,
                        claim.attempt,
                        this.clock.now(),
                        this.visibility,
                    ))
                    .await
                {
                    Ok(true) => {}
                    Ok(false) => {
                        lost2.store(true, Ordering::Relaxed);
                        tracing::warn!(row = claim.row_id, "heartbeat found the claim taken over");
                        return;
                    }
                    Err(e) => tracing::warn!(error = %e, "claim heartbeat failed; will retry"),
                }
                if let Err(e) = this.queue.touch(&this.worker_id, &entry).await {
                    tracing::warn!(error = %e, "stream heartbeat failed; will retry");
                }
            }
        });
        Heartbeat { stop, task, lost }
    }
}
