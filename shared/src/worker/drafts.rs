//! The background refresh of drafts that live at a kind's CMS (WordPress
//! with `drafts = "pending" | "draft"`): one task per such kind mirrors the
//! site's ready posts into the draft table, then sleeps `refresh_every`
//! counted from the end of the refresh, and again.
//!
//! Why in the background and not before a gate: a listing that takes 6 s
//! held every delivery of the batch behind it, one full sync per delivery
//! (4 slots took 13–48 s, and a record-only slot read in the same batch
//! waited 12.8–21 s). Here a slow or failing CMS delays nobody: the gate
//! picks from the mirror as last synced, and the read before the publish
//! catches a post that is no longer ready. Only the kind's own deliveries
//! wait, and only for the first refresh after the worker starts, so a new
//! worker does not gate on a mirror older than itself
//! ([`Receivers::await_mirror`]).
//!
//! The receiver only lists the CMS's ready posts
//! ([`Receiver::list_drafts`]); writing them into the draft table is this
//! step's ([`sync`], also `planner drafts sync`'s), so no receiver writes
//! to Postgres.

use super::sleep_or_cancel;
use crate::receiver::{CallFailure, Receiver, Receivers};
use crate::store::{self, StoreError, Synced};
use sqlx::PgPool;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Why mirroring a CMS's drafts failed.
#[derive(Debug, thiserror::Error)]
pub enum RefreshError {
    /// Listing the posts failed.
    #[error("listing the CMS's posts: {}", .0.error)]
    Cms(CallFailure),
    /// Storing the mirror failed.
    #[error("storing the draft mirror: {0}")]
    Store(#[from] StoreError),
}

/// Mirrors `kind`'s ready drafts from its CMS into the draft table now
/// ([`store::sync_cms_drafts`]), with the outcome; `Ok(None)` for a kind
/// whose drafts live in slotgate.
pub async fn sync(
    receiver: &dyn Receiver,
    kind: &str,
    pool: &PgPool,
) -> Result<Option<Synced>, RefreshError> {
    let Some(listed) = receiver.list_drafts().await.map_err(RefreshError::Cms)? else {
        return Ok(None);
    };
    Ok(Some(
        store::sync_cms_drafts(pool, kind, &listed.posts, listed.complete).await?,
    ))
}

/// The shortest pause between two refreshes of one kind (`refresh_every =
/// "0"` refreshes as often as this).
const MIN_PAUSE: Duration = Duration::from_secs(1);

/// Starts one refresh task per kind whose drafts live at its CMS; each
/// stops at `cancel`.
pub(super) fn spawn_refreshes(
    receivers: &Receivers,
    pool: &PgPool,
    cancel: &CancellationToken,
) -> Vec<tokio::task::JoinHandle<()>> {
    receivers
        .mirrored_kinds()
        .into_iter()
        .map(|(kind, every)| {
            receivers.mirror_pending(&kind);
            tokio::spawn(refresh_loop(
                receivers.clone(),
                pool.clone(),
                kind,
                every.max(MIN_PAUSE),
                cancel.clone(),
            ))
        })
        .collect()
}

/// Mirrors `kind`'s drafts every `every` until `cancel`. A failure is
/// logged at WARN when it starts and at INFO when the site answers again,
/// not on every pass.
async fn refresh_loop(
    receivers: Receivers,
    pool: PgPool,
    kind: String,
    every: Duration,
    cancel: CancellationToken,
) {
    let Some(route) = receivers.route(&kind).cloned() else {
        return;
    };
    let mut failing = false;
    loop {
        let synced = tokio::select! {
            _ = cancel.cancelled() => break,
            r = sync(&*route.receiver, &kind, &pool) => r,
        };
        match synced {
            Ok(Some(s)) => {
                if failing {
                    tracing::info!(kind, "the CMS's drafts are read again");
                }
                failing = false;
                tracing::debug!(
                    kind,
                    added = s.added,
                    updated = s.updated,
                    unreadied = s.unreadied,
                    "drafts refreshed from the CMS"
                );
            }
            Ok(None) => {}
            Err(e) => {
                if !failing {
                    tracing::warn!(kind, error = %e, "refreshing the drafts from the CMS failed; the gate picks from the drafts as last synced (retried every {every:?})");
                }
                failing = true;
            }
        }
        receivers.mirror_done(&kind);
        if !sleep_or_cancel(every, &cancel).await {
            break;
        }
    }
    // A delivery waiting for the first refresh goes on at shutdown.
    receivers.mirror_done(&kind);
}
