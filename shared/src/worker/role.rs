//! What the Postgres server behind `DATABASE_URL` is, as this worker last
//! saw it: a primary that takes writes, or a standby (or a read-only
//! primary) that refuses them; and whether its commits wait for a
//! synchronous standby.
//!
//! Why a worker watches: after a failover the address may lead to a server
//! still in recovery (a virtual IP moved too early, a DNS name cached, a
//! pooler routing to the standby). Every write there fails with SQLSTATE
//! 25006. Counted as ordinary failures, a delivery would give up after
//! [`RETRY_LIMIT`] tries and, reclaimed again and again, end as a dead
//! letter (`max_deliveries`) though nothing was wrong with it. Instead
//! intake reads nothing while the server refuses writes, a delivery that
//! met the refusal waits without counting it as a failure, the log says
//! why once (ERROR), and `/readyz` answers 503 naming the cause. The loop
//! looks again every second until the server takes writes.
//!
//! The same look names a primary without a synchronous standby (WARN, at
//! start and whenever that changes): such a primary's failover can lose the
//! last committed gate rows (docs/production.md, "Postgres high availability"). While
//! it holds (and until the first answer), kinds with `probe_url` look a
//! fresh claim up before its first send (`Receivers::set_gate_may_forget`).

use super::*;
use crate::store::Durability;
use std::sync::atomic::{AtomicBool, Ordering};

/// How often a worker asks Postgres what it is, while it takes writes.
pub const ROLE_EVERY: Duration = Duration::from_secs(5);

/// How often it asks while the server refuses writes: intake waits for
/// this answer, so it is short.
pub const ROLE_EVERY_READ_ONLY: Duration = Duration::from_secs(1);

/// Whether the server refuses writes, shared by intake, the retries and the
/// watching loop.
#[derive(Debug, Default)]
pub(super) struct Writable {
    read_only: AtomicBool,
    /// Wakes intake when the server takes writes again.
    back: tokio::sync::Notify,
}

impl Writable {
    /// The server refused writes when last asked (or a write just failed
    /// with SQLSTATE 25006).
    pub(super) fn read_only(&self) -> bool {
        self.read_only.load(Ordering::SeqCst)
    }

    /// Records what was seen; wakes intake when writes are possible again.
    pub(super) fn set_read_only(&self, read_only: bool) {
        let was = self.read_only.swap(read_only, Ordering::SeqCst);
        if was && !read_only {
            self.back.notify_waiters();
        }
    }

    /// Waits until the server takes writes, `cancel` fires, or `at_most`
    /// passed (intake then looks again).
    pub(super) async fn wait(&self, at_most: Duration, cancel: &CancellationToken) {
        let back = self.back.notified();
        if !self.read_only() {
            return;
        }
        tokio::select! {
            _ = back => {}
            _ = cancel.cancelled() => {}
            _ = tokio::time::sleep(at_most) => {}
        }
    }
}

/// Asks Postgres what it is every [`ROLE_EVERY`] ([`ROLE_EVERY_READ_ONLY`]
/// while it refuses writes), until `cancel`; logs each change of the
/// answer once: ERROR when writes are refused, WARN for a primary without a
/// synchronous standby, INFO when writes are taken again.
pub(super) async fn role_loop(
    pool: PgPool,
    receivers: Receivers,
    writable: Arc<Writable>,
    worker_id: String,
    deadline: Duration,
    cancel: CancellationToken,
) {
    let mut last: Option<Durability> = None;
    loop {
        match tokio::time::timeout(deadline, store::server_role(&pool)).await {
            Ok(Ok(role)) => {
                let now = role.durability();
                if last.as_ref() != Some(&now) {
                    report(&worker_id, last.as_ref(), &now);
                }
                writable.set_read_only(!now.writable());
                receivers.set_gate_may_forget(!matches!(now, Durability::Synchronous { .. }));
                last = Some(now);
            }
            // Postgres down or silent: every delivery says so itself.
            Ok(Err(e)) => tracing::debug!(error = %e, "could not ask Postgres what it is"),
            Err(_) => tracing::debug!("asking Postgres what it is timed out"),
        }
        let every = if writable.read_only() {
            ROLE_EVERY_READ_ONLY
        } else {
            ROLE_EVERY
        };
        if !sleep_or_cancel(every, &cancel).await {
            return;
        }
    }
}

/// The log line of a changed answer.
fn report(worker: &str, before: Option<&Durability>, now: &Durability) {
    let was_writable = before.is_none_or(Durability::writable);
    match (now.warning(), now.writable()) {
        (Some(w), false) => tracing::error!(
            %worker,
            "Postgres refuses writes: {w}. Nothing can be recorded: intake reads no delivery until \
             the server takes writes (asked again every {} s); deliveries in hand wait, none is \
             failed for it",
            ROLE_EVERY_READ_ONLY.as_secs()
        ),
        (warning, true) => {
            if !was_writable {
                tracing::info!(%worker, "Postgres takes writes again; intake resumes");
            }
            match (warning, now) {
                (Some(w), _) => tracing::warn!(
                    %worker,
                    "{w}. Meanwhile kinds with probe_url look every publish up before its first send"
                ),
                (None, Durability::Synchronous { level, standbys }) => tracing::info!(
                    %worker,
                    standbys,
                    synchronous_commit = %level,
                    "Postgres commits wait for a synchronous standby: a failover to it loses no acknowledged gate row"
                ),
                (None, _) => {}
            }
        }
        (None, false) => {}
    }
}
