//! The Redis side: transport only, never the source of truth.
//!
//! Every key is built by [`KeySpace`]; every multi-step change is one Lua
//! script (`*.lua` beside this file) or one MULTI, so a crash never leaves a
//! half-moved slot. Redis may be flushed at any time: the consumer group is
//! recreated on `NOGROUP`, and the leader's reconciler re-delivers whatever
//! Postgres says is planned and unfinished.

use redis::{streams::StreamReadOptions, streams::StreamReadReply, FromRedisValue, Value};
use std::collections::{HashMap, HashSet};
use std::time::Duration;

/// The consumer group every worker reads with.
pub const GROUP: &str = "workers";

/// The names of every key under one prefix. A prefix with a hash tag
/// (`{slotgate}`) keeps them all in one Redis Cluster slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeySpace {
    prefix: String,
}

impl KeySpace {
    pub fn new(prefix: impl Into<String>) -> Self {
        Self {
            prefix: prefix.into(),
        }
    }
    pub fn prefix(&self) -> &str {
        &self.prefix
    }
    /// Sorted set of planned slots not yet due: member = slot key, score = due ms.
    pub fn delayed(&self) -> String {
        format!("{}:delayed", self.prefix)
    }
    /// Stream of deliveries, consumed by group [`GROUP`].
    pub fn ready(&self) -> String {
        format!("{}:ready", self.prefix)
    }
    /// The leader lease: `<worker id>:<epoch>` with a TTL.
    pub fn leader(&self) -> String {
        format!("{}:leader", self.prefix)
    }
    /// Mirror of the current fencing epoch (the counter lives in Postgres).
    pub fn epoch(&self) -> String {
        format!("{}:epoch", self.prefix)
    }
    /// Stream of dead letters, each with a `reason`.
    pub fn dead(&self) -> String {
        format!("{}:dead", self.prefix)
    }
    /// Hash of live workers: worker id → last heartbeat (Unix ms).
    pub fn workers(&self) -> String {
        format!("{}:workers", self.prefix)
    }
    /// Pattern matching every key of this prefix (for tests and tooling).
    pub fn pattern(&self) -> String {
        format!("{}:*", self.prefix)
    }
}

/// Redis errors, with the operation that failed.
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    #[error("redis {op}: {source}")]
    Redis {
        op: &'static str,
        #[source]
        source: redis::RedisError,
    },
    #[error("redis pool: {0}")]
    Pool(#[from] deadpool_redis::PoolError),
    #[error("redis {0}: timed out")]
    Timeout(&'static str),
}

fn op(op: &'static str) -> impl FnOnce(redis::RedisError) -> QueueError {
    move |source| QueueError::Redis { op, source }
}

fn is_nogroup(e: &QueueError) -> bool {
    matches!(e, QueueError::Redis { source, .. } if source.code() == Some("NOGROUP") || source.to_string().contains("NOGROUP"))
}

/// One stream entry as a worker receives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    pub entry_id: String,
    pub fields: HashMap<String, String>,
    /// How many times the group has handed this entry out (1 = first time).
    pub deliveries: u64,
}

impl Delivery {
    pub fn slot(&self) -> Option<&str> {
        self.fields.get("slot").map(String::as_str)
    }
    pub fn caller(&self) -> &str {
        self.fields
            .get("caller")
            .map(String::as_str)
            .unwrap_or("unknown")
    }
}

/// Counts for `planner status` and the metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Depths {
    pub delayed: u64,
    /// Entries in the stream not yet handed to any worker.
    pub ready: u64,
    /// Entries handed out and not yet acknowledged.
    pub pending: u64,
    /// Age of the oldest pending entry, from its stream id.
    pub oldest_pending_ms: Option<u64>,
    pub dead: u64,
}

/// A dead letter as stored in `P:dead`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    pub id: String,
    pub fields: HashMap<String, String>,
}

/// The queue under one prefix.
#[derive(Clone)]
pub struct Queue {
    pool: deadpool_redis::Pool,
    keys: KeySpace,
    promote: std::sync::Arc<redis::Script>,
    reclaim: std::sync::Arc<redis::Script>,
}

