//! The Redis side: transport only, never the source of truth.
//!
//! Every key is built by [`KeySpace`]; every multi-step change is one Lua
//! script (`*.lua` beside this file) or one MULTI, so a crash never leaves a
//! half-moved slot. Redis may be flushed at any time: the consumer group is
//! recreated on `NOGROUP`, and the leader's reconciler re-delivers whatever
//! Postgres says is planned and unfinished.
//!
//! Anyone with `redis-cli` can write to these keys, so nothing read from
//! them is trusted:
//! - entries come back packed, every item with its length (`cut.lua`), and
//!   are read entry by entry; an entry whose bytes are wrong becomes a
//!   [`Delivery`] with a [`Defect`] (the executor records it
//!   `failed/bad_message`), never an error that fails the read of the
//!   entries around it;
//! - every string kept from an entry is bounded ([`crate::untrusted`]), so
//!   logs, rows and dead letters copy at most a few hundred bytes of it;
//! - a stream Redis refuses to add to (its id space used up, or the key
//!   replaced by another type) is moved aside and recreated by the first
//!   writer that finds it (`stream.lua`);
//! - `P:dead` is capped, and the leader forgets consumers and workers that
//!   are long gone ([`Queue::forget_gone`]).

mod bells;
mod connect;
mod dead_letter;
mod delivery;
mod keys;
mod packed;
mod workers;

pub use connect::{
    pool, pool_with, PoolError, RedisMode, RedisOptions, RedisPool, SentinelSpec, Topology,
};
pub use dead_letter::DeadLetter;
use delivery::bytes;
pub use delivery::{recorded_entry_id, Defect, Delivery, EntryRef};
pub use keys::{aside_glob, KeySpace, PartitionKeys};
use packed::{unpack_reply, Packed};
pub use workers::Forgotten;

use crate::untrusted;
use redis::{FromRedisValue, Value};
use std::collections::{HashMap, HashSet};
use std::ops::ControlFlow;
use std::time::Duration;

/// The consumer group every worker reads with.
pub const GROUP: &str = "workers";

/// Longest `slot` value accepted. A slot key is at most about 90 bytes
/// (a 64-byte kind, a date, a number); anything longer is refused before it
/// is parsed or copied.
pub const MAX_SLOT_BYTES: usize = 128;

/// Bytes a worker is handed of any one field name or value of an entry;
/// the rest stays in Redis (`cut.lua`). Ample for every field slotgate
/// writes (the longest, `slot`, is at most [`MAX_SLOT_BYTES`]).
pub const MAX_FIELD_BYTES: usize = 256;

/// Field pairs a worker is handed of any one entry (a delivery has four).
pub const MAX_FIELDS: usize = 8;

/// Default cap on the length of `P:dead` (`worker --max-dead-letters`).
pub const DEFAULT_DEAD_LETTER_CAP: u64 = 10_000;

/// Redis errors, with the operation that failed.
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    /// Redis answered with an error (or the connection broke mid-command).
    #[error("redis {op}: {source}")]
    Redis {
        /// The command or script that failed, for the log line.
        op: &'static str,
        /// What Redis or the client said.
        #[source]
        source: redis::RedisError,
    },
    /// No connection could be had from the pool (Redis down or unreachable).
    #[error("redis pool: {0}")]
    Pool(#[from] deadpool_redis::PoolError),
    /// The named command got no answer within its deadline; a stalled
    /// Redis must not stall the caller.
    #[error("redis {0}: timed out")]
    Timeout(&'static str),
    /// The named command answered with something of the wrong shape (a key
    /// overwritten by hand, say), shown bounded.
    #[error("redis {0}: unexpected reply {1}")]
    Reply(&'static str, String),
}

fn op(op: &'static str) -> impl FnOnce(redis::RedisError) -> QueueError {
    move |source| QueueError::Redis { op, source }
}

fn has_code(e: &QueueError, code: &str) -> bool {
    matches!(e, QueueError::Redis { source, .. } if source.code() == Some(code) || source.to_string().contains(code))
}

fn is_nogroup(e: &QueueError) -> bool {
    has_code(e, "NOGROUP")
}

/// Counts for `planner status` and the metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Depths {
    /// Planned slots waiting in the delayed set for their time.
    pub delayed: u64,
    /// Entries in the stream not yet handed to any worker.
    pub ready: u64,
    /// Entries handed out and not yet acknowledged.
    pub pending: u64,
    /// Age of the oldest pending entry, from its stream id.
    pub oldest_pending_ms: Option<u64>,
    /// Dead letters kept in `P:dead`, waiting for an operator.
    pub dead: u64,
    /// Each partition's own depths, in order, when there is more than one
    /// (the fields above are their sums, the oldest pending their oldest).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub partitions: Vec<Depths>,
}

/// Whose clock decides that a slot in the delayed set is due.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PromoteBy {
    /// The caller's time, but never past Redis's own clock (`TIME`): a
    /// leader whose clock runs ahead cannot promote a slot early.
    #[default]
    AtMostServerTime,
    /// The caller's time alone: for tests that drive time with an injected
    /// clock (into the future, too).
    CallerTime,
}

