//! The leader lease: `P:leader = "<worker id>:<epoch>"` with a TTL.
//!
//! The lease is an optimisation (one replica does the singleton chores), not
//! the guard — the `publish_slot` unique row is. Still, a leader must not act
//! on stale authority:
//! - the epoch comes from Postgres (`leader_epoch`), so it keeps rising even
//!   when Redis loses everything; `P:epoch` only mirrors it;
//! - it is taken by `acquire.lua` (set if absent, and only while `P:epoch`
//!   is below the taker's epoch, so a worker paused between asking
//!   Postgres for its epoch and taking the lease cannot come back older
//!   than a leader that came after it), renewed and released only by
//!   compare-and-set scripts (`renew.lua`, `release.lua`);
//! - the holder considers itself leader only while its last successful
//!   renewal is younger than TTL/2 *by its own monotonic clock*, so a process
//!   that was paused (SIGSTOP, GC, a stalled VM) finds out before it acts —
//!   and the promotion script re-checks the lease value in Redis anyway.
//!
//! - with the queue spread over partitions (DESIGN 4.19), the lease lives
//!   in one hash slot and each partition's promotion in another, so the
//!   leader copies its lease value into every partition's fence key
//!   (`mirror.lua`, never over a later epoch's copy) each time it takes or
//!   renews the lease, with the lease's TTL; promotion checks that copy.
//!
//! Every Redis call here goes through the queue's timed helpers (a deadline
//! and a named [`QueueError`] per command); the lease's own scripts live
//! beside this file.

use crate::queue::{Queue, QueueError};
use crate::store::{self, StoreError};
use sqlx::PgPool;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Why a lease tick failed. The worker retries soon; meanwhile its
/// authority runs out by itself ([`Lease::fence`] turns `None` once the
/// last renewal is TTL/2 old), so a failure never extends it. Deliveries
/// are unaffected.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    /// Redis did not answer the lease command in time or refused it.
    #[error(transparent)]
    Queue(#[from] QueueError),
    /// Postgres could not hand out the next epoch.
    #[error("postgres: {0}")]
    Store(#[from] StoreError),
}

/// What a tick changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// This worker took the lease, with the new epoch from Postgres.
    Acquired(i64),
    /// This worker held the lease and extended it.
    Renewed,
    /// This worker held the lease and no longer does (expired, taken over
    /// or unreachable); it must stop the leader's chores.
    Lost,
    /// Someone else holds it.
    Following,
}

#[derive(Debug, Clone)]
struct Held {
    value: String,
    epoch: i64,
    renewed_at: Instant,
}

/// The lease as last renewed, handed to the leader's chores.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leading {
    /// The lease value that fences leader writes.
    pub fence: String,
    /// The epoch of this tenure.
    pub epoch: i64,
    renewed_at: Instant,
    ttl: Duration,
}

impl Leading {
    /// Whether the holder may still act: the same rule as [`Lease::fence`]
    /// (last renewal younger than TTL/2 by the monotonic clock).
    pub fn valid(&self) -> bool {
        self.renewed_at.elapsed() < self.ttl / 2
    }
}

/// One worker's view of the lease.
pub struct Lease {
    queue: Queue,
    pool: PgPool,
    worker_id: String,
    ttl: Duration,
    held: Option<Held>,
    acquire: redis::Script,
    renew: redis::Script,
    release: redis::Script,
    mirror: redis::Script,
    unmirror: redis::Script,
    /// The epoch this worker last saw in `P:leader` (its own or another's).
    pub epoch_seen: Arc<AtomicI64>,
}

impl Lease {
    /// A lease not yet held; the first [`Lease::tick`] tries to take it.
    /// `epoch_seen` is shared with the executor, which stamps it on every
    /// execution row.
    pub fn new(
        queue: Queue,
        pool: PgPool,
        worker_id: impl Into<String>,
        ttl: Duration,
        epoch_seen: Arc<AtomicI64>,
    ) -> Self {
        Self {
            queue,
            pool,
            worker_id: worker_id.into(),
            ttl,
            held: None,
            acquire: redis::Script::new(include_str!("acquire.lua")),
            renew: redis::Script::new(include_str!("renew.lua")),
            release: redis::Script::new(include_str!("release.lua")),
            mirror: redis::Script::new(include_str!("mirror.lua")),
            unmirror: redis::Script::new(include_str!("unmirror.lua")),
            epoch_seen,
        }
    }

