//! `slotgate-bench migration`: a future index build on a large `execution`
//! table while a worker delivers slots (issue 26.6, DESIGN "writing a
//! migration"). The same build runs two ways, each on a fresh stack in the
//! same run: the way the three released migrations build their index
//! (`CREATE INDEX` inside the migration's transaction: it takes a `SHARE`
//! lock, so every insert into the table waits for the whole build) and the
//! way the migrations lint now requires (`CREATE INDEX CONCURRENTLY`, alone
//! in a `-- no-transaction` file: inserts go on). The figure is the
//! scheduling lag of the slots due while the index builds, next to the lag
//! of the slots due outside it (the baseline of the same run).

use crate::figures::{emit, percentile};
use crate::stack::{kinds_toml, stop_all, Stack};
use anyhow::Result;
use chrono::{DateTime, Utc};
use serde_json::{json, Value};
use std::time::{Duration, Instant};
use testkit::process::Proc;

/// The index a future migration might add: executions by kind and
/// outcome in time order (a report's filter).
const INDEX: &str = "execution (kind, outcome, started_at)";

#[derive(Clone, Copy, PartialEq)]
enum Build {
    Blocking,
    Concurrently,
}

impl Build {
    fn name(self) -> &'static str {
        match self {
            Build::Blocking => "CREATE INDEX (in a transaction)",
            Build::Concurrently => "CREATE INDEX CONCURRENTLY",
        }
    }
}

/// What one build did to the deliveries around it.
struct Measured {
    build_s: f64,
    during: Vec<f64>,
    outside: Vec<f64>,
}

pub async fn run(rows: usize, per_sec: usize, seconds: usize) -> Result<Value> {
    let mut out = Vec::new();
    println!(
        "\n## Index build on execution ({rows} rows) with a worker delivering {per_sec} slots/s"
    );
    println!(
        "{:<34} {:>8} {:>8} {:>12} {:>12} {:>12} {:>14}",
        "build", "build s", "due in it", "lag p50 ms", "lag p99 ms", "lag max ms", "outside p99 ms"
    );
    for build in [Build::Blocking, Build::Concurrently] {
        let m = once(build, rows, per_sec, seconds).await?;
        let mut during = m.during.clone();
        during.sort_by(|a, b| a.total_cmp(b));
        let mut outside = m.outside.clone();
        outside.sort_by(|a, b| a.total_cmp(b));
        let (p50, p99, max) = (
            percentile(&during, 0.5),
            percentile(&during, 0.99),
            during.last().copied().unwrap_or(f64::NAN),
        );
        let base = percentile(&outside, 0.99);
        println!(
            "{:<34} {:>8.2} {:>8} {:>12.1} {:>12.1} {:>12.1} {:>14.1}",
            build.name(),
            m.build_s,
            during.len(),
            p50,
            p99,
            max,
            base
        );
        out.push(
            json!({"build": build.name(), "build_s": m.build_s, "due_during": during.len(),
            "lag_p50_ms": p50, "lag_p99_ms": p99, "lag_max_ms": max, "outside_p99_ms": base}),
        );
    }
    let v = json!({"rows": rows, "per_second": per_sec, "builds": out});
    emit("migration", v.clone());
    Ok(v)
}

async fn once(build: Build, rows: usize, per_sec: usize, seconds: usize) -> Result<Measured> {
    let slots = per_sec * seconds;
    // The schedule is written once the table is filled, so the first slot
    // is not due before the worker runs (a fill takes seconds).
    let mut stack = Stack::new(&kinds_toml(1, 1, &|_| "00:00".into(), "0", 1, "")).await?;
    // A table of `rows` past executions, as months of a busy installation
    // leave it (other kinds, so the worker's own rows are told apart).
    sqlx::query(
        "INSERT INTO execution (slot_key, kind, day, slot, caller, worker_id, outcome, reason, detail, due_at, started_at, finished_at)
         SELECT 'old:' || g, 'old' || (g % 7), DATE '2026-01-01' + (g % 300)::int, (g % 100 + 1)::int, 'planner', 'w',
                (ARRAY['published', 'skipped', 'failed'])[g % 3 + 1], NULL, '{}'::jsonb,
                now() - g * interval '1 s', now() - g * interval '1 s', now() - g * interval '1 s'
           FROM generate_series(1, $1) g",
    )
    .bind(rows as i64)
    .execute(&stack.db().pool)
    .await?;
    sqlx::query("ANALYZE execution")
        .execute(&stack.db().pool)
        .await?;
    let start = Utc::now() + chrono::Duration::seconds(10);
    let time = |i: usize| {
        (start + chrono::Duration::seconds((i / per_sec) as i64))
            .format("%H:%M:%S")
            .to_string()
    };
    std::fs::write(
        &stack.kit.config,
        kinds_toml(1, slots, &time, "1s", slots, ""),
    )?;
    stack.config = std::sync::Arc::new(slotgate::config::Config::load(&stack.kit.config)?);
    stack.drafts("k0", slots).await?;
    stack.plan(start.date_naive()).await?;
    let mut procs: Vec<Proc> =
        vec![stack.worker("m0", &["--concurrency", "8", "--lease-ttl", "3s"])];
    // The build starts a third of the way into the slots' window.
    let at = start + chrono::Duration::seconds(seconds as i64 / 3);
    if let Ok(wait) = (at - Utc::now()).to_std() {
        tokio::time::sleep(wait).await;
    }
    let mut conn = {
        use sqlx::Connection;
        sqlx::PgConnection::connect(&stack.db().url).await?
    };
    let began: DateTime<Utc> = Utc::now();
    let t = Instant::now();
    match build {
        Build::Blocking => {
            use sqlx::Connection;
            let mut tx = conn.begin().await?;
            sqlx::query(&format!("CREATE INDEX bench_build ON {INDEX}"))
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
        }
        Build::Concurrently => {
            sqlx::query(&format!("CREATE INDEX CONCURRENTLY bench_build ON {INDEX}"))
                .execute(&mut conn)
                .await?;
        }
    }
    let build_s = t.elapsed().as_secs_f64();
    let ended = Utc::now();
    stack
        .wait_count(
            "SELECT count(*) FROM execution WHERE kind = 'k0'",
            slots as i64,
            Duration::from_secs(seconds as u64 + 120),
            &mut procs,
        )
        .await?;
    stop_all(&mut procs);
    let lags: Vec<(DateTime<Utc>, f64)> = sqlx::query_as(
        "SELECT p.due_at, EXTRACT(EPOCH FROM min(e.finished_at) - p.due_at)::float8 * 1000
           FROM execution e JOIN planned_slot p ON p.kind = e.kind AND p.day = e.day AND p.slot = e.slot
          WHERE e.kind = 'k0'
          GROUP BY p.kind, p.day, p.slot, p.due_at",
    )
    .fetch_all(&stack.db().pool)
    .await?;
    let (during, outside): (Vec<_>, Vec<_>) = lags
        .into_iter()
        .partition(|(due, _)| *due >= began && *due <= ended);
    Ok(Measured {
        build_s,
        during: during.into_iter().map(|(_, l)| l).collect(),
        outside: outside.into_iter().map(|(_, l)| l).collect(),
    })
}
