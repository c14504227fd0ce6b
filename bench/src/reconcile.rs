//! `slotgate-bench reconcile`: the time of one reconciler pass next to a
//! long history. Fills a fresh database with `days` of finished history
//! (planned slots, their gate rows and their executions, made with
//! `generate_series`), plans today, and times `Reconciler::run_once`. A
//! pass should cost what is due in its window, so the figure should not
//! grow with the history, nor with the day planned ahead in the delayed
//! set. `--backlog N` puts the first `N` of today's due slots in the
//! stream first, as a fleet that far behind has them (each kind's
//! `starting_deadline` is then a week, so they are not missed): a pass
//! asks about the oldest, at the stream's head, and should not read the
//! rest.

use anyhow::{Context, Result};
use serde_json::{json, Value};
use slotgate::clock::SystemClock;
use slotgate::config::Config;
use slotgate::plan::Planner;
use slotgate::queue::{KeySpace, Queue};
use slotgate::reconcile::Reconciler;
use std::sync::Arc;
use std::time::{Duration, Instant};
use testkit::{TestDb, TestRedis};

/// `kinds` kinds of `slots` slots a day, over `days` past days: one
/// planned slot, one gate row and one execution per slot each.
pub async fn run(
    kinds: usize,
    slots: usize,
    days: usize,
    passes: usize,
    backlog: usize,
) -> Result<Value> {
    let db = TestDb::new().await;
    let redis = TestRedis::new();
    let times: Vec<String> = (0..slots)
        .map(|i| {
            let m = i * (24 * 60) / slots.max(1);
            format!("\"{:02}:{:02}\"", m / 60, m % 60)
        })
        .collect();
    let deadline = if backlog > 0 { "168h" } else { "2h" };
    let toml: String = (0..kinds)
        .map(|k| {
            format!(
                "[[kinds]]\nname = \"k{k}\"\ntimezone = \"UTC\"\nslots = [{}]\ndaily_cap = {slots}\nstarting_deadline = \"{deadline}\"\n",
                times.join(", ")
            )
        })
        .collect();
    let config = Arc::new(Config::parse(std::path::Path::new("bench.toml"), &toml)?);
    let history = history(&db.pool, kinds, slots, days).await?;
    let queue = || {
        Ok::<_, anyhow::Error>(Queue::new(
            slotgate::queue::pool(&redis.url, 4).map_err(anyhow::Error::msg)?,
            KeySpace::new(redis.prefix.clone()),
        ))
    };
    // Today as the planner lays it out: its window holds the day's slots.
    Planner {
        config: config.clone(),
        pool: db.pool.clone(),
        queue: queue()?,
        clock: Arc::new(SystemClock),
    }
    .plan(None, &[], false)
    .await
    .context("planning today")?;
    let reconciler = Reconciler {
        config,
        pool: db.pool.clone(),
        queue: queue()?,
        clock: Arc::new(SystemClock),
        worker_id: "bench".into(),
        grace: Duration::from_secs(2),
    };
    if backlog > 0 {
        let due: Vec<String> = sqlx::query_scalar(
            "SELECT kind || ':' || day || ':' || slot FROM planned_slot
              WHERE day = current_date AND due_at <= now() ORDER BY due_at, kind, slot LIMIT $1",
        )
        .bind(backlog as i64)
        .fetch_all(&db.pool)
        .await?;
        let q = queue()?;
        let now_ms = chrono::Utc::now().timestamp_millis();
        for key in &due {
            q.deliver(key, "planner", now_ms).await?;
        }
        println!("backlog: {} due slots in the stream", due.len());
    }
    // The first pass re-delivers today's due slots (nothing is queued yet)
    // and records those past their deadline; the passes timed are the
    // steady state a leader repeats every few seconds.
    reconciler
        .run_once(1, || true)
        .await
        .context("first pass")?;
    let mut ms = Vec::with_capacity(passes);
    for _ in 0..passes {
        let t = Instant::now();
        reconciler
            .run_once(1, || true)
            .await
            .context("reconcile pass")?;
        ms.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    let mut sorted = ms.clone();
    sorted.sort_by(|a, b| a.total_cmp(b));
    let median = crate::figures::median(&mut sorted.clone());
    println!("\n## reconcile: one leader pass next to {history} historical slots\n");
    println!(
        "| history rows (planned = gate = execution) | passes | median ms | min ms | max ms |"
    );
    println!("|---:|---:|---:|---:|---:|");
    println!(
        "| {history} | {passes} | {median:.1} | {:.1} | {:.1} |",
        sorted.first().copied().unwrap_or(f64::NAN),
        sorted.last().copied().unwrap_or(f64::NAN)
    );
    let v = json!({"history": history, "kinds": kinds, "slots_per_day": slots, "days": days, "backlog": backlog, "pass_ms": ms, "median_ms": median});
    crate::figures::emit("reconcile", v.clone());
    Ok(v)
}

/// Finished slots on the `days` days before today, all kinds; returns how
/// many slots that is.
async fn history(pool: &sqlx::PgPool, kinds: usize, slots: usize, days: usize) -> Result<i64> {
    let series = "FROM generate_series(0, $1 - 1) AS k,
                       generate_series(current_date - $3::int, current_date - 1, interval '1 day') AS d,
                       generate_series(1, $2) AS s";
    let at = "d + (s - 1) * (interval '1 day' / $2)";
    let statements = [
        format!(
            "INSERT INTO planned_slot (kind, day, slot, nominal_at, due_at, jitter_ms, source)
             SELECT 'k' || k, d::date, s, {at}, {at}, 0, 'bench' {series}"
        ),
        format!(
            "INSERT INTO publish_slot (day, slot, kind, state, claimed_by, created_at, updated_at)
             SELECT d::date, s, 'k' || k, 'published', 'bench', {at}, {at} {series}"
        ),
        format!(
            "INSERT INTO execution (slot_key, kind, day, slot, entry_id, caller, worker_id, outcome, due_at, started_at, finished_at)
             SELECT 'k' || k || ':' || to_char(d, 'YYYY-MM-DD') || ':' || s, 'k' || k, d::date, s,
                    'bench-' || k || '-' || to_char(d, 'YYYYMMDD') || '-' || s, 'planner', 'bench', 'published',
                    {at}, {at}, {at} {series}"
        ),
    ];
    for sql in &statements {
        sqlx::query(sql)
            .bind(kinds as i32)
            .bind(slots as i32)
            .bind(days as i32)
            .execute(pool)
            .await
            .with_context(|| format!("filling history: {sql}"))?;
    }
    sqlx::query("ANALYZE").execute(pool).await?;
    Ok(
        sqlx::query_scalar("SELECT count(*) FROM planned_slot WHERE source = 'bench'")
            .fetch_one(pool)
            .await?,
    )
}