/// What one [`Queue::promote`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Promotion {
    /// Slots moved into the stream.
    pub moved: u64,
    /// The delayed set's earliest due time after the move (Unix ms), read
    /// in the same atomic step; `None` when the set is empty.
    pub head_ms: Option<i64>,
}

/// How many members one `ZMSCORE` asks about ([`Queue::queued_among`]):
/// a reply of at most this many scores.
const SCORES_PER_CALL: usize = 1000;

/// The queue under one prefix.
#[derive(Clone)]
pub struct Queue {
    pool: RedisPool,
    keys: KeySpace,
    scripts: std::sync::Arc<Scripts>,
    dead_cap: u64,
    /// The partitions' bell watchers (more than one partition only),
    /// started by the first read that waits.
    bells: std::sync::Arc<bells::Bells>,
    /// Where the next read starts, so no partition is always read last.
    turn: std::sync::Arc<std::sync::atomic::AtomicU16>,
}

/// The Lua scripts; those that add to a stream start with `stream.lua`.
struct Scripts {
    promote: redis::Script,
    take: redis::Script,
    range: redis::Script,
    reclaim: redis::Script,
    deliver: redis::Script,
    dead: redis::Script,
    ensure: redis::Script,
    forget: redis::Script,
    forget_workers: redis::Script,
    ack: redis::Script,
}

impl std::fmt::Debug for Queue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queue")
            .field("keys", &self.keys)
            .finish_non_exhaustive()
    }
}

/// Upper bound on any single Redis command (BLOCKing reads add their block
/// time): a Redis that stopped answering must surface as an error.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(5);

/// Members per `ZADD` when scheduling.
const SCHEDULE_ZADD: usize = 500;

/// Slots per pipeline of `ZADD`s when scheduling (one round trip each).
const SCHEDULE_PIPELINE: usize = 10_000;

/// `items` (each with its partition) grouped by partition, partitions in
/// order, empty ones left out; an item naming a partition past `n` (none
/// of slotgate's own) is dropped.
fn grouped<T>(n: u16, items: impl Iterator<Item = (u16, T)>) -> Vec<(u16, Vec<T>)> {
    let mut groups: Vec<Vec<T>> = (0..n).map(|_| Vec::new()).collect();
    for (p, item) in items {
        if let Some(g) = groups.get_mut(usize::from(p)) {
            g.push(item);
        }
    }
    groups
        .into_iter()
        .enumerate()
        .filter(|(_, g)| !g.is_empty())
        .map(|(p, g)| (p as u16, g))
        .collect()
}

/// Runs `f` within the command timeout plus `extra`.
async fn timed<T>(
    what: &'static str,
    extra: Duration,
    f: impl std::future::Future<Output = Result<T, QueueError>>,
) -> Result<T, QueueError> {
    within(what, COMMAND_TIMEOUT + extra, f).await
}

/// Runs `f` within `limit`; running out is [`QueueError::Timeout`].
async fn within<T>(
    what: &'static str,
    limit: Duration,
    f: impl std::future::Future<Output = Result<T, QueueError>>,
) -> Result<T, QueueError> {
    tokio::time::timeout(limit, f)
        .await
        .map_err(|_| QueueError::Timeout(what))?
}

