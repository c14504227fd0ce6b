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
//! - replies are parsed as raw [`Value`]s, entry by entry; an entry whose
//!   bytes are wrong becomes a [`Delivery`] with a [`Defect`] (the executor
//!   records it `failed/bad_message`), never an error that fails the read
//!   of the entries around it;
//! - every string kept from an entry is bounded ([`crate::untrusted`]), so
//!   logs, rows and dead letters copy at most a few hundred bytes of it;
//! - a stream Redis refuses to add to (its id space used up, or the key
//!   replaced by another type) is moved aside and recreated by the first
//!   writer that finds it (`stream.lua`);
//! - `P:dead` is capped, and the leader forgets consumers and workers that
//!   are long gone ([`Queue::forget_gone`]).

mod connect;
mod dead_letter;
mod delivery;
mod keys;
mod workers;

pub use connect::{pool, pool_with, PoolError, RedisOptions};
pub use dead_letter::DeadLetter;
use delivery::{bytes, entries, entry};
pub use delivery::{Defect, Delivery};
pub use keys::KeySpace;
pub use workers::Forgotten;

use crate::untrusted;
use redis::{FromRedisValue, Value};
use std::collections::{HashMap, HashSet};
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

/// One entry as `take.lua`, `reclaim.lua` and `range.lua` return it:
/// `[id, [name, value, ...], (delivery count,) size]`, `size` being the
/// entry's bytes when `cut.lua` cut it (0 when intact). `size_at` is that
/// element's index; a delivery count, when sent, sits just before it,
/// otherwise the entry counts as `deliveries`.
fn cut_entry(e: &Value, size_at: usize, deliveries: u64) -> Option<Delivery> {
    let (id, flat) = entry(e)?;
    let Value::Array(parts) = e else { return None };
    let number = |i: usize| parts.get(i).and_then(|v| u64::from_redis_value(v).ok());
    let n = if size_at > 2 {
        number(size_at - 1).unwrap_or(1)
    } else {
        deliveries
    };
    let mut d = Delivery::parse(id, flat, n);
    if let Some(size) = number(size_at).filter(|s| *s > 0) {
        d.cut_in_redis(size);
    }
    Some(d)
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

/// The queue under one prefix.
#[derive(Clone)]
pub struct Queue {
    pool: deadpool_redis::Pool,
    keys: KeySpace,
    scripts: std::sync::Arc<Scripts>,
    dead_cap: u64,
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
    pub fn new(pool: deadpool_redis::Pool, keys: KeySpace) -> Self {
        Self {
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
        let stream = aside.split(":broken:").next().unwrap_or(aside);
        tracing::warn!(%stream, moved_to = %aside, by, "Redis refused to add to the stream (its last possible id used, or the key holds another type); moved it aside for inspection and recreated it (what was queued there is re-delivered by the reconciler)");
        crate::telemetry::stream_repair(if stream == self.keys.dead() {
            "dead"
        } else {
            "ready"
        });
    }

    /// The key names this queue uses.
    pub fn keys(&self) -> &KeySpace {
        &self.keys
    }

    /// A pooled connection; private, so that every command goes through the
    /// timed helpers.
    async fn conn(&self) -> Result<deadpool_redis::Connection, QueueError> {
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

    /// Puts slots into the delayed set; a member already there keeps its
    /// score (`NX`), so a re-plan never moves a due time. The `ZADD`s go in
    /// pipelines, so a large plan costs a round trip per
    /// `SCHEDULE_PIPELINE` slots rather than per `ZADD`.
    pub async fn schedule(&self, slots: &[(String, i64)]) -> Result<(), QueueError> {
        for group in slots.chunks(SCHEDULE_PIPELINE) {
            let mut pipe = redis::pipe();
            for chunk in group.chunks(SCHEDULE_ZADD) {
                let cmd = pipe.cmd("ZADD").arg(self.keys.delayed()).arg("NX");
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
        Ok(())
    }

    /// Takes slots out of the delayed set (a slot cancelled before it was
    /// due). One already promoted to the stream stays there; the gate row
    /// its cancellation wrote settles it as `slot_taken`.
    pub async fn unschedule(&self, slots: &[String]) -> Result<(), QueueError> {
        if slots.is_empty() {
            return Ok(());
        }
        timed("ZREM delayed", Duration::ZERO, async {
            let mut c = self.conn().await?;
            redis::cmd("ZREM")
                .arg(self.keys.delayed())
                .arg(slots)
                .query_async::<()>(&mut c)
                .await
                .map_err(op("ZREM delayed"))
        })
        .await
    }

    /// Adds a delivery to the ready stream now, repairing a broken stream
    /// first (see `stream.lua`).
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
        let mut inv = self.scripts.deliver.prepare_invoke();
        inv.key(self.keys.ready())
            .key(self.keys.bell())
            .arg(GROUP)
            .arg(slot)
            .arg(caller)
            .arg(now_ms);
        for (name, value) in extra {
            inv.arg(*name).arg(*value);
        }
        let (id, aside): (String, String) = self.invoke("deliver", &inv).await?;
        self.repaired("deliver", &aside);
        Ok(id)
    }

    /// Moves at most `batch` due slots into the stream in one atomic step.
    /// `fence` is the caller's lease value; `None` promotes unfenced.
    /// Returns `None` when the fence no longer holds.
    pub async fn promote(
        &self,
        now_ms: i64,
        batch: usize,
        fence: Option<&str>,
        by: PromoteBy,
    ) -> Result<Option<Promotion>, QueueError> {
        let mut inv = self.scripts.promote.prepare_invoke();
        inv.key(self.keys.delayed())
            .key(self.keys.ready())
            .key(self.keys.leader())
            .key(self.keys.bell())
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
        Ok(u64::try_from(n).ok().map(|moved| Promotion {
            moved,
            // A score is written by slotgate in whole ms; a hand-written
            // one that is not a number reads as no head, and the leader
            // looks again within a second anyway.
            head_ms: head.parse::<f64>().ok().map(|s| s as i64),
        }))
    }

    /// Creates the stream and the group from id 0 if either is missing, so
    /// nothing added after a flush is skipped; moves a broken stream aside
    /// first (see `stream.lua`).
    pub async fn ensure_group(&self) -> Result<(), QueueError> {
        let mut inv = self.scripts.ensure.prepare_invoke();
        inv.key(self.keys.ready()).arg(GROUP);
        let aside: String = self.invoke("ensure group", &inv).await?;
        self.repaired("ensure group", &aside);
        Ok(())
    }

    /// Runs `f`, recreating the group once if Redis answered `NOGROUP`
    /// (or repairing the stream if the key holds another type).
    async fn with_group<T, F, Fut>(&self, f: F) -> Result<T, QueueError>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<T, QueueError>>,
    {
        match f().await {
            Err(e) if is_nogroup(&e) || has_code(&e, "WRONGTYPE") => {
                tracing::warn!(stream = %self.keys.ready(), error = %e, "consumer group or stream missing (Redis flushed or restarted?); recreating it from id 0");
                self.ensure_group().await?;
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
    /// nothing, this waits on `P:ready:bell`, which every script that adds
    /// a delivery rings, from the bell's id the read saw, so nothing added
    /// after the read is slept through. An entry added by hand rings
    /// nothing and is found by the next read, within `block`.
    pub async fn read(
        &self,
        consumer: &str,
        count: usize,
        block: Duration,
    ) -> Result<Vec<Delivery>, QueueError> {
        let until = tokio::time::Instant::now() + block;
        loop {
            let (found, bell) = self.take(consumer, count).await?;
            let left = until.saturating_duration_since(tokio::time::Instant::now());
            if !found.is_empty() || left.is_zero() {
                return Ok(found);
            }
            self.wait_for_bell(&bell, left).await;
        }
    }

    /// One non-blocking read through `take.lua`: the deliveries, and the
    /// bell's last id.
    async fn take(
        &self,
        consumer: &str,
        count: usize,
    ) -> Result<(Vec<Delivery>, String), QueueError> {
        self.with_group(|| async {
            let mut inv = self.scripts.take.prepare_invoke();
            inv.key(self.keys.ready())
                .key(self.keys.bell())
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
            let found = match parts.first() {
                Some(Value::Array(list)) => {
                    list.iter().filter_map(|e| cut_entry(e, 2, 1)).collect()
                }
                _ => Vec::new(),
            };
            Ok((found, bell))
        })
        .await
    }

    /// Waits up to `limit` for the bell to ring past `seen`. Whatever goes
    /// wrong (the bell key broken by hand, Redis away) ends the wait early
    /// or late but never fails the read: the next read tells.
    async fn wait_for_bell(&self, seen: &str, limit: Duration) {
        let mut cmd = redis::cmd("XREAD");
        cmd.arg("COUNT")
            .arg(1)
            .arg("BLOCK")
            .arg(limit.as_millis().max(1) as u64)
            .arg("STREAMS")
            .arg(self.keys.bell())
            .arg(seen);
        let waited = timed("XREAD bell", limit, async {
            let mut c = self.conn().await?;
            cmd.query_async::<Value>(&mut c)
                .await
                .map_err(op("XREAD bell"))
        })
        .await;
        if let Err(e) = waited {
            tracing::debug!(error = %e, "could not wait on the bell; reading again after the wait");
            tokio::time::sleep(limit).await;
        }
    }

    /// Claims up to `count` deliveries idle longer than `min_idle` for
    /// `consumer`, with their delivery counts.
    pub async fn reclaim(
        &self,
        consumer: &str,
        min_idle: Duration,
        count: usize,
    ) -> Result<Vec<Delivery>, QueueError> {
        self.with_group(|| async {
            let mut inv = self.scripts.reclaim.prepare_invoke();
            inv.key(self.keys.ready())
                .arg(GROUP)
                .arg(consumer)
                .arg(min_idle.as_millis() as u64)
                .arg(count)
                .arg(MAX_FIELD_BYTES)
                .arg(MAX_FIELDS);
            // [[id, [name, value, ...], delivery count, size when cut], ...]
            let reply: Value = self.invoke("reclaim", &inv).await?;
            let Value::Array(list) = &reply else {
                return Ok(Vec::new());
            };
            Ok(list.iter().filter_map(|e| cut_entry(e, 3, 0)).collect())
        })
        .await
    }

    /// Resets the idle time of an entry this consumer is still working on,
    /// so no one reclaims it while a long webhook call runs. `JUSTID` does not
    /// count as a delivery.
    pub async fn touch(&self, consumer: &str, entry_id: &str) -> Result<(), QueueError> {
        self.touch_all(consumer, &[entry_id]).await
    }

    /// [`Queue::touch`] for many entries in one `XCLAIM` (a batch's claims).
    pub async fn touch_all(&self, consumer: &str, entry_ids: &[&str]) -> Result<(), QueueError> {
        if entry_ids.is_empty() {
            return Ok(());
        }
        let mut cmd = redis::cmd("XCLAIM");
        cmd.arg(self.keys.ready())
            .arg(GROUP)
            .arg(consumer)
            .arg(0)
            .arg(entry_ids)
            .arg("JUSTID");
        self.with_group(|| self.query::<Value>("XCLAIM JUSTID", &cmd))
            .await
            .map(|_| ())
    }

    /// Acknowledges and deletes an entry, in one MULTI: the stream then holds
    /// only unfinished deliveries, which keeps it small and makes it cheap for
    /// the reconciler to see what is queued.
    pub async fn ack(&self, entry_id: &str) -> Result<(), QueueError> {
        self.ack_all(&[entry_id]).await
    }

    /// [`Queue::ack`] for many entries in one MULTI (a settled batch).
    pub async fn ack_all(&self, entry_ids: &[&str]) -> Result<(), QueueError> {
        if entry_ids.is_empty() {
            return Ok(());
        }
        let mut p = redis::pipe();
        p.atomic()
            .cmd("XACK")
            .arg(self.keys.ready())
            .arg(GROUP)
            .arg(entry_ids)
            .ignore()
            .cmd("XDEL")
            .arg(self.keys.ready())
            .arg(entry_ids)
            .ignore();
        timed("ack", Duration::ZERO, async {
            let mut c = self.conn().await?;
            p.query_async::<()>(&mut c).await.map_err(op("XACK+XDEL"))
        })
        .await
    }

    /// Reads up to `limit` of `P:dead`: `[what, command, from, to]` names
    /// the call and is `XRANGE - +` (oldest first) or `XREVRANGE + -`
    /// (newest first).
    async fn dead_range(
        &self,
        [what, command, from, to]: [&'static str; 4],
        limit: usize,
    ) -> Result<Vec<DeadLetter>, QueueError> {
        let page = self
            .range(what, &self.keys.dead(), [command, from, to], limit)
            .await?;
        Ok(page
            .into_iter()
            .map(|(id, flat)| DeadLetter {
                id,
                fields: flat
                    .chunks_exact(2)
                    .filter_map(|p| {
                        Some((
                            untrusted::lossy(bytes(&p[0])?),
                            untrusted::lossy(bytes(&p[1])?),
                        ))
                    })
                    .collect(),
            })
            .collect())
    }

    /// A page of `stream` through `range.lua` (`[command, from, to]` as
    /// XRANGE or XREVRANGE takes them): each entry's id and its fields,
    /// cut in Redis to [`MAX_FIELD_BYTES`] and [`MAX_FIELDS`].
    async fn range(
        &self,
        what: &'static str,
        stream: &str,
        [command, from, to]: [&str; 3],
        limit: usize,
    ) -> Result<Vec<(String, Vec<Value>)>, QueueError> {
        let mut inv = self.scripts.range.prepare_invoke();
        inv.key(stream)
            .arg(command)
            .arg(from)
            .arg(to)
            .arg(limit)
            .arg(MAX_FIELD_BYTES)
            .arg(MAX_FIELDS);
        let reply: Value = self.invoke(what, &inv).await?;
        Ok(entries(&reply)
            .into_iter()
            .map(|(id, flat)| (id, flat.to_vec()))
            .collect())
    }

    /// Slot keys that are queued anywhere: in the delayed set, or in the
    /// stream (ready or pending). The reconciler re-delivers only what is not.
    pub async fn queued_slots(&self) -> Result<HashSet<String>, QueueError> {
        let mut out: HashSet<String> = HashSet::new();
        let mut cmd = redis::cmd("ZRANGE");
        cmd.arg(self.keys.delayed()).arg(0).arg(-1);
        let delayed: Vec<String> = self.query("ZRANGE delayed", &cmd).await?;
        out.extend(delayed);
        let mut start = "-".to_owned();
        loop {
            let page = self
                .range(
                    "range ready",
                    &self.keys.ready(),
                    ["XRANGE", &start, "+"],
                    1000,
                )
                .await?;
            for (_, flat) in &page {
                let d = Delivery::parse(String::new(), flat, 0);
                if let (None, Some(slot)) = (d.defect(), d.slot()) {
                    out.insert(slot.to_owned());
                }
            }
            match page.last() {
                Some((last, _)) if page.len() == 1000 => start = format!("({last}"),
                _ => break,
            }
        }
        Ok(out)
    }

    /// Queue depths. `now_ms` ages the oldest pending entry.
    pub async fn depths(&self, now_ms: i64) -> Result<Depths, QueueError> {
        let mut p = redis::pipe();
        p.cmd("ZCARD").arg(self.keys.delayed());
        p.cmd("XLEN").arg(self.keys.ready());
        p.cmd("XLEN").arg(self.keys.dead());
        let (delayed, len, dead): (u64, u64, u64) = timed("depths", Duration::ZERO, async {
            let mut c = self.conn().await?;
            p.query_async(&mut c).await.map_err(op("depths"))
        })
        .await?;
        let mut cmd = redis::cmd("XPENDING");
        cmd.arg(self.keys.ready()).arg(GROUP);
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