    /// How long the lease lives in Redis without a renewal.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// How often to tick: TTL/3 while holding the lease (renewal), TTL/6
    /// while following (a cheap GET), so a lease that expired is taken over
    /// well within TTL + 1 s of the holder's death.
    pub fn renew_every(&self) -> Duration {
        if self.held.is_some() {
            self.ttl / 3
        } else {
            self.ttl / 6
        }
    }

    /// The lease value to fence leader writes with, while this worker may
    /// still act as leader: it holds the lease and its last renewal is younger
    /// than TTL/2. `None` otherwise.
    pub fn fence(&self) -> Option<&str> {
        self.held
            .as_ref()
            .filter(|h| h.renewed_at.elapsed() < self.ttl / 2)
            .map(|h| h.value.as_str())
    }

    /// The epoch of the tenure this worker holds, even one too old to act
    /// on (see [`Lease::fence`]); `None` while following.
    pub fn epoch(&self) -> Option<i64> {
        self.held.as_ref().map(|h| h.epoch)
    }

    /// A snapshot of this worker's authority for the chores that run beside
    /// the lease loop (promotion, reconciliation): they must never hold up
    /// renewal, so they get a copy that checks its own age instead of the
    /// lease itself.
    pub fn leading(&self) -> Option<Leading> {
        self.held.as_ref().map(|h| Leading {
            fence: h.value.clone(),
            epoch: h.epoch,
            renewed_at: h.renewed_at,
            ttl: self.ttl,
        })
    }

    /// Renews the lease if held, else tries to take it.
    pub async fn tick(&mut self) -> Result<Change, LeaseError> {
        if let Some(h) = &self.held {
            // Stamp before the call: the lease in Redis lives at most TTL from
            // the moment the command was sent.
            let sent = Instant::now();
            let stale = h.renewed_at.elapsed() >= self.ttl / 2;
            let mut inv = self.renew.prepare_invoke();
            inv.key(self.queue.keys().leader())
                .arg(&h.value)
                .arg(self.ttl.as_millis() as u64);
            let r: Result<i64, _> = self.queue.invoke_within("renew", self.ttl / 3, &inv).await;
            return match r {
                Ok(1) if !stale => {
                    let value = h.value.clone();
                    self.mirror_fence(&value).await;
                    if let Some(h) = &mut self.held {
                        h.renewed_at = sent;
                    }
                    Ok(Change::Renewed)
                }
                Ok(_) => {
                    // Either someone else holds it now, or our own record is
                    // too old to trust (we were paused): step down either way.
                    // Said before the release, which is best effort and may
                    // take its whole deadline: the step-down is decided here.
                    let h = self.held.take().expect("held");
                    tracing::warn!(worker = %self.worker_id, epoch = h.epoch, stale, "leader lease lost; stepping down");
                    if stale {
                        let _ = self.release_value(&h.value).await;
                    }
                    Ok(Change::Lost)
                }
                Err(e) => {
                    if h.renewed_at.elapsed() >= self.ttl / 2 {
                        let h = self.held.take().expect("held");
                        tracing::warn!(worker = %self.worker_id, epoch = h.epoch, error = %e, "cannot renew the leader lease; stepping down");
                        return Ok(Change::Lost);
                    }
                    Err(e.into())
                }
            };
        }
        let current: Option<String> = self
            .queue
            .query(
                "GET leader",
                redis::cmd("GET").arg(self.queue.keys().leader()),
            )
            .await?;
        if let Some(v) = current {
            self.note_epoch(&v);
            return Ok(Change::Following);
        }
        let epoch = store::next_epoch(&self.pool).await?;
        let value = format!("{}:{}", self.worker_id, epoch);
        let sent = Instant::now();
        let mut inv = self.acquire.prepare_invoke();
        inv.key(self.queue.keys().leader())
            .key(self.queue.keys().epoch())
            .arg(&value)
            .arg(epoch)
            .arg(self.ttl.as_millis() as u64);
        let taken: i64 = self.queue.invoke("acquire", &inv).await?;
        if taken == -1 {
            tracing::warn!(worker = %self.worker_id, epoch, "another leader took a later epoch while this worker asked for its own (paused?); not taking the lease");
        }
        if taken != 1 {
            return Ok(Change::Following);
        }
        self.mirror_fence(&value).await;
        self.epoch_seen.store(epoch, Ordering::Relaxed);
        self.held = Some(Held {
            value,
            epoch,
            renewed_at: sent,
        });
        tracing::info!(worker = %self.worker_id, epoch, "became leader");
        Ok(Change::Acquired(epoch))
    }