impl Queue {
    /// The queue under `keys` over `pool`, dead letters capped at
    /// [`DEFAULT_DEAD_LETTER_CAP`] until [`Queue::with_dead_letter_cap`].
    /// On a Redis Cluster the keys take their hash-tagged names whatever
    /// `keys` says (see [`KeySpace`]).
    pub fn new(pool: RedisPool, keys: KeySpace) -> Self {
        let keys = if pool.is_cluster() && !keys.tagged() {
            KeySpace::partitioned(keys.prefix(), keys.partitions(), true)
        } else {
            keys
        };
        if keys.partitions() > 1 {
            // One connection per partition for its bell watcher.
            pool.grow(usize::from(keys.partitions()));
        }
        Self {
            bells: std::sync::Arc::new(bells::Bells::default()),
            turn: std::sync::Arc::default(),
            pool,
            keys,
            scripts: std::sync::Arc::new(Scripts {
                promote: redis::Script::new(concat!(
                    include_str!("stream.lua"),
                    include_str!("promote.lua")
                )),
                take: redis::Script::new(concat!(
                    include_str!("cut.lua"),
                    include_str!("take.lua")
                )),
                range: redis::Script::new(concat!(
                    include_str!("cut.lua"),
                    include_str!("range.lua")
                )),
                reclaim: redis::Script::new(concat!(
                    include_str!("cut.lua"),
                    include_str!("reclaim.lua")
                )),
                deliver: redis::Script::new(concat!(
                    include_str!("stream.lua"),
                    include_str!("deliver.lua")
                )),
                dead: redis::Script::new(concat!(
                    include_str!("stream.lua"),
                    include_str!("dead.lua")
                )),
                ensure: redis::Script::new(concat!(
                    include_str!("stream.lua"),
                    include_str!("ensure.lua")
                )),
                forget: redis::Script::new(include_str!("forget.lua")),
                forget_workers: redis::Script::new(include_str!("forget_workers.lua")),
                ack: redis::Script::new(include_str!("ack.lua")),
            }),
            dead_cap: DEFAULT_DEAD_LETTER_CAP,
        }
    }

    /// Caps `P:dead` at about `cap` entries (`XADD … MAXLEN ~ cap`: Redis
    /// trims whole stream nodes, so it may hold up to one node more).
    pub fn with_dead_letter_cap(mut self, cap: u64) -> Self {
        self.dead_cap = cap.max(1);
        self
    }

    /// Runs a prepared script within the usual command timeout.
    pub(crate) async fn invoke<T: FromRedisValue>(
        &self,
        what: &'static str,
        inv: &redis::ScriptInvocation<'_>,
    ) -> Result<T, QueueError> {
        self.invoke_within(what, COMMAND_TIMEOUT, inv).await
    }

    /// Runs a prepared script within `limit`, with the queue's error mapping.
    /// The crate's other Redis users (the lease) call Redis only through this
    /// and [`Queue::query`], so every command has a deadline and a named
    /// error; no raw connection leaves this module.
    pub(crate) async fn invoke_within<T: FromRedisValue>(
        &self,
        what: &'static str,
        limit: Duration,
        inv: &redis::ScriptInvocation<'_>,
    ) -> Result<T, QueueError> {
        within(what, limit, async {
            let mut c = self.conn().await?;
            inv.invoke_async(&mut c).await.map_err(op(what))
        })
        .await
    }

    /// Reports a stream a script moved aside (`aside` empty: none).
    fn repaired(&self, by: &'static str, aside: &str) {
        if aside.is_empty() {
            return;
        }
        let stream = keys::aside_of(aside);
        tracing::warn!(%stream, moved_to = %aside, by, "Redis refused to add to the stream (its last possible id used, or the key holds another type); moved it aside for inspection and recreated it with the entries it held (under their own ids; the entry at the last id stays aside)");
        crate::telemetry::stream_repair(if stream.ends_with(":dead") {
            "dead"
        } else {
            "ready"
        });
    }

    /// A handle for a bell watcher: the same pool and keys, but not the
    /// watchers' shared state, so the watchers end when every other handle
    /// is dropped.
    fn clone_for_watcher(&self) -> Queue {
        Queue {
            pool: self.pool.clone(),
            keys: self.keys.clone(),
            scripts: self.scripts.clone(),
            dead_cap: self.dead_cap,
            bells: std::sync::Arc::default(),
            turn: self.turn.clone(),
        }
    }

    /// Runs a blocking command (one that waits up to `block` on the
    /// server) within the command timeout plus `block`.
    async fn blocking<T: FromRedisValue>(
        &self,
        what: &'static str,
        block: Duration,
        cmd: &redis::Cmd,
    ) -> Result<T, QueueError> {
        timed(what, block, async {
            let mut c = self.conn().await?;
            cmd.query_async(&mut c).await.map_err(op(what))
        })
        .await
    }

    /// The key names this queue uses.
    pub fn keys(&self) -> &KeySpace {
        &self.keys
    }

    /// A pooled connection; private, so that every command goes through the
    /// timed helpers.
    async fn conn(&self) -> Result<connect::Conn, QueueError> {
        Ok(self.pool.get().await?)
    }

