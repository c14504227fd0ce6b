//! `slotgate-bench forecast`: `planner forecast --json` (the release
//! binary, config to exit) for `kinds` kinds over `days` days, each kind
//! two slots a day with a cap of 2 and `drafts` ready drafts of three
//! priorities, next to the same command for one day in the same run: the
//! process, the config and the snapshot read, with almost no simulation.
//! The bound: 1,000 kinds × 14 days under 2 s.

use crate::figures::{emit, median};
use crate::stack::Stack;
use anyhow::{ensure, Context, Result};
use serde_json::{json, Value};

/// `runs` runs (a new database each) → medians of both commands.
pub async fn run(kinds: usize, days: usize, drafts: usize, runs: usize) -> Result<Value> {
    println!(
        "\n## Forecast: {kinds} kinds x {days} days, {drafts} drafts a kind; median of {runs} runs"
    );
    let (mut long, mut short) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        let stack = stack(kinds).await?;
        sqlx::query(
            "INSERT INTO draft (kind, title, ready_at, priority)
             SELECT 'k' || k, 'draft ' || g, now() - interval '1 hour', g % 3
               FROM generate_series(0, $1 - 1) k, generate_series(1, $2) g",
        )
        .bind(kinds as i32)
        .bind(drafts as i32)
        .execute(&stack.db().pool)
        .await?;
        let days_s = days.to_string();
        // Alternate the order, so neither command always runs on a warm cache.
        if long.len() % 2 == 0 {
            long.push(
                stack
                    .planner(&["forecast", "--days", &days_s, "--json"])?
                    .as_secs_f64(),
            );
            short.push(
                stack
                    .planner(&["forecast", "--days", "1", "--json"])?
                    .as_secs_f64(),
            );
        } else {
            short.push(
                stack
                    .planner(&["forecast", "--days", "1", "--json"])?
                    .as_secs_f64(),
            );
            long.push(
                stack
                    .planner(&["forecast", "--days", &days_s, "--json"])?
                    .as_secs_f64(),
            );
        }
    }
    check(kinds, days, drafts).await?;
    let all = json!({"forecast_s": long.clone(), "one_day_s": short.clone()});
    let (l, s) = (median(&mut long), median(&mut short));
    println!("{:<44} {:>9}", "", "seconds");
    println!(
        "{:<44} {:>9.3}",
        format!("planner forecast --days {days}"),
        l
    );
    println!("{:<44} {:>9.3}", "planner forecast --days 1 (baseline)", s);
    println!("{:<44} {:>9.2}", "ratio", l / s);
    let out = json!({"kinds": kinds, "days": days, "drafts_per_kind": drafts, "runs": runs,
        "forecast_s": l, "one_day_s": s, "ratio": l / s, "all": all});
    emit("forecast", out.clone());
    Ok(out)
}

/// What was timed did the work: on a stack like the timed ones, the JSON
/// names every kind and predicts each of them the drafts the calendar can
/// take (two a day, as many as there are).
async fn check(kinds: usize, days: usize, drafts: usize) -> Result<()> {
    let stack = stack(kinds).await?;
    stack.drafts("k0", drafts).await?;
    let out = stack
        .kit
        .planner_output(&["forecast", "--days", &days.to_string(), "--json"], &[])
        .await;
    let v: Value = serde_json::from_slice(&out.stdout).context("forecast JSON")?;
    let ks = v["kinds"].as_array().context("kinds")?;
    ensure!(
        ks.len() == kinds,
        "{} kinds forecast, not {kinds}",
        ks.len()
    );
    let publish: u64 = ks[0]["days"]
        .as_array()
        .context("days")?
        .iter()
        .map(|d| d["publish"].as_u64().unwrap_or(0))
        .sum();
    let want = drafts.min(2 * days) as u64;
    ensure!(
        publish == want,
        "k0: {publish} predicted publishes, not {want}"
    );
    Ok(())
}

/// A new database of `kinds` kinds, each two slots a day with a cap of 2.
async fn stack(kinds: usize) -> Result<Stack> {
    Stack::new(&crate::stack::kinds_toml(
        kinds,
        2,
        &|i| ["09:00", "15:00"][i].to_owned(),
        "0",
        2,
        "",
    ))
    .await
}
