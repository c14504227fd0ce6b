//! `P:workers`: each worker's heartbeat, and the leader's forgetting of
//! workers and stream consumers that are long gone.

use super::*;

/// How many consumers and heartbeats [`Queue::forget_gone`] removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Forgotten {
    /// Idle consumers deleted from the stream group.
    pub consumers: u64,
    /// Stale heartbeats deleted from `P:workers`.
    pub workers: u64,
}

impl Queue {
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

    /// Live workers: id → last heartbeat (Unix ms). Entries that are not
    /// a worker's heartbeat (written by hand) are left out.
    pub async fn workers(&self) -> Result<HashMap<String, i64>, QueueError> {
        let mut cmd = redis::cmd("HGETALL");
        cmd.arg(self.keys.workers());
        let v: Value = self.query("HGETALL workers", &cmd).await?;
        let pairs: Vec<(&Value, &Value)> = match &v {
            Value::Array(flat) => flat.chunks_exact(2).map(|p| (&p[0], &p[1])).collect(),
            Value::Map(m) => m.iter().map(|(k, v)| (k, v)).collect(),
            _ => Vec::new(),
        };
        Ok(pairs
            .into_iter()
            .filter_map(|(k, v)| {
                let ms = std::str::from_utf8(bytes(v)?).ok()?.parse().ok()?;
                Some((untrusted::lossy(bytes(k)?), ms))
            })
            .collect())
    }

    /// Forgets what is gone: heartbeats older than `limit` leave
    /// `P:workers`, then, in every partition, consumers with nothing
    /// pending that Redis saw idle for longer than `limit` and that are not
    /// a live worker leave the group, so neither grows with every worker id
    /// ever seen. A leader's chore; `now_ms` is its clock.
    pub async fn forget_gone(&self, now_ms: i64, limit: Duration) -> Result<Forgotten, QueueError> {
        let mut inv = self.scripts.forget_workers.prepare_invoke();
        inv.key(self.keys.workers())
            .arg(now_ms)
            .arg(limit.as_millis() as u64);
        let reply: Vec<Value> = self.invoke("forget workers", &inv).await?;
        let workers = reply
            .first()
            .and_then(|v| u64::from_redis_value(v).ok())
            .unwrap_or(0);
        let live: Vec<&[u8]> = reply.iter().skip(1).filter_map(bytes).collect();
        let mut consumers = 0;
        for (_, part) in self.keys.parts() {
            let mut inv = self.scripts.forget.prepare_invoke();
            inv.key(part.ready())
                .arg(GROUP)
                .arg(limit.as_millis() as u64);
            for id in &live {
                inv.arg(*id);
            }
            consumers += self.invoke::<u64>("forget gone", &inv).await?;
        }
        Ok(Forgotten { consumers, workers })
    }
}