    /// Runs one command within the usual command timeout, with the queue's
    /// error mapping (see [`Queue::invoke_within`]).
    pub(crate) async fn query<T: FromRedisValue>(
        &self,
        what: &'static str,
        cmd: &redis::Cmd,
    ) -> Result<T, QueueError> {
        timed(what, Duration::ZERO, async {
            let mut c = self.conn().await?;
            cmd.query_async(&mut c).await.map_err(op(what))
        })
        .await
    }

    /// Puts slots into the delayed set of their partition; a member already
    /// there keeps its score (`NX`), so a re-plan never moves a due time.
    /// The `ZADD`s go in pipelines, so a large plan costs a round trip per
    /// `SCHEDULE_PIPELINE` slots rather than per `ZADD`.
    pub async fn schedule(&self, slots: &[(String, i64)]) -> Result<(), QueueError> {
        for (p, part) in self.by_partition(slots.iter(), |(key, _)| key) {
            let delayed = self.keys.part(p).delayed();
            for group in part.chunks(SCHEDULE_PIPELINE) {
                let mut pipe = redis::pipe();
                for chunk in group.chunks(SCHEDULE_ZADD) {
                    let cmd = pipe.cmd("ZADD").arg(&delayed).arg("NX");
                    for (key, due_ms) in chunk {
                        cmd.arg(*due_ms).arg(key);
                    }
                    cmd.ignore();
                }
                timed("ZADD delayed", Duration::ZERO, async {
                    let mut c = self.conn().await?;
                    pipe.query_async::<()>(&mut c)
                        .await
                        .map_err(op("ZADD delayed"))
                })
                .await?;
            }
        }
        Ok(())
    }