    fn note_epoch(&self, value: &str) {
        if let Some(e) = value.rsplit(':').next().and_then(|e| e.parse::<i64>().ok()) {
            self.epoch_seen.fetch_max(e, Ordering::Relaxed);
        }
    }

    /// Copies the lease value into every partition's fence key (a
    /// partitioned layout only; the default layout's promotion checks the
    /// lease itself). A copy that cannot be written is logged and tried
    /// again at the next renewal: until then that partition's promotion is
    /// refused (or fenced by the previous copy, which expires with the
    /// lease), which delays its slots but never lets a stale leader act.
    async fn mirror_fence(&self, value: &str) {
        let keys = self.queue.keys();
        if !keys.tagged() {
            return;
        }
        for (p, part) in keys.parts() {
            let mut inv = self.mirror.prepare_invoke();
            inv.key(part.fence())
                .arg(value)
                .arg(self.ttl.as_millis() as u64);
            let r: Result<i64, _> = self
                .queue
                .invoke_within("mirror fence", self.ttl / 3, &inv)
                .await;
            match r {
                Ok(1) => {}
                Ok(_) => tracing::warn!(
                    partition = p,
                    "a later leader's fence holds this partition; not overwriting it"
                ),
                Err(e) => {
                    tracing::warn!(partition = p, error = %e, "could not copy the lease into the partition's fence; retrying at the next renewal")
                }
            }
        }
    }

    async fn release_value(&self, value: &str) -> Result<bool, QueueError> {
        let keys = self.queue.keys();
        if keys.tagged() {
            for (_, part) in keys.parts() {
                let mut inv = self.unmirror.prepare_invoke();
                inv.key(part.fence()).arg(value);
                let _: i64 = self.queue.invoke("unmirror fence", &inv).await?;
            }
        }
        let mut inv = self.release.prepare_invoke();
        inv.key(self.queue.keys().leader()).arg(value);
        let n: i64 = self.queue.invoke("release", &inv).await?;
        Ok(n == 1)
    }

    /// Gives the lease up (clean shutdown), only if still ours.
    pub async fn release(&mut self) -> Result<(), LeaseError> {
        if let Some(h) = self.held.take() {
            let released = self.release_value(&h.value).await?;
            tracing::info!(worker = %self.worker_id, epoch = h.epoch, released, "leader lease released");
        }
        Ok(())
    }
}

/// The lease as `planner status` shows it, read from Redis: who holds it, how
/// long it has left, and the epoch last mirrored to `P:epoch`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseStatus {
    /// The lease value (`"<worker id>:<epoch>"`), `None` without a leader.
    pub holder: Option<String>,
    /// Milliseconds until the lease expires; `None` without a leader (or
    /// without an expiry).
    pub ms_left: Option<i64>,
    /// The epoch in `P:epoch`.
    pub epoch: Option<i64>,
}

impl LeaseStatus {
    /// Reads the lease's keys (three commands, each timed like the queue's).
    pub async fn read(queue: &Queue) -> Result<Self, QueueError> {
        let keys = queue.keys();
        let holder: Option<String> = queue
            .query("GET leader", redis::cmd("GET").arg(keys.leader()))
            .await?;
        let pttl: i64 = queue
            .query("PTTL leader", redis::cmd("PTTL").arg(keys.leader()))
            .await?;
        let epoch: Option<i64> = queue
            .query("GET epoch", redis::cmd("GET").arg(keys.epoch()))
            .await?;
        Ok(Self {
            ms_left: holder.as_ref().map(|_| pttl).filter(|t| *t >= 0),
            holder,
            epoch,
        })
    }
}
