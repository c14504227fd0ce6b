//! `slotgate-bench failover`: `kill -9` of the leader under load →
//! seconds until the next promotion, per lease TTL.

use crate::figures::emit;
use crate::stack::{kinds_toml, stop_all, Stack};
use anyhow::{bail, Context, Result};
use chrono::Utc;
use serde_json::{json, Value};
use std::time::{Duration, Instant};
use testkit::process::Proc;

/// Per lease TTL: a fresh stack with 3 workers and 10 slots due per
/// second, `kill -9` of the leader, then the seconds until the next
/// promotion (the ready stream grows again) and until another worker
/// holds the lease.
pub(crate) async fn run(ttls: &[u64]) -> Result<Value> {
    let mut rows = Vec::new();
    println!(
        "\n## Failover: kill -9 of the leader under load (10 slots due per second), 3 workers"
    );
    println!(
        "{:>8} {:>18} {:>14} {:>10}",
        "ttl s", "next promotion s", "new leader s", "÷ ttl"
    );
    for &ttl in ttls {
        let start = Utc::now() + chrono::Duration::seconds(2);
        let secs = 40 + ttl as usize;
        let time = |i: usize| {
            (start + chrono::Duration::seconds((i / 10) as i64))
                .format("%H:%M:%S")
                .to_string()
        };
        let stack = Stack::new(&kinds_toml(1, secs * 10, &time, "1s", secs * 10, "")).await?;
        stack.drafts("k0", secs * 10).await?;
        stack.plan(start.date_naive()).await?;
        let ttl_s = format!("{ttl}s");
        let mut procs: Vec<Proc> = (0..3)
            .map(|i| {
                stack.worker(
                    &format!("f{i}"),
                    &["--lease-ttl", &ttl_s, "--concurrency", "8"],
                )
            })
            .collect();
        let mut c = stack.kit.redis.conn().await;
        let leader_key = slotgate::queue::KeySpace::new(stack.kit.redis.prefix.as_str()).leader();
        let ready_key = slotgate::queue::KeySpace::new(stack.kit.redis.prefix.as_str())
            .part(0)
            .ready();
        let leader = first_leader(&mut c, &leader_key).await?;
        tokio::time::sleep(Duration::from_secs(3)).await;
        let id = leader.rsplit_once(':').unwrap().0.to_owned();
        let victim = procs
            .iter()
            .position(|p| p.name == id)
            .context("leader process")?;
        if let Err(st) = procs[victim].kill_9() {
            bail!("the leader had exited by itself before kill -9: {st}");
        }
        let killed = Instant::now();
        let before = entries_added(&c, &ready_key).await;
        let mut promoted = None;
        let mut new_leader = None;
        while killed.elapsed() < Duration::from_secs(ttl * 3 + 10)
            && (promoted.is_none() || new_leader.is_none())
        {
            if promoted.is_none() && entries_added(&c, &ready_key).await > before {
                promoted = Some(killed.elapsed().as_secs_f64());
            }
            if new_leader.is_none() {
                let v: Option<String> = redis::cmd("GET")
                    .arg(&leader_key)
                    .query_async(&mut c)
                    .await?;
                if v.is_some_and(|v| !v.starts_with(&format!("{id}:"))) {
                    new_leader = Some(killed.elapsed().as_secs_f64());
                }
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        procs.remove(victim);
        stop_all(&mut procs);
        let p = promoted.context("no promotion after the kill")?;
        println!(
            "{:>8} {:>18.2} {:>14.2} {:>10.2}",
            ttl,
            p,
            new_leader.unwrap_or(f64::NAN),
            p / ttl as f64
        );
        rows.push(json!({"ttl_s": ttl, "next_promotion_s": p, "new_leader_s": new_leader, "ratio_to_ttl": p / ttl as f64}));
    }
    let v = json!({"rows": rows});
    emit("failover", v.clone());
    Ok(v)
}

/// The leader lease's holder, once there is one (30 s at most).
async fn first_leader(
    c: &mut redis::aio::MultiplexedConnection,
    leader_key: &str,
) -> Result<String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(v) = redis::cmd("GET")
            .arg(leader_key)
            .query_async::<Option<String>>(c)
            .await?
        {
            return Ok(v);
        }
        if Instant::now() > deadline {
            bail!("no leader");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Entries ever added to the ready stream `key` (`XINFO STREAM`'s
/// `entries-added`; 0 when it cannot be read): a rise after the kill is
/// the next promotion.
async fn entries_added(c: &redis::aio::MultiplexedConnection, key: &str) -> i64 {
    let mut c = c.clone();
    let v: Vec<redis::Value> = redis::cmd("XINFO")
        .arg("STREAM")
        .arg(key)
        .query_async(&mut c)
        .await
        .unwrap_or_default();
    let mut it = v.iter();
    while let Some(k) = it.next() {
        if let redis::Value::BulkString(b) = k {
            if b == b"entries-added" {
                if let Some(redis::Value::Int(n)) = it.next() {
                    return *n;
                }
            }
        }
    }
    0
}