    /// `items` grouped by the partition of their slot key (`key` picks it
    /// out), partitions in order; one group in the default layout.
    fn by_partition<'a, T: 'a>(
        &self,
        items: impl Iterator<Item = &'a T>,
        key: impl Fn(&'a T) -> &'a str,
    ) -> Vec<(u16, Vec<&'a T>)> {
        grouped(
            self.keys.partitions(),
            items.map(|i| (self.keys.partition_of(key(i)), i)),
        )
    }

    /// Takes slots out of the delayed set (a slot cancelled before it was
    /// due). One already promoted to the stream stays there; the gate row
    /// its cancellation wrote settles it as `slot_taken`.
    pub async fn unschedule(&self, slots: &[String]) -> Result<(), QueueError> {
        for (p, part) in self.by_partition(slots.iter(), |s| s) {
            let delayed = self.keys.part(p).delayed();
            timed("ZREM delayed", Duration::ZERO, async {
                let mut c = self.conn().await?;
                redis::cmd("ZREM")
                    .arg(&delayed)
                    .arg(&part)
                    .query_async::<()>(&mut c)
                    .await
                    .map_err(op("ZREM delayed"))
            })
            .await?;
        }
        Ok(())
    }

    /// Adds a delivery to its partition's ready stream now, repairing a
    /// broken stream first (see `stream.lua`); returns the entry's id as
    /// it will be recorded ([`Delivery::entry_id`]).
    pub async fn deliver(
        &self,
        slot: &str,
        caller: &str,
        now_ms: i64,
    ) -> Result<String, QueueError> {
        self.deliver_with(slot, caller, now_ms, &[]).await
    }

    /// [`Queue::deliver`] with extra fields (`early=1` from `planner
    /// trigger --early`).
    pub async fn deliver_with(
        &self,
        slot: &str,
        caller: &str,
        now_ms: i64,
        extra: &[(&str, &str)],
    ) -> Result<String, QueueError> {
        let p = self.keys.partition_of(slot);
        let part = self.keys.part(p);
        let mut inv = self.scripts.deliver.prepare_invoke();
        inv.key(part.ready())
            .key(part.bell())
            .arg(GROUP)
            .arg(slot)
            .arg(caller)
            .arg(now_ms);
        for (name, value) in extra {
            inv.arg(*name).arg(*value);
        }
        let (id, aside): (String, String) = self.invoke("deliver", &inv).await?;
        self.repaired("deliver", &aside);
        // As the worker will record it (see `Delivery::entry_id`).
        Ok(recorded_entry_id(&id, p))
    }

    /// Moves at most `batch` due slots of each partition into its stream,
    /// one atomic step per partition. `fence` is the caller's lease value;
    /// `None` promotes unfenced. Returns `None` when the fence no longer
    /// holds (in any partition: the leader then stops).
    pub async fn promote(
        &self,
        now_ms: i64,
        batch: usize,
        fence: Option<&str>,
        by: PromoteBy,
    ) -> Result<Option<Promotion>, QueueError> {
        let mut total = Promotion {
            moved: 0,
            head_ms: None,
        };
        for (_, part) in self.keys.parts() {
            let mut inv = self.scripts.promote.prepare_invoke();
            inv.key(part.delayed())
                .key(part.ready())
                .key(part.fence())
                .key(part.bell())
                .arg(now_ms)
                .arg(batch)
                .arg(fence.unwrap_or(""))
                .arg(GROUP)
                .arg(match by {
                    PromoteBy::AtMostServerTime => "1",
                    PromoteBy::CallerTime => "0",
                });
            let (n, aside, head): (i64, String, String) = self.invoke("promote", &inv).await?;
            self.repaired("promote", &aside);
            let Ok(moved) = u64::try_from(n) else {
                return Ok(None);
            };
            total.moved += moved;
            // A score is written by slotgate in whole ms; a hand-written
            // one that is not a number reads as no head, and the leader
            // looks again within a second anyway.
            if let Some(h) = head.parse::<f64>().ok().map(|s| s as i64) {
                total.head_ms = Some(total.head_ms.map_or(h, |t: i64| t.min(h)));
            }
        }
        Ok(Some(total))
    }

    /// Creates every partition's stream and group from id 0 if either is
    /// missing, so nothing added after a flush is skipped; moves a broken
    /// stream aside first (see `stream.lua`).
    pub async fn ensure_group(&self) -> Result<(), QueueError> {
        for p in 0..self.keys.partitions() {
            self.ensure_group_of(p).await?;
        }
        Ok(())
    }

    async fn ensure_group_of(&self, p: u16) -> Result<(), QueueError> {
        let mut inv = self.scripts.ensure.prepare_invoke();
        inv.key(self.keys.part(p).ready()).arg(GROUP);
        let aside: String = self.invoke("ensure group", &inv).await?;
        self.repaired("ensure group", &aside);
        Ok(())
    }

    /// Runs `f`, recreating partition `p`'s group once if Redis answered
    /// `NOGROUP` (or repairing the stream if the key holds another type).
    async fn with_group<T, F, Fut>(&self, p: u16, f: F) -> Result<T, QueueError>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<T, QueueError>>,
    {
        match f().await {
            Err(e) if is_nogroup(&e) || has_code(&e, "WRONGTYPE") => {
                tracing::warn!(stream = %self.keys.part(p).ready(), error = %e, "consumer group or stream missing (Redis flushed or restarted?); recreating it from id 0");
                self.ensure_group_of(p).await?;
                f().await
            }
            r => r,
        }
    }

    /// Reads up to `count` new deliveries for `consumer`, blocking up to
    /// `block`. An entry with wrong bytes comes back with its [`Defect`];
    /// an oversized one cut to [`MAX_FIELD_BYTES`] per field, in Redis
    /// (`take.lua`), so its bytes never reach this process whole.
    ///
    /// The read itself cannot block (a script does not); when it finds
    /// nothing, this waits on the bell, which every script that adds a
    /// delivery rings, from the bell's id the read saw, so nothing added
    /// after the read is slept through. An entry added by hand rings
    /// nothing and is found by the next read, within `block`. With several
    /// partitions, each read takes from every partition (starting at a
    /// different one each time) and the wait is on every bell at once
    /// (module `bells`).
    pub async fn read(
        &self,
        consumer: &str,
        count: usize,
        block: Duration,
    ) -> Result<Vec<Delivery>, QueueError> {
        let until = tokio::time::Instant::now() + block;
        let n = self.keys.partitions();
        loop {
            if n == 1 {
                let (found, bell) = self.take(0, consumer, count).await?;
                let left = until.saturating_duration_since(tokio::time::Instant::now());
                if !found.is_empty() || left.is_zero() {
                    return Ok(found);
                }
                self.wait_for_bell(&bell, left).await;
                continue;
            }
            let rung = self.bells.watch(self).await;
            let start = self.turn.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % n;
            let mut found = Vec::new();
            for i in 0..n {
                let want = count.saturating_sub(found.len());
                if want == 0 {
                    break;
                }
                found.extend(self.take((start + i) % n, consumer, want).await?.0);
            }
            let left = until.saturating_duration_since(tokio::time::Instant::now());
            if !found.is_empty() || left.is_zero() {
                return Ok(found);
            }
            bells::Bells::wait(rung, left).await;
        }
    }

    /// One non-blocking read of partition `p` through `take.lua`: the
    /// deliveries, and the bell's last id.
    async fn take(
        &self,
        p: u16,
        consumer: &str,
        count: usize,
    ) -> Result<(Vec<Delivery>, String), QueueError> {
        let part = self.keys.part(p);
        self.with_group(p, || async {
            let mut inv = self.scripts.take.prepare_invoke();
            inv.key(part.ready())
                .key(part.bell())
                .arg(GROUP)
                .arg(consumer)
                .arg(count.max(1))
                .arg(MAX_FIELD_BYTES)
                .arg(MAX_FIELDS);
            let reply: Value = self.invoke("take", &inv).await?;
            let Value::Array(parts) = &reply else {
                return Err(QueueError::Reply(
                    "take",
                    untrusted::truncate(&format!("{reply:?}")),
                ));
            };
            let bell = parts
                .get(1)
                .and_then(bytes)
                .map(untrusted::lossy)
                .unwrap_or_else(|| "0-0".to_owned());
            let found = unpack_reply("take", parts.first())?
                .iter()
                .map(|e| e.delivery().in_partition(p))
                .collect();
            Ok((found, bell))
        })
        .await
    }

    /// Waits up to `limit` for the only partition's bell to ring past
    /// `seen`. Whatever goes wrong (the bell key broken by hand, Redis
    /// away) ends the wait early or late but never fails the read: the next
    /// read tells.
    async fn wait_for_bell(&self, seen: &str, limit: Duration) {
        let mut cmd = redis::cmd("XREAD");
        cmd.arg("COUNT")
            .arg(1)
            .arg("BLOCK")
            .arg(limit.as_millis().max(1) as u64)
            .arg("STREAMS")
            .arg(self.keys.bell())
            .arg(seen);
        let waited = self.blocking::<Value>("XREAD bell", limit, &cmd).await;
        if let Err(e) = waited {
            tracing::debug!(error = %e, "could not wait on the bell; reading again after the wait");
            tokio::time::sleep(limit).await;
        }
    }

    /// Claims up to `count` deliveries idle longer than `min_idle` for
    /// `consumer`, with their delivery counts, from every partition.
    pub async fn reclaim(
        &self,
        consumer: &str,
        min_idle: Duration,
        count: usize,
    ) -> Result<Vec<Delivery>, QueueError> {
        let mut out = Vec::new();
        for p in 0..self.keys.partitions() {
            let want = count.saturating_sub(out.len());
            if want == 0 {
                break;
            }
            let ready = self.keys.part(p).ready();
            out.extend(
                self.with_group(p, || async {
                    let mut inv = self.scripts.reclaim.prepare_invoke();
                    inv.key(&ready)
                        .arg(GROUP)
                        .arg(consumer)
                        .arg(min_idle.as_millis() as u64)
                        .arg(want)
                        .arg(MAX_FIELD_BYTES)
                        .arg(MAX_FIELDS);
                    let reply: Value = self.invoke("reclaim", &inv).await?;
                    Ok(unpack_reply("reclaim", Some(&reply))?
                        .iter()
                        .map(|e| e.delivery().in_partition(p))
                        .collect::<Vec<_>>())
                })
                .await?,
            );
        }
        Ok(out)
    }

    /// Resets the idle time of an entry this consumer is still working on,
    /// so no one reclaims it while a long webhook call runs. `JUSTID` does not
    /// count as a delivery.
    pub async fn touch(&self, consumer: &str, entry: EntryRef<'_>) -> Result<(), QueueError> {
        self.touch_all(consumer, &[entry]).await
    }

    /// [`Queue::touch`] for many entries, one `XCLAIM` per partition (a
    /// batch's claims).
    pub async fn touch_all(
        &self,
        consumer: &str,
        entries: &[EntryRef<'_>],
    ) -> Result<(), QueueError> {
        for (p, ids) in self.entries_by_partition(entries) {
            let mut cmd = redis::cmd("XCLAIM");
            cmd.arg(self.keys.part(p).ready())
                .arg(GROUP)
                .arg(consumer)
                .arg(0)
                .arg(&ids)
                .arg("JUSTID");
            self.with_group(p, || self.query::<Value>("XCLAIM JUSTID", &cmd))
                .await?;
        }
        Ok(())
    }

    fn entries_by_partition<'a>(&self, entries: &[EntryRef<'a>]) -> Vec<(u16, Vec<&'a str>)> {
        grouped(
            self.keys.partitions(),
            entries.iter().map(|e| (e.partition, e.id)),
        )
    }

