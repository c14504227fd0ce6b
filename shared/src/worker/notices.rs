//! The leader's notices duty: sends the outbox's pending notices
//! (`crate::notice`) to `[notify] url`, signed, and records how each send
//! ended.
//!
//! Why the leader and why from an outbox: the event was written with its
//! outcome, so this loop may die, be cut off or run twice at a change of
//! leader without losing an event or sending one under a new id — a
//! receiver that dedupes by `webhook-id` shows each once. And no delivery
//! waits for it: a receiver that hangs or refuses holds only this loop
//! (each send has [`SEND_TIMEOUT`], [`IN_FLIGHT`] at once).
//!
//! A send that fails (no connection, a timeout, any status but 2xx,
//! redirects included) is tried again after full-jitter backoff
//! ([`BASE`], [`CAP`]); after [`MAX_ATTEMPTS`] it is given up, logged at
//! ERROR and kept in the table (`state = 'gave_up'`, `last_error`).

use super::leader::{acting, wait_or_change, Authority};
use crate::config::NotifyConfig;
use crate::notice::Notice;
use crate::retry::{full_jitter, SharedEntropy};
use crate::store::{self, Sent};
use futures_util::StreamExt;
use sqlx::PgPool;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The longest one send may take, connecting included.
pub(super) const SEND_TIMEOUT: Duration = Duration::from_secs(10);

/// Sends in flight at once.
pub(super) const IN_FLIGHT: usize = 8;

/// Sends per attempt at most, before the next is given up (about 15 hours
/// of retries at most with [`BASE`] and [`CAP`]).
pub(super) const MAX_ATTEMPTS: i32 = 16;

/// The first backoff window's ceiling.
pub(super) const BASE: Duration = Duration::from_secs(10);

/// The largest backoff window.
pub(super) const CAP: Duration = Duration::from_secs(2 * 3600);

/// Notices read per round.
const ROUND: i64 = 64;

/// What the notices duty needs besides the lease.
#[derive(Debug, Clone)]
pub(super) struct Notices {
    pub(super) pool: PgPool,
    pub(super) notify: NotifyConfig,
    pub(super) entropy: SharedEntropy,
}

/// While leading: sends what is due, looking again every second.
pub(super) async fn notices_loop(n: Notices, mut rx: Authority, cancel: CancellationToken) {
    let client = match reqwest::Client::builder()
        .user_agent(concat!("slotgate/", env!("CARGO_PKG_VERSION")))
        .timeout(SEND_TIMEOUT)
        // A redirect is not a delivery: the receiver's address is the
        // operator's, not the answer's.
        .redirect(reqwest::redirect::Policy::none())
        .build()
    {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "cannot build the notices' HTTP client; no notice will be sent");
            return;
        }
    };
    loop {
        if acting(&rx).is_some() {
            tokio::select! {
                _ = cancel.cancelled() => break,
                _ = round(&n, &client) => {}
            }
        }
        if !wait_or_change(Duration::from_secs(1), &mut rx, &cancel).await {
            break;
        }
    }
}

/// Sends every notice due now, [`IN_FLIGHT`] at a time, and records each.
async fn round(n: &Notices, client: &reqwest::Client) {
    let due = match store::due_notices(&n.pool, ROUND).await {
        Ok(d) => d,
        Err(e) => {
            tracing::warn!(error = %e, "reading due notices failed; will retry");
            return;
        }
    };
    let Some(db_now) = due.db_now else { return };
    futures_util::stream::iter(due.notices)
        .for_each_concurrent(IN_FLIGHT, |notice| async move {
            let sent = if n.notify.sends(notice.event) {
                let tried = send(client, &n.notify, &notice, db_now.timestamp()).await;
                settle(n, &notice, tried)
            } else {
                Sent::Filtered
            };
            if let Err(e) = store::settle_notice(&n.pool, notice.id, &sent).await {
                // Left pending: sent again, under the same id.
                tracing::warn!(msg_id = %notice.msg_id, error = %e, "recording a notice's send failed; it will be sent again");
            }
        })
        .await;
}

/// What a failed or successful try means for the outbox row.
fn settle(n: &Notices, notice: &Notice, tried: Result<(), String>) -> Sent {
    let event = notice.event.as_str();
    match tried {
        Ok(()) => {
            tracing::info!(msg_id = %notice.msg_id, event, "notice sent");
            Sent::Delivered
        }
        Err(error) if notice.attempts + 1 >= MAX_ATTEMPTS => {
            tracing::error!(msg_id = %notice.msg_id, event, attempts = notice.attempts + 1, error, "notice given up: the receiver kept failing");
            Sent::GaveUp { error }
        }
        Err(error) => {
            let attempt = u32::try_from(notice.attempts).unwrap_or(0);
            let after = full_jitter(&mut n.entropy.rng(), BASE, CAP, attempt);
            tracing::warn!(msg_id = %notice.msg_id, event, attempts = notice.attempts + 1, retry_in_ms = after.as_millis() as u64, error, "notice send failed; will retry");
            Sent::Retry { after, error }
        }
    }
}

/// One signed POST of `notice`; `Err` says why it did not land (never a
/// secret: the URL carries none, and the key is not in any message).
async fn send(
    client: &reqwest::Client,
    notify: &NotifyConfig,
    notice: &Notice,
    timestamp: i64,
) -> Result<(), String> {
    let body = notice.body();
    let signature = notify.signer.sign(&notice.msg_id, timestamp, &body);
    let answer = client
        .post(&notify.url)
        .header("content-type", "application/json")
        .header("webhook-id", &notice.msg_id)
        .header("webhook-timestamp", timestamp.to_string())
        .header("webhook-signature", signature)
        .body(body)
        .send()
        .await
        .map_err(|e| e.without_url().to_string())?;
    let status = answer.status();
    if status.is_success() {
        Ok(())
    } else {
        Err(format!("HTTP {}", status.as_u16()))
    }
}