impl std::fmt::Debug for Queue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queue")
            .field("keys", &self.keys)
            .finish_non_exhaustive()
    }
}

/// Opens a connection pool. Short timeouts: a worker facing a dead Redis
/// should back off and retry, not hang.
pub fn pool(url: &str, max_size: usize) -> Result<deadpool_redis::Pool, String> {
    let mut cfg = deadpool_redis::Config::from_url(url);
    let mut pc = deadpool_redis::PoolConfig::new(max_size);
    pc.timeouts.wait = Some(Duration::from_secs(5));
    pc.timeouts.create = Some(Duration::from_secs(3));
    pc.timeouts.recycle = Some(Duration::from_secs(3));
    cfg.pool = Some(pc);
    cfg.create_pool(Some(deadpool_redis::Runtime::Tokio1))
        .map_err(|e| format!("redis url {url:?}: {e}"))
}

/// Upper bound on any single Redis command (BLOCKing reads add their block
/// time): a Redis that stopped answering must surface as an error.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(5);

async fn timed<T>(
    what: &'static str,
    extra: Duration,
    f: impl std::future::Future<Output = Result<T, QueueError>>,
) -> Result<T, QueueError> {
    tokio::time::timeout(COMMAND_TIMEOUT + extra, f)
        .await
        .map_err(|_| QueueError::Timeout(what))?
}

impl Queue {
    pub fn new(pool: deadpool_redis::Pool, keys: KeySpace) -> Self {
        Self {
            pool,
            keys,
            promote: std::sync::Arc::new(redis::Script::new(include_str!("promote.lua"))),
            reclaim: std::sync::Arc::new(redis::Script::new(include_str!("reclaim.lua"))),
        }
    }

    pub fn keys(&self) -> &KeySpace {
        &self.keys
    }

    pub fn pool(&self) -> &deadpool_redis::Pool {
        &self.pool
    }

    /// A pooled connection.
    pub async fn conn(&self) -> Result<deadpool_redis::Connection, QueueError> {
        Ok(self.pool.get().await?)
    }

    async fn query<T: FromRedisValue>(
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
    /// score (`NX`), so a re-plan never moves a due time.
    pub async fn schedule(&self, slots: &[(String, i64)]) -> Result<(), QueueError> {
        for chunk in slots.chunks(500) {
            let mut cmd = redis::cmd("ZADD");
            cmd.arg(self.keys.delayed()).arg("NX");
            for (key, due_ms) in chunk {
                cmd.arg(*due_ms).arg(key);
            }
            self.query::<i64>("ZADD delayed", &cmd).await?;
        }
        Ok(())
    }

    /// Adds a delivery to the ready stream now.
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
        let mut cmd = redis::cmd("XADD");
        cmd.arg(self.keys.ready())
            .arg("*")
            .arg("slot")
            .arg(slot)
            .arg("caller")
            .arg(caller)
            .arg("enqueued_at")
            .arg(now_ms);
        for (name, value) in extra {
            cmd.arg(*name).arg(*value);
        }
        self.query("XADD ready", &cmd).await
    }

    /// Moves at most `batch` due slots into the stream in one atomic step.
    /// `fence` is the caller's lease value; `None` promotes unfenced.
    /// Returns `None` when the fence no longer holds.
    pub async fn promote(
        &self,
        now_ms: i64,
        batch: usize,
        fence: Option<&str>,
    ) -> Result<Option<u64>, QueueError> {
        let mut inv = self.promote.prepare_invoke();
        inv.key(self.keys.delayed())
            .key(self.keys.ready())
            .key(self.keys.leader())
            .arg(now_ms)
            .arg(batch)
            .arg(fence.unwrap_or(""));
        let n: i64 = timed("promote", Duration::ZERO, async {
            let mut c = self.conn().await?;
            inv.invoke_async(&mut c).await.map_err(op("promote"))
        })
        .await?;
        Ok(u64::try_from(n).ok())
    }

    /// The earliest due time in the delayed set (Unix ms).
    pub async fn next_due_ms(&self) -> Result<Option<i64>, QueueError> {
        let mut cmd = redis::cmd("ZRANGE");
        cmd.arg(self.keys.delayed()).arg(0).arg(0).arg("WITHSCORES");
        let v: Vec<(String, f64)> = self.query("ZRANGE delayed", &cmd).await?;
        Ok(v.first().map(|(_, s)| *s as i64))
    }

