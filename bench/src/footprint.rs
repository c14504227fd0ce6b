//! `slotgate-bench footprint`: Redis bytes per queued slot and a worker's
//! peak RSS.

use crate::figures::emit;
use anyhow::Result;
use serde_json::{json, Value};
use testkit::TestRedis;

pub(crate) async fn run(slots: usize) -> Result<Value> {
    let redis = TestRedis::new();
    let q = slotgate::queue::Queue::new(
        slotgate::queue::pool(&redis.url, 4).expect("redis"),
        slotgate::queue::KeySpace::new(redis.prefix.clone()),
    );
    let base_day = chrono::NaiveDate::from_ymd_opt(2026, 9, 25).unwrap();
    let keys: Vec<(String, i64)> = (0..slots)
        .map(|i| {
            (
                format!(
                    "article:{}:{}",
                    base_day + chrono::Days::new((i / 1000) as u64),
                    i % 1000 + 1
                ),
                1_790_000_000_000 + i as i64,
            )
        })
        .collect();
    let payload: usize = keys.iter().map(|(k, _)| k.len() + 8).sum();
    q.schedule(&keys).await?;
    let mut c = redis.conn().await;
    let delayed: i64 = redis::cmd("MEMORY")
        .arg("USAGE")
        .arg(q.keys().delayed())
        .arg("SAMPLES")
        .arg(0)
        .query_async(&mut c)
        .await?;
    for chunk in keys.chunks(1000) {
        let mut p = redis::pipe();
        for (k, _) in chunk {
            p.cmd("XADD")
                .arg(q.keys().ready())
                .arg("*")
                .arg("slot")
                .arg(k)
                .arg("caller")
                .arg("planner")
                .arg("enqueued_at")
                .arg(1_790_000_000_000i64)
                .ignore();
        }
        p.query_async::<()>(&mut c).await?;
    }
    let stream: i64 = redis::cmd("MEMORY")
        .arg("USAGE")
        .arg(q.keys().ready())
        .arg("SAMPLES")
        .arg(0)
        .query_async(&mut c)
        .await?;
    let (zb, sb, pb) = (
        delayed as f64 / slots as f64,
        stream as f64 / slots as f64,
        payload as f64 / slots as f64,
    );
    println!("\n## Footprint: {slots} queued slots");
    println!("{:<34} {:>12}", "", "bytes/slot");
    println!("{:<34} {:>12.1}", "delayed set (planned, not due)", zb);
    println!("{:<34} {:>12.1}", "ready stream (due, not handled)", sb);
    println!("{:<34} {:>12.1}", "baseline: raw key + score", pb);
    let v = json!({"slots": slots, "delayed_bytes_per_slot": zb, "stream_bytes_per_slot": sb, "raw_payload_bytes_per_slot": pb});
    emit("footprint", v.clone());
    Ok(v)
}