    /// Acknowledges and deletes an entry in one step (`ack.lua`): the
    /// stream then holds only unfinished deliveries, which keeps it small
    /// and makes it cheap for the reconciler to see what is queued.
    pub async fn ack(&self, entry: EntryRef<'_>) -> Result<(), QueueError> {
        self.ack_all(&[entry]).await
    }

    /// [`Queue::ack`] for many entries, one step per partition (a settled
    /// batch).
    pub async fn ack_all(&self, entries: &[EntryRef<'_>]) -> Result<(), QueueError> {
        for (p, ids) in self.entries_by_partition(entries) {
            let mut inv = self.scripts.ack.prepare_invoke();
            inv.key(self.keys.part(p).ready()).arg(GROUP).arg(&ids);
            self.invoke::<()>("XACK+XDEL", &inv).await?;
        }
        Ok(())
    }

    /// A page of `stream` through `range.lua` (`[command, from, to]` as
    /// XRANGE or XREVRANGE takes them): each entry's id and what `each`
    /// makes of it (its fields borrowed from the reply, cut in Redis to
    /// [`MAX_FIELD_BYTES`] and [`MAX_FIELDS`]).
    async fn range<T>(
        &self,
        what: &'static str,
        stream: &str,
        [command, from, to]: [&str; 3],
        limit: usize,
        each: impl Fn(&Packed<'_>) -> T,
    ) -> Result<Vec<(String, T)>, QueueError> {
        let mut inv = self.scripts.range.prepare_invoke();
        inv.key(stream)
            .arg(command)
            .arg(from)
            .arg(to)
            .arg(limit)
            .arg(MAX_FIELD_BYTES)
            .arg(MAX_FIELDS);
        let reply: Value = self.invoke(what, &inv).await?;
        Ok(unpack_reply(what, Some(&reply))?
            .iter()
            .map(|e| (untrusted::lossy(e.id), each(e)))
            .collect())
    }

    /// Slot keys that are queued anywhere: in a delayed set, or in a
    /// stream (ready or pending). Reads every key whole: for inspection
    /// and tests; the reconciler asks [`Queue::queued_among`].
    pub async fn queued_slots(&self) -> Result<HashSet<String>, QueueError> {
        let mut out: HashSet<String> = HashSet::new();
        for (_, part) in self.keys.parts() {
            let mut cmd = redis::cmd("ZRANGE");
            cmd.arg(part.delayed()).arg(0).arg(-1);
            let delayed: Vec<String> = self.query("ZRANGE delayed", &cmd).await?;
            out.extend(delayed);
            self.stream_slots(&part.ready(), |slot| {
                out.insert(slot.to_owned());
                ControlFlow::Continue(())
            })
            .await?;
        }
        Ok(out)
    }

    /// Which of `slots` are queued anywhere (a delayed set, or a stream,
    /// ready or pending): what the reconciler must not re-deliver.
    ///
    /// Why not [`Queue::queued_slots`]: a day planned ahead sits in the
    /// delayed sets (a million slots is about 30 MB), and a pass reads the
    /// queue whenever a due slot is still unstarted, which is exactly when
    /// the fleet is behind. Reading the sets whole blocked Redis for every
    /// worker at that moment; asking for the candidates' scores
    /// (`ZMSCORE`, at most 1,000 at a time) costs what the
    /// candidates are. The streams hold only what is due and unfinished,
    /// and have no index by slot: they are read in pages, and only until
    /// every slot asked is found.
    pub async fn queued_among(&self, slots: &[String]) -> Result<HashSet<String>, QueueError> {
        let mut out: HashSet<String> = HashSet::new();
        if slots.is_empty() {
            return Ok(out);
        }
        let asked: HashSet<&str> = slots.iter().map(String::as_str).collect();
        // A slot added by hand may sit in another partition's set or
        // stream: every one is asked.
        for (_, part) in self.keys.parts() {
            for chunk in slots.chunks(SCORES_PER_CALL) {
                let mut cmd = redis::cmd("ZMSCORE");
                cmd.arg(part.delayed()).arg(chunk);
                let scores: Vec<Option<f64>> = self.query("ZMSCORE delayed", &cmd).await?;
                out.extend(
                    chunk
                        .iter()
                        .zip(scores)
                        .filter(|(_, score)| score.is_some())
                        .map(|(slot, _)| slot.clone()),
                );
            }
        }
        // The streams last, and only until every slot asked is found: the
        // reconciler asks about the oldest unstarted slots, which a fleet
        // that is behind has at the head of its stream, so a backlog of
        // 100,000 entries is not read through on every pass.
        for (_, part) in self.keys.parts() {
            if out.len() == asked.len() {
                break;
            }
            self.stream_slots(&part.ready(), |slot| {
                if asked.contains(slot) {
                    out.insert(slot.to_owned());
                }
                if out.len() == asked.len() {
                    ControlFlow::Break(())
                } else {
                    ControlFlow::Continue(())
                }
            })
            .await?;
        }
        Ok(out)
    }

    /// Calls `seen` with the slot of every well-formed entry of `stream`,
    /// read in pages of 1,000, until it answers `Break`.
    async fn stream_slots(
        &self,
        stream: &str,
        mut seen: impl FnMut(&str) -> ControlFlow<()>,
    ) -> Result<(), QueueError> {
        let mut start = "-".to_owned();
        loop {
            let page = self
                .range("range ready", stream, ["XRANGE", &start, "+"], 1000, |e| {
                    Delivery::parse(String::new(), &e.flat, 0)
                })
                .await?;
            for (_, d) in &page {
                if let (None, Some(slot)) = (d.defect(), d.slot()) {
                    if seen(slot).is_break() {
                        return Ok(());
                    }
                }
            }
            match page.last() {
                Some((last, _)) if page.len() == 1000 => start = format!("({last}"),
                _ => return Ok(()),
            }
        }
    }

    /// Queue depths, summed over the partitions (each one's own in
    /// [`Depths::partitions`] when there are several). `now_ms` ages the
    /// oldest pending entry.
    pub async fn depths(&self, now_ms: i64) -> Result<Depths, QueueError> {
        let mut each = Vec::new();
        for (_, part) in self.keys.parts() {
            each.push(self.depths_of(&part, now_ms).await?);
        }
        if each.len() == 1 {
            return Ok(each.pop().expect("one partition"));
        }
        let mut total = Depths::default();
        for d in &each {
            total.delayed += d.delayed;
            total.ready += d.ready;
            total.pending += d.pending;
            total.dead += d.dead;
            total.oldest_pending_ms = total.oldest_pending_ms.max(d.oldest_pending_ms);
        }
        total.partitions = each;
        Ok(total)
    }

    async fn depths_of(&self, part: &PartitionKeys, now_ms: i64) -> Result<Depths, QueueError> {
        let mut p = redis::pipe();
        p.cmd("ZCARD").arg(part.delayed());
        p.cmd("XLEN").arg(part.ready());
        p.cmd("XLEN").arg(part.dead());
        let (delayed, len, dead): (u64, u64, u64) = timed("depths", Duration::ZERO, async {
            let mut c = self.conn().await?;
            p.query_async(&mut c).await.map_err(op("depths"))
        })
        .await?;
        let mut cmd = redis::cmd("XPENDING");
        cmd.arg(part.ready()).arg(GROUP);
        let (pending, oldest) = match self.query::<Value>("XPENDING", &cmd).await {
            Ok(Value::Array(v)) => {
                let n = v
                    .first()
                    .and_then(|x| u64::from_redis_value(x).ok())
                    .unwrap_or(0);
                let min_id = v.get(1).and_then(|x| String::from_redis_value(x).ok());
                (n, min_id)
            }
            Ok(_) => (0, None),
            Err(e) if is_nogroup(&e) => (0, None),
            Err(e) => return Err(e),
        };
        let oldest_pending_ms = oldest
            .and_then(|id| id.split('-').next().and_then(|ms| ms.parse::<i64>().ok()))
            .map(|ms| now_ms.saturating_sub(ms).max(0) as u64);
        Ok(Depths {
            delayed,
            ready: len.saturating_sub(pending),
            pending,
            oldest_pending_ms,
            dead,
            partitions: Vec::new(),
        })
    }

    /// Redis's own clock (`TIME`), Unix ms: the clock promotion and the
    /// reconciler's re-delivery never run ahead of.
    pub async fn server_time_ms(&self) -> Result<i64, QueueError> {
        let (s, us): (i64, i64) = self.query("TIME", &redis::cmd("TIME")).await?;
        Ok(s * 1000 + us / 1000)
    }

    /// Checks the connection.
    pub async fn ping(&self) -> Result<(), QueueError> {
        self.query::<String>("PING", &redis::cmd("PING"))
            .await
            .map(|_| ())
    }
}