    /// Creates the stream and the group from id 0 if either is missing, so
    /// nothing added after a flush is skipped.
    pub async fn ensure_group(&self) -> Result<(), QueueError> {
        let mut cmd = redis::cmd("XGROUP");
        cmd.arg("CREATE")
            .arg(self.keys.ready())
            .arg(GROUP)
            .arg("0")
            .arg("MKSTREAM");
        match self.query::<Value>("XGROUP CREATE", &cmd).await {
            Ok(_) => Ok(()),
            Err(QueueError::Redis { source, .. })
                if source.code() == Some("BUSYGROUP")
                    || source.to_string().contains("BUSYGROUP") =>
            {
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Runs `f`, recreating the group once if Redis answered `NOGROUP`.
    async fn with_group<T, F, Fut>(&self, f: F) -> Result<T, QueueError>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<T, QueueError>>,
    {
        match f().await {
            Err(e) if is_nogroup(&e) => {
                tracing::warn!(stream = %self.keys.ready(), "consumer group missing (Redis flushed or restarted?); recreating it from id 0");
                self.ensure_group().await?;
                f().await
            }
            r => r,
        }
    }

    /// Reads up to `count` new deliveries for `consumer`, blocking up to `block`.
    pub async fn read(
        &self,
        consumer: &str,
        count: usize,
        block: Duration,
    ) -> Result<Vec<Delivery>, QueueError> {
        self.with_group(|| async {
            let opts = StreamReadOptions::default()
                .group(GROUP, consumer)
                .count(count)
                .block(block.as_millis() as usize);
            let reply: Option<StreamReadReply> = timed("XREADGROUP", block, async {
                let mut c = self.conn().await?;
                redis::AsyncCommands::xread_options(&mut *c, &[self.keys.ready()], &[">"], &opts)
                    .await
                    .map_err(op("XREADGROUP"))
            })
            .await?;
            let mut out = Vec::new();
            for key in reply.map(|r| r.keys).unwrap_or_default() {
                for id in key.ids {
                    out.push(Delivery {
                        fields: fields_of(&id.map),
                        entry_id: id.id,
                        deliveries: 1,
                    });
                }
            }
            Ok(out)
        })
        .await
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
            let mut inv = self.reclaim.prepare_invoke();
            inv.key(self.keys.ready())
                .arg(GROUP)
                .arg(consumer)
                .arg(min_idle.as_millis() as u64)
                .arg(count);
            let v: Vec<(String, Vec<String>, u64)> = timed("reclaim", Duration::ZERO, async {
                let mut c = self.conn().await?;
                inv.invoke_async(&mut c).await.map_err(op("reclaim"))
            })
            .await?;
            Ok(v.into_iter()
                .map(|(entry_id, flat, deliveries)| Delivery {
                    entry_id,
                    fields: flat
                        .chunks(2)
                        .filter_map(|p| Some((p.first()?.clone(), p.get(1)?.clone())))
                        .collect(),
                    deliveries,
                })
                .collect())
        })
        .await
    }

    /// Resets the idle time of an entry this consumer is still working on,
    /// so no one reclaims it while a long webhook call runs. `JUSTID` does not
    /// count as a delivery.
    pub async fn touch(&self, consumer: &str, entry_id: &str) -> Result<(), QueueError> {
        let mut cmd = redis::cmd("XCLAIM");
        cmd.arg(self.keys.ready())
            .arg(GROUP)
            .arg(consumer)
            .arg(0)
            .arg(entry_id)
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

    /// Moves an entry to `P:dead` with a reason, and acknowledges it, in one MULTI.
    pub async fn dead_letter(
        &self,
        d: &Delivery,
        reason: &str,
        now_ms: i64,
    ) -> Result<(), QueueError> {
        let mut p = redis::pipe();
        p.atomic();
        {
            let c = p.cmd("XADD").arg(self.keys.dead()).arg("*");
            let mut names: Vec<&String> = d.fields.keys().collect();
            names.sort();
            for name in names {
                if !matches!(
                    name.as_str(),
                    "reason" | "entry_id" | "deliveries" | "dead_at"
                ) {
                    c.arg(name).arg(&d.fields[name]);
                }
            }
            c.arg("reason")
                .arg(reason)
                .arg("entry_id")
                .arg(&d.entry_id)
                .arg("deliveries")
                .arg(d.deliveries)
                .arg("dead_at")
                .arg(now_ms)
                .ignore();
        }
        p.cmd("XACK")
            .arg(self.keys.ready())
            .arg(GROUP)
            .arg(&d.entry_id)
            .ignore();
        p.cmd("XDEL")
            .arg(self.keys.ready())
            .arg(&d.entry_id)
            .ignore();
        timed("dead_letter", Duration::ZERO, async {
            let mut c = self.conn().await?;
            p.query_async::<()>(&mut c).await.map_err(op("dead letter"))
        })
        .await
    }

    /// Every dead letter (oldest first), up to `limit`.
    pub async fn dead_letters(&self, limit: usize) -> Result<Vec<DeadLetter>, QueueError> {
        let mut cmd = redis::cmd("XRANGE");
        cmd.arg(self.keys.dead())
            .arg("-")
            .arg("+")
            .arg("COUNT")
            .arg(limit);
        let v: redis::streams::StreamRangeReply = self.query("XRANGE dead", &cmd).await?;
        Ok(v.ids
            .into_iter()
            .map(|id| DeadLetter {
                fields: fields_of(&id.map),
                id: id.id,
            })
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
            let mut cmd = redis::cmd("XRANGE");
            cmd.arg(self.keys.ready())
                .arg(&start)
                .arg("+")
                .arg("COUNT")
                .arg(1000);
            let page: redis::streams::StreamRangeReply = self.query("XRANGE ready", &cmd).await?;
            let n = page.ids.len();
            for id in &page.ids {
                if let Some(Value::BulkString(b)) = id.map.get("slot") {
                    out.insert(String::from_utf8_lossy(b).into_owned());
                }
            }
            match page.ids.last() {
                Some(last) if n == 1000 => start = format!("({}", last.id),
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

    /// Records that a worker is alive (for `planner status`).
    pub async fn heartbeat_worker(&self, worker_id: &str, now_ms: i64) -> Result<(), QueueError> {
        let mut cmd = redis::cmd("HSET");
        cmd.arg(self.keys.workers()).arg(worker_id).arg(now_ms);
        self.query::<i64>("HSET workers", &cmd).await.map(|_| ())
    }

    /// Removes a worker from the live set on clean shutdown.
    pub async fn forget_worker(&self, worker_id: &str) -> Result<(), QueueError> {
        let mut cmd = redis::cmd("HDEL");
        cmd.arg(self.keys.workers()).arg(worker_id);
        self.query::<i64>("HDEL workers", &cmd).await.map(|_| ())
    }

    /// Live workers: id → last heartbeat (Unix ms).
    pub async fn workers(&self) -> Result<HashMap<String, i64>, QueueError> {
        let mut cmd = redis::cmd("HGETALL");
        cmd.arg(self.keys.workers());
        self.query("HGETALL workers", &cmd).await
    }

    /// Runs an arbitrary command (for the lease and for tooling).
    pub async fn raw<T: FromRedisValue>(
        &self,
        what: &'static str,
        cmd: &redis::Cmd,
    ) -> Result<T, QueueError> {
        self.query(what, cmd).await
    }

    /// Checks the connection.
    pub async fn ping(&self) -> Result<(), QueueError> {
        self.query::<String>("PING", &redis::cmd("PING"))
            .await
            .map(|_| ())
    }
}

fn fields_of(map: &HashMap<String, Value>) -> HashMap<String, String> {
    map.iter()
        .filter_map(|(k, v)| match v {
            Value::BulkString(b) => Some((k.clone(), String::from_utf8_lossy(b).into_owned())),
            Value::SimpleString(s) => Some((k.clone(), s.clone())),
            Value::Int(i) => Some((k.clone(), i.to_string())),
            _ => None,
        })
        .collect()
}
