//! `slotgate-bench herd`: many kinds at the same nominal second, jitter 0
//! against 60 s.

use crate::figures::{emit, percentile};
use crate::stack::{kinds_toml, stop_all, Stack};
use anyhow::Result;
use chrono::Utc;
use serde_json::{json, Value};
use std::time::{Duration, Instant};
use testkit::process::Proc;

pub(crate) async fn run(slots: usize, kinds: usize, jitter: u64) -> Result<Value> {
    let mut rows = Vec::new();
    println!("\n## Jitter at the top of the hour: {slots} slots of {kinds} kinds at one nominal second, 3 workers");
    println!(
        "{:>9} {:>22} {:>16} {:>18} {:>16}",
        "jitter s", "peak gate txns (avg)", "peak lock waits", "lock-wait samples", "p99 exec ms"
    );
    for j in [0, jitter] {
        // One instant for the slot's time and its day, so a run just before
        // midnight UTC plans the day the slot falls on.
        let when = Utc::now() + chrono::Duration::seconds(8);
        let at = when.format("%H:%M:%S").to_string();
        let per = slots / kinds;
        let stack = Stack::new(&kinds_toml(
            kinds,
            per,
            &|_| at.clone(),
            &format!("{j}s"),
            per,
            "",
        ))
        .await?;
        for k in 0..kinds {
            stack.drafts(&format!("k{k}"), per).await?;
        }
        stack.plan(when.date_naive()).await?;
        let mut procs: Vec<Proc> = (0..3)
            .map(|i| {
                stack.worker(
                    &format!("h{i}"),
                    &["--concurrency", "8", "--lease-ttl", "3s"],
                )
            })
            .collect();
        // Sample the database's sessions every 10 ms while slots run.
        let sampler = sqlx::PgPool::connect(&stack.db().url).await?;
        let (mut peak_tx, mut peak_wait, mut wait_samples, mut sum_tx, mut n_samples) =
            (0i64, 0i64, 0i64, 0i64, 0i64);
        let deadline = Instant::now() + Duration::from_secs(j + 120);
        loop {
            let (tx, waits): (i64, i64) = sqlx::query_as(
                "SELECT count(*) FILTER (WHERE state IN ('active', 'idle in transaction') AND xact_start IS NOT NULL),
                        count(*) FILTER (WHERE wait_event_type = 'Lock')
                   FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'slotgate'",
            )
            .fetch_one(&sampler)
            .await?;
            if tx > 0 {
                sum_tx += tx;
                n_samples += 1;
            }
            peak_tx = peak_tx.max(tx);
            peak_wait = peak_wait.max(waits);
            wait_samples += waits;
            if stack.count("SELECT count(*) FROM execution").await >= slots as i64
                || Instant::now() > deadline
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        stop_all(&mut procs);
        let mut lat: Vec<f64> = sqlx::query_scalar(
            "SELECT EXTRACT(EPOCH FROM finished_at - started_at)::float8 * 1000 FROM execution",
        )
        .fetch_all(&stack.db().pool)
        .await?;
        lat.sort_by(|a, b| a.total_cmp(b));
        let p99 = percentile(&lat, 0.99);
        let avg = if n_samples > 0 {
            sum_tx as f64 / n_samples as f64
        } else {
            0.0
        };
        println!(
            "{:>9} {:>15} ({:>4.1}) {:>16} {:>18} {:>16.1}",
            j, peak_tx, avg, peak_wait, wait_samples, p99
        );
        rows.push(json!({"jitter_s": j, "peak_gate_transactions": peak_tx, "avg_gate_transactions": avg, "peak_lock_waits": peak_wait, "lock_wait_samples": wait_samples, "p99_execution_ms": p99}));
    }
    let v = json!({"slots": slots, "kinds": kinds, "rows": rows});
    emit("herd", v.clone());
    Ok(v)
}
