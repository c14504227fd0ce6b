//! `slotgate-bench plan`: `planner plan` of one day of `kinds` × `slots`
//! slots (the release binary, config to exit), then the same plan again
//! (it must add nothing), next to the ceiling measured in the same run on
//! the same rows: a bare `COPY` of the planned rows into a scratch copy of
//! `planned_slot` plus a bare pipelined `ZADD` of the same members into a
//! scratch sorted set. Also Redis bytes per queued slot.

use crate::figures::{emit, median};
use crate::stack::Stack;
use anyhow::{ensure, Result};
use serde_json::{json, Value};
use std::time::Instant;

/// A far day, so every slot is in the future and goes to the delayed set.
const DAY: &str = "2030-01-15";

/// Members per `ZADD` and commands per pipeline of the Redis ceiling.
const ZADD_CHUNK: usize = 1000;

/// Slot `i` of a day of `slots` (at most 86,400): distinct seconds.
fn time(i: usize, slots: usize) -> String {
    let s = i * 86_400 / slots.max(1);
    format!("{:02}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
}

struct Once {
    plan: f64,
    replan: f64,
    pg_ceiling: f64,
    redis_ceiling: f64,
    bytes_per_slot: f64,
}

/// The Redis half of the ceiling: the delayed set's members and scores
/// written again into a scratch key with pipelined `ZADD`s → seconds.
async fn zadd_ceiling(stack: &Stack) -> Result<f64> {
    let mut c = stack.kit.redis.conn().await;
    let delayed = stack.queue().keys().delayed();
    let members: Vec<(String, i64)> = redis::cmd("ZRANGE")
        .arg(&delayed)
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query_async(&mut c)
        .await?;
    let scratch = format!("{}:bench-scratch", stack.kit.redis.prefix);
    let started = Instant::now();
    for group in members.chunks(ZADD_CHUNK * 50) {
        let mut p = redis::pipe();
        for chunk in group.chunks(ZADD_CHUNK) {
            let cmd = p.cmd("ZADD").arg(&scratch).arg("NX");
            for (m, score) in chunk {
                cmd.arg(*score).arg(m);
            }
            cmd.ignore();
        }
        p.query_async::<()>(&mut c).await?;
    }
    let took = started.elapsed().as_secs_f64();
    redis::cmd("DEL")
        .arg(&scratch)
        .query_async::<()>(&mut c)
        .await?;
    Ok(took)
}

async fn once(kinds: usize, slots: usize) -> Result<Once> {
    let stack = Stack::new(&crate::stack::kinds_toml(
        kinds,
        slots,
        &|i| time(i, slots),
        "10m",
        slots,
        "",
    ))
    .await?;
    let total = (kinds * slots) as i64;
    let plan = stack.planner(&["plan", "--day", DAY])?.as_secs_f64();
    let replan = stack.planner(&["plan", "--day", DAY])?.as_secs_f64();
    ensure!(
        stack.count("SELECT count(*) FROM planned_slot").await == total,
        "planned_slot does not hold {total} rows"
    );
    let mut c = stack.kit.redis.conn().await;
    let delayed = stack.queue().keys().delayed();
    let queued: i64 = redis::cmd("ZCARD")
        .arg(&delayed)
        .query_async(&mut c)
        .await?;
    ensure!(
        queued == total,
        "the delayed set holds {queued}, not {total}"
    );
    let bytes: i64 = redis::cmd("MEMORY")
        .arg("USAGE")
        .arg(&delayed)
        .arg("SAMPLES")
        .arg(0)
        .query_async(&mut c)
        .await?;
    Ok(Once {
        plan,
        replan,
        pg_ceiling: stack.copy_ceiling("planned_slot").await?,
        redis_ceiling: zadd_ceiling(&stack).await?,
        bytes_per_slot: bytes as f64 / total as f64,
    })
}

/// `runs` runs of planning `kinds` × `slots` slots → medians and ratio.
pub async fn run(kinds: usize, slots: usize, runs: usize) -> Result<Value> {
    let total = kinds * slots;
    println!("\n## Plan: one day of {kinds} kinds x {slots} slots = {total} slots; median of {runs} runs");
    let mut r = Vec::new();
    for _ in 0..runs {
        r.push(once(kinds, slots).await?);
    }
    let col = |f: fn(&Once) -> f64| -> Vec<f64> { r.iter().map(f).collect() };
    let all = json!({
        "plan_s": col(|o| o.plan), "replan_s": col(|o| o.replan),
        "pg_copy_ceiling_s": col(|o| o.pg_ceiling), "redis_zadd_ceiling_s": col(|o| o.redis_ceiling),
        "delayed_bytes_per_slot": col(|o| o.bytes_per_slot),
    });
    let plan = median(&mut col(|o| o.plan));
    let replan = median(&mut col(|o| o.replan));
    let pg = median(&mut col(|o| o.pg_ceiling));
    let zadd = median(&mut col(|o| o.redis_ceiling));
    let ceiling = median(&mut col(|o| o.pg_ceiling + o.redis_ceiling));
    let bytes = median(&mut col(|o| o.bytes_per_slot));
    let rate = |s: f64| total as f64 / s;
    println!("{:<48} {:>9} {:>12}", "", "seconds", "slots/s");
    println!(
        "{:<48} {:>9.2} {:>12.0}",
        "planner plan (whole CLI, all new)",
        plan,
        rate(plan)
    );
    println!(
        "{:<48} {:>9.2} {:>12.0}",
        "planner plan again (nothing new)",
        replan,
        rate(replan)
    );
    println!(
        "{:<48} {:>9.2} {:>12.0}",
        "ceiling: bare COPY + pipelined ZADD",
        ceiling,
        rate(ceiling)
    );
    println!(
        "{:<48} {:>9.2}",
        "  of which COPY into planned_slot's copy", pg
    );
    println!("{:<48} {:>9.2}", "  of which ZADD into a scratch set", zadd);
    println!(
        "ratio to the ceiling {:.2}; delayed set {:.1} bytes per queued slot",
        ceiling / plan,
        bytes
    );
    let v = json!({
        "kinds": kinds, "slots_per_kind": slots, "slots": total, "runs": runs,
        "plan_s": plan, "replan_s": replan, "ceiling_s": ceiling,
        "pg_copy_ceiling_s": pg, "redis_zadd_ceiling_s": zadd,
        "ratio_to_ceiling": ceiling / plan, "delayed_bytes_per_slot": bytes, "all": all,
    });
    emit("plan", v.clone());
    Ok(v)
}
