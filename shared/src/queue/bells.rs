//! Waiting on every partition's bell at once, for a queue spread over
//! several partitions.
//!
//! With one partition a worker that found nothing waits on that
//! partition's bell with one blocking `XREAD` (see [`Queue::read`]). With
//! several, one blocking command cannot wait on them all (on a Cluster the
//! bells live on different shards), and racing a wait per bell would
//! leave the losers' blocked commands on pooled connections. So each
//! process runs one watcher per partition, started by its first read that
//! waits: it blocks on its bell from the last id it saw and bumps a shared
//! counter whenever the bell rings. A reader notes the counter *before* it
//! reads the streams and, finding nothing, waits for the counter to move;
//! a ring between its read and its wait is therefore never slept through.
//! The watchers hold one connection each (the pool is grown by the
//! partition count for them) and end when the last handle to the queue is
//! dropped.

use super::{bytes, Queue};
use crate::untrusted;
use redis::Value;
use std::time::Duration;
use tokio::sync::{watch, OnceCell};

/// How long one watcher's `XREAD` blocks before it looks whether anyone
/// is still listening.
const WATCH_BLOCK: Duration = Duration::from_secs(1);

/// The ring counter, shared by a queue's clones.
#[derive(Default)]
pub(super) struct Bells {
    rings: OnceCell<watch::Receiver<u64>>,
}

impl Bells {
    /// The ring counter as of now (marked seen), starting the watchers on
    /// first use. Call it before reading the streams.
    pub(super) async fn watch(&self, queue: &Queue) -> watch::Receiver<u64> {
        let rings = self.rings.get_or_init(|| start(queue)).await;
        let mut mine = rings.clone();
        mine.borrow_and_update();
        mine
    }

    /// Waits up to `limit` for a bell to ring after `rung` was taken.
    pub(super) async fn wait(mut rung: watch::Receiver<u64>, limit: Duration) {
        let _ = tokio::time::timeout(limit, rung.changed()).await;
    }
}

/// Starts one watcher per partition, each from its bell's current last id
/// (read before this returns, so no ring after it is missed).
async fn start(queue: &Queue) -> watch::Receiver<u64> {
    let (tx, rx) = watch::channel(0u64);
    for (_, part) in queue.keys.parts() {
        let bell = part.bell();
        let last = last_id(queue, &bell).await;
        let (queue, tx) = (queue.clone_for_watcher(), tx.clone());
        tokio::spawn(async move { watch_bell(queue, bell, last, tx).await });
    }
    rx
}

/// The id of the bell's newest entry; `0-0` when it has none or cannot be
/// read (the watcher then wakes on its first ring, or readers find the
/// work within their own block time).
async fn last_id(queue: &Queue, bell: &str) -> String {
    let mut cmd = redis::cmd("XREVRANGE");
    cmd.arg(bell).arg("+").arg("-").arg("COUNT").arg(1);
    match queue.query::<Value>("XREVRANGE bell", &cmd).await {
        Ok(v) => newest_id(&v).unwrap_or_else(|| "0-0".to_owned()),
        Err(_) => "0-0".to_owned(),
    }
}

/// The last entry id anywhere in an `XREAD`/`XREVRANGE` reply.
fn newest_id(v: &Value) -> Option<String> {
    match v {
        Value::Array(items) => {
            // An entry is `[id, [fields…]]`: its first element is the id.
            if let (Some(first), Some(Value::Array(_))) = (items.first(), items.get(1)) {
                if let Some(b) = bytes(first) {
                    if items.len() == 2 && b.contains(&b'-') {
                        return Some(untrusted::lossy(b));
                    }
                }
            }
            items.iter().rev().find_map(newest_id)
        }
        Value::Map(pairs) => pairs.iter().rev().find_map(|(_, v)| newest_id(v)),
        _ => None,
    }
}

async fn watch_bell(queue: Queue, bell: String, mut last: String, tx: watch::Sender<u64>) {
    while !tx.is_closed() {
        let mut cmd = redis::cmd("XREAD");
        cmd.arg("COUNT")
            .arg(1)
            .arg("BLOCK")
            .arg(WATCH_BLOCK.as_millis() as u64)
            .arg("STREAMS")
            .arg(&bell)
            .arg(&last);
        match queue
            .blocking::<Value>("XREAD bell", WATCH_BLOCK, &cmd)
            .await
        {
            Ok(Value::Nil) => {}
            Ok(v) => {
                if let Some(id) = newest_id(&v) {
                    last = id;
                }
                tx.send_modify(|n| *n = n.wrapping_add(1));
            }
            Err(e) => {
                // Redis away or the bell broken by hand: readers still find
                // their work within their block time; look again soon.
                tracing::debug!(%bell, error = %e, "bell watcher could not wait; retrying");
                tokio::select! {
                    () = tx.closed() => return,
                    () = tokio::time::sleep(WATCH_BLOCK) => {}
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_newest_id_in_both_reply_shapes() {
        let entry = |id: &str| {
            Value::Array(vec![
                Value::BulkString(id.as_bytes().to_vec()),
                Value::Array(vec![Value::BulkString(b"r".to_vec())]),
            ])
        };
        let xread = Value::Array(vec![Value::Array(vec![
            Value::BulkString(b"{p:1}:ready:bell".to_vec()),
            Value::Array(vec![entry("5-0"), entry("7-1")]),
        ])]);
        assert_eq!(newest_id(&xread).as_deref(), Some("7-1"));
        let resp3 = Value::Map(vec![(
            Value::BulkString(b"bell".to_vec()),
            Value::Array(vec![entry("9-0")]),
        )]);
        assert_eq!(newest_id(&resp3).as_deref(), Some("9-0"));
        assert_eq!(newest_id(&Value::Array(vec![])), None);
    }
}
