//! `slotgate-bench lag`: slots due spread over a window → scheduling lag
//! p50/p99/max, next to a bare Redis hand-off.

use crate::figures::{emit, median, percentile};
use crate::stack::{kinds_toml, stop_all, Stack};
use anyhow::Result;
use chrono::Utc;
use serde_json::{json, Value};
use std::time::{Duration, Instant};
use testkit::process::Proc;
use testkit::TestRedis;

pub(crate) async fn run(slots: usize, seconds: usize) -> Result<Value> {
    // Slots at whole seconds from now+5 s on, jittered across their second:
    // `slots / seconds` due per second, uniformly.
    let start = Utc::now() + chrono::Duration::seconds(5);
    let per_sec = slots / seconds;
    let time = |i: usize| {
        (start + chrono::Duration::seconds((i / per_sec) as i64))
            .format("%H:%M:%S")
            .to_string()
    };
    let stack = Stack::new(&kinds_toml(1, slots, &time, "1s", slots, "")).await?;
    stack.drafts("k0", slots).await?;
    let day = start.date_naive();
    stack.plan(day).await?;
    let mut procs: Vec<Proc> = (0..2)
        .map(|i| {
            stack.worker(
                &format!("l{i}"),
                &["--concurrency", "8", "--lease-ttl", "3s"],
            )
        })
        .collect();
    // Baseline: a bare XADD → XREADGROUP hand-off on the same Redis.
    let base = redis_handoff_ms(&stack.kit.redis).await?;
    stack
        .wait_count(
            "SELECT count(*) FROM execution",
            slots as i64,
            Duration::from_secs(seconds as u64 + 120),
            &mut procs,
        )
        .await?;
    stop_all(&mut procs);
    let mut lags: Vec<f64> = sqlx::query_scalar(
        "SELECT EXTRACT(EPOCH FROM min(e.started_at) - p.due_at)::float8 * 1000
           FROM execution e JOIN planned_slot p ON p.kind = e.kind AND p.day = e.day AND p.slot = e.slot
          GROUP BY p.kind, p.day, p.slot, p.due_at",
    )
    .fetch_all(&stack.db().pool)
    .await?;
    lags.sort_by(|a, b| a.total_cmp(b));
    let (p50, p99, max) = (
        percentile(&lags, 0.5),
        percentile(&lags, 0.99),
        lags.last().copied().unwrap_or(f64::NAN),
    );
    println!("\n## Scheduling lag: {slots} slots due over {seconds} s ({per_sec}/s), 2 workers");
    println!(
        "{:>10} {:>10} {:>10} {:>26}",
        "p50 ms", "p99 ms", "max ms", "baseline XADD→XREAD p50 ms"
    );
    println!("{:>10.1} {:>10.1} {:>10.1} {:>26.2}", p50, p99, max, base);
    let v = json!({"slots": slots, "seconds": seconds, "per_second": per_sec, "p50_ms": p50, "p99_ms": p99, "max_ms": max, "baseline_handoff_p50_ms": base});
    emit("lag", v.clone());
    Ok(v)
}

pub(crate) async fn redis_handoff_ms(redis: &TestRedis) -> Result<f64> {
    let mut c = redis.conn().await;
    let key = format!("{}:handoff", redis.prefix);
    let _: redis::Value = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(&key)
        .arg("g")
        .arg("0")
        .arg("MKSTREAM")
        .query_async(&mut c)
        .await?;
    let mut reader = redis.conn().await;
    let mut samples = Vec::new();
    for _ in 0..200 {
        let t = Instant::now();
        let _: String = redis::cmd("XADD")
            .arg(&key)
            .arg("*")
            .arg("slot")
            .arg("x")
            .query_async(&mut c)
            .await?;
        let _: redis::Value = redis::cmd("XREADGROUP")
            .arg("GROUP")
            .arg("g")
            .arg("c")
            .arg("COUNT")
            .arg(1)
            .arg("BLOCK")
            .arg(1000)
            .arg("STREAMS")
            .arg(&key)
            .arg(">")
            .query_async(&mut reader)
            .await?;
        samples.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    Ok(median(&mut samples))
}
