//! `slotgate-bench breakdown` (issue 43): where a burst's work goes
//! (record-only, or webhook with `--modes webhook`), on the user's path (`burst --shapes user`: drafts by the release
//! `planner drafts import`, workers started, then `planner plan` of the day
//! while they run) and the bench's (`interleaved`: drafts inserted and the
//! day planned in-process before the workers start). Per shape: CPU-seconds
//! per 10,000 slots of the workers, the planner, Postgres and Redis; Redis
//! commands per slot; Postgres statements per slot; how many of the cores
//! the burst kept busy (all those CPU-seconds over its wall time: below
//! the machine's cores, the burst waits on something other than CPU); and
//! the slot rate next to the batched-write ceiling, as `burst` reports it
//! (webhook: next to its bound, the two-phase writes and the calls alone).
//! It also measures the ceiling's own CPU per slot (Postgres and the
//! bench's clients, over its timed section; webhook: the two-phase floor's
//! and one call's, the bench's client and stand-in CMS) and sets it over
//! the burst's: the ratio the burst would reach if both were bound by the
//! cores alone. A ratio below that is lost to waits; the distance from it
//! to 1 is what a slot costs beyond the least it must write (the draft
//! pick, the plan read, Redis, the workers). And Postgres's planning time
//! per slot (`pg_stat_statements.track_planning`): a statement planned for
//! its rows on every call pays it per call.
//! The bench's own CPU is a class too: in webhook mode it serves the
//! stand-in CMS the workers call.
//!
//! The burst is `burst`'s own ([`burst::timed_burst`]), run on a Postgres
//! and a Redis the bench starts for itself, so that their CPU and their
//! statistics hold nothing but the burst. What is measured is the timed
//! section: from just before the workers start to the moment every slot
//! is recorded. The drafts' import (`user`), and in every shape but
//! `user` the day's planning, happen before it and are not counted. Inside
//! it the bench polls `SELECT count(*) FROM execution` every 250 ms: that
//! statement is left out of the counts, its backend's CPU is not (a few
//! milliseconds a poll).

use crate::burst::{self, Probe, Spec, Timed};
use crate::ceiling;
use crate::figures::{emit, median};
use crate::procstat;
use crate::stack::{Servers, Stack};
use anyhow::{Context, Result};
use serde_json::{json, Value};
use std::time::Duration;
use testkit::cms::Cms;
use testkit::process::Proc;
use testkit::server::{redis_cli, OwnedPostgres, OwnedRedis};

/// The bench's own Postgres: `pg_stat_statements` loaded, and durability and
/// buffers as on the shared server the `burst` rows of BENCHMARKS.md were
/// measured on (a throwaway server's default is `fsync = off`).
const POSTGRES_SETTINGS: &[(&str, &str)] = &[
    ("shared_preload_libraries", "pg_stat_statements"),
    // Planning is CPU too: a statement planned for its rows on every call
    // (`store::claim_still_held!`) pays it per call.
    ("pg_stat_statements.track_planning", "on"),
    ("fsync", "on"),
    ("shared_buffers", "128MB"),
];

/// The bench's own statements inside the section, not counted: its poll
/// for the end (exactly this text), and the statistics' reset and read.
const POLL: &str = "SELECT count(*) FROM execution";

/// Commands the bench itself sends its Redis (through `redis-cli`): the
/// statistics' reset and read.
const OWN_COMMANDS: &[&str] = &["info", "config"];

/// How many of the top commands and statements are shown.
const TOP: usize = 8;

/// Process classes, in the table's order: `bench` is this process (its
/// poll, and in webhook mode the stand-in CMS it serves).
const CLASSES: [&str; 5] = ["workers", "planner", "postgres", "redis", "bench"];

/// What one run measured.
struct Run {
    /// Slots recorded.
    n: f64,
    rate: f64,
    /// The section's wall time, seconds.
    secs: f64,
    /// CPU-seconds in the section, per [`CLASSES`]; the planner's is `None`
    /// where it ran before the section (in-process).
    cpu: [Option<f64>; 5],
    /// What the rate is measured against, metered (Postgres and this
    /// process over each yardstick's timed section).
    least: Least,
    /// Redis commands (lower case) and their calls, most first.
    commands: Vec<(String, u64)>,
    /// Statements, most execution time first.
    statements: Vec<Statement>,
}

/// One statement's figures over the section (`pg_stat_statements`).
#[derive(sqlx::FromRow)]
struct Statement {
    query: String,
    calls: i64,
    rows: i64,
    /// Milliseconds executing, and planning (`track_planning`).
    total_exec_time: f64,
    total_plan_time: f64,
}

/// The least a slot must cost, measured right after the burst on its
/// database with the same meter: what its rate is set against and what its
/// CPU per slot is set against.
#[derive(Clone, Copy)]
enum Least {
    /// Record-only: the batched-write ceiling's run.
    Settle(ceiling::Metered),
    /// Webhook: the two-phase write floor and the calls alone, whose
    /// [`bound`](ceiling::WebhookYardsticks::bound) the rate is set
    /// against, and whose CPU per slot is the floor's plus one call's.
    Webhook(ceiling::WebhookYardsticks),
}

impl Least {
    /// Slots per second.
    fn rate(&self) -> f64 {
        match self {
            Least::Settle(c) => c.rate,
            Least::Webhook(y) => y.bound(),
        }
    }

    fn cpu_per_10k(&self) -> f64 {
        match self {
            Least::Settle(c) => c.cpu_per_10k(),
            Least::Webhook(y) => y.cpu_per_10k(),
        }
    }

    /// Cores kept busy: the ceiling's, or the two-phase floor's.
    fn cores_busy(&self) -> f64 {
        match self {
            Least::Settle(c) => c.cores_busy(),
            Least::Webhook(y) => y.floor.cores_busy(),
        }
    }

    /// Webhook: the floor's and one call's CPU-seconds per 10,000 and the
    /// cores each kept busy.
    fn parts(&self) -> Value {
        match self {
            Least::Settle(_) => Value::Null,
            Least::Webhook(y) => json!({
                "floor_cpu_s_per_10k_slots": y.floor.cpu_per_10k(), "floor_cores_busy": y.floor.cores_busy(),
                "calls_cpu_s_per_10k_calls": y.calls.cpu_per_10k(), "calls_cores_busy": y.calls.cores_busy()}),
        }
    }
}

impl Run {
    fn commands_per_slot(&self) -> f64 {
        self.commands.iter().map(|(_, c)| *c as f64).sum::<f64>() / self.n
    }

    fn statements_per_slot(&self) -> f64 {
        self.statements.iter().map(|s| s.calls as f64).sum::<f64>() / self.n
    }

    /// Microseconds Postgres spent planning, per slot.
    fn plan_us_per_slot(&self) -> f64 {
        self.statements
            .iter()
            .map(|s| s.total_plan_time)
            .sum::<f64>()
            * 1000.0
            / self.n
    }

    /// CPU-seconds per 10,000 slots of class `i`.
    fn per_10k(&self, i: usize) -> Option<f64> {
        self.cpu[i].map(|s| s * 10_000.0 / self.n)
    }

    /// Cores kept busy: every class's CPU-seconds over the wall time.
    fn busy(&self) -> f64 {
        self.cpu.iter().flatten().sum::<f64>() / self.secs
    }

    /// Every class's CPU-seconds per 10,000 slots.
    fn total_per_10k(&self) -> f64 {
        (0..CLASSES.len()).filter_map(|i| self.per_10k(i)).sum()
    }

    /// The ratio the burst would reach if it and its yardsticks were all
    /// bound by the same cores and nothing else: their CPU per slot over
    /// the burst's. A ratio below it is lost to waits; the rest of the way
    /// to 1 is the CPU a slot costs beyond the least it must write (and,
    /// webhook, beyond its call).
    fn cpu_bound(&self) -> f64 {
        self.least.cpu_per_10k() / self.total_per_10k()
    }
}

/// The [`Probe`] that measures a burst on the bench's own servers.
#[derive(Default)]
struct Meter {
    postmaster: i32,
    redis_pid: i32,
    redis_port: u16,
    /// Postgres's, Redis's and the bench's own CPU at the start.
    postgres_at_start: Duration,
    redis_at_start: Duration,
    bench_at_start: Duration,
    planner: Option<Duration>,
    /// Per [`CLASSES`], filled at the end.
    cpu: [Option<Duration>; 5],
    commands: Vec<(String, u64)>,
    statements: Vec<Statement>,
}

impl Meter {
    fn postgres_cpu(&self) -> Result<Duration> {
        procstat::tree(self.postmaster).context("the bench's postmaster is gone")
    }

    fn redis_cpu(&self) -> Result<Duration> {
        Ok(procstat::cpu(self.redis_pid)
            .context("the bench's redis-server is gone")?
            .own)
    }

    /// The bench's own threads (its reaped children, the `user` shape's
    /// planner, are counted as the planner's).
    fn bench_cpu() -> Result<Duration> {
        Ok(procstat::cpu(std::process::id() as i32)
            .context("the bench's own /proc entry")?
            .own)
    }
}

impl Probe for Meter {
    async fn start(&mut self, stack: &Stack) -> Result<()> {
        sqlx::query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            .execute(&stack.db().pool)
            .await?;
        sqlx::query("SELECT pg_stat_statements_reset()")
            .execute(&stack.db().pool)
            .await?;
        redis_cli(self.redis_port, &["CONFIG", "RESETSTAT"])?;
        // Last, so that the resets' own work is not counted.
        self.postgres_at_start = self.postgres_cpu()?;
        self.redis_at_start = self.redis_cpu()?;
        self.bench_at_start = Self::bench_cpu()?;
        Ok(())
    }

    fn planner(&mut self, cpu: Duration) {
        self.planner = Some(cpu);
    }

    async fn end(&mut self, stack: &Stack, workers: &[Proc]) -> Result<()> {
        // CPU first, before the reads below cost any. The workers started
        // inside the section: all their time so far is in it.
        let workers: Option<Duration> = workers
            .iter()
            .map(|p| procstat::cpu(p.pid()).map(|c| c.own + c.reaped))
            .sum();
        self.cpu = [
            Some(workers.context("a worker exited during the burst")?),
            self.planner,
            Some(self.postgres_cpu()?.saturating_sub(self.postgres_at_start)),
            Some(self.redis_cpu()?.saturating_sub(self.redis_at_start)),
            Some(Self::bench_cpu()?.saturating_sub(self.bench_at_start)),
        ];
        self.commands = command_stats(self.redis_port)?;
        let rows: Vec<Statement> = sqlx::query_as(
            "SELECT query, calls, rows, total_exec_time, total_plan_time FROM pg_stat_statements \
             WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) \
             ORDER BY total_exec_time DESC",
        )
        .fetch_all(&stack.db().pool)
        .await?;
        self.statements = rows
            .into_iter()
            .filter(|s| s.query.trim() != POLL && !s.query.contains("pg_stat_statements"))
            .collect();
        Ok(())
    }
}

/// `INFO commandstats` of the Redis on `port`: each command's calls, most
/// first, the bench's own left out. Commands a Lua script runs count as
/// well as the `EVALSHA` that ran them, as Redis counts them.
fn command_stats(port: u16) -> Result<Vec<(String, u64)>> {
    let text = redis_cli(port, &["INFO", "commandstats"])?;
    let mut out: Vec<(String, u64)> = text
        .lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest
                .strip_prefix("calls=")?
                .split(',')
                .next()?
                .parse()
                .ok()?;
            let base = name.split('|').next().unwrap_or(name);
            (!OWN_COMMANDS.contains(&base)).then(|| (name.to_owned(), calls))
        })
        .collect();
    out.sort_by_key(|c| std::cmp::Reverse(c.1));
    Ok(out)
}

/// One shape's runs: its table line (printed), its top commands and
/// statements of the last run, and its JSON row.
fn summary(shape: &str, mode: &str, runs: &[Run]) -> Value {
    let col = |f: &dyn Fn(&Run) -> f64| -> Vec<f64> { runs.iter().map(f).collect() };
    let rates = col(&|r| r.rate);
    let busy = col(&Run::busy);
    let ceilings = col(&|r| r.least.rate());
    let ratios = col(&|r| r.rate / r.least.rate());
    let commands = col(&Run::commands_per_slot);
    let statements = col(&Run::statements_per_slot);
    let planning = col(&Run::plan_us_per_slot);
    // The median over the runs, of a figure some runs may lack (`None`
    // then).
    let optional_median = |f: &dyn Fn(&Run) -> Option<f64>| -> Option<f64> {
        let v: Option<Vec<f64>> = runs.iter().map(f).collect();
        v.map(|mut v| median(&mut v))
    };
    let cpu: Vec<Option<f64>> = (0..CLASSES.len())
        .map(|i| optional_median(&|r| r.per_10k(i)))
        .collect();
    let total: f64 = cpu.iter().flatten().sum();
    let ceiling_cpu = median(&mut col(&|r| r.least.cpu_per_10k()));
    let cpu_bound = median(&mut col(&Run::cpu_bound));
    let ceiling_busy = median(&mut col(&|r| r.least.cores_busy()));
    let shown = |c: Option<f64>| c.map_or_else(|| "—".to_owned(), |c| format!("{c:.2}"));
    println!(
        "{:<12} {:<12} {:>9.0} {:>10.0} {:>6.2} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8.2} {:>6.2} {:>10.2} {:>10.2} {:>8.1} {:>9.2} {:>9.2} {:>9.2}",
        shape,
        mode,
        median(&mut rates.clone()),
        median(&mut ceilings.clone()),
        median(&mut ratios.clone()),
        shown(cpu[0]),
        shown(cpu[1]),
        shown(cpu[2]),
        shown(cpu[3]),
        shown(cpu[4]),
        total,
        median(&mut busy.clone()),
        median(&mut commands.clone()),
        median(&mut statements.clone()),
        median(&mut planning.clone()),
        ceiling_cpu,
        ceiling_busy,
        cpu_bound,
    );
    let last = runs.last().expect("at least one run");
    let top_commands: Vec<Value> = last
        .commands
        .iter()
        .take(TOP)
        .map(|(c, n)| json!({"command": c, "per_slot": *n as f64 / last.n}))
        .collect();
    let top_statements: Vec<Value> = last
        .statements
        .iter()
        .take(TOP)
        .map(|s| {
            let q: String = s.query.split_whitespace().collect::<Vec<_>>().join(" ");
            json!({"query": q.chars().take(80).collect::<String>(), "per_slot": s.calls as f64 / last.n,
                   "rows_per_call": s.rows as f64 / s.calls.max(1) as f64,
                   "exec_us_per_slot": s.total_exec_time * 1000.0 / last.n,
                   "plan_us_per_slot": s.total_plan_time * 1000.0 / last.n})
        })
        .collect();
    let cpu_json: serde_json::Map<String, Value> = CLASSES
        .iter()
        .zip(&cpu)
        .map(|(k, v)| (k.to_string(), json!(v)))
        .chain([("total".to_owned(), json!(total))])
        .collect();
    json!({"shape": shape, "mode": mode, "slots_per_s": median(&mut rates.clone()),
           "baseline_slots_per_s": median(&mut ceilings.clone()),
           "cores_busy": median(&mut busy.clone()),
           "ceiling_ratio": median(&mut ratios.clone()),
           "cpu_s_per_10k_slots": cpu_json,
           "ceiling_cpu_s_per_10k_slots": ceiling_cpu, "ceiling_cores_busy": ceiling_busy, "cpu_bound_ratio": cpu_bound,
           "redis_commands_per_slot": median(&mut commands.clone()),
           "statements_per_slot": median(&mut statements.clone()),
           "plan_us_per_slot": median(&mut planning.clone()),
           "top_commands": top_commands, "top_statements": top_statements,
           "runs": {"slots_per_s": rates, "baseline_slots_per_s": ceilings, "ceiling_ratio": ratios, "cores_busy": busy,
                    "redis_commands_per_slot": commands, "statements_per_slot": statements, "plan_us_per_slot": planning,
                    "ceiling_cpu_s_per_10k_slots": col(&|r| r.least.cpu_per_10k()),
                    "ceiling_cores_busy": col(&|r| r.least.cores_busy()),
                    "webhook_yardsticks": runs.iter().map(|r| r.least.parts()).collect::<Vec<_>>(),
                    "cpu_s": runs.iter().map(|r| r.cpu.to_vec()).collect::<Vec<_>>()}})
}

/// The top commands and statements of one shape's JSON row, printed.
fn print_tops(row: &Value) {
    let shape = format!(
        "{} {}",
        row["shape"].as_str().unwrap_or(""),
        row["mode"].as_str().unwrap_or("")
    );
    let num = |v: &Value| v.as_f64().unwrap_or(f64::NAN);
    println!("\n{shape}: top Redis commands, calls per slot");
    for c in row["top_commands"].as_array().into_iter().flatten() {
        let name = c["command"].as_str().unwrap_or("");
        println!("  {:>8.4}  {name}", num(&c["per_slot"]));
    }
    println!(
        "{shape}: top statements by execution time: µs per slot executing, µs per slot planning, calls per slot, rows per call"
    );
    for s in row["top_statements"].as_array().into_iter().flatten() {
        let query = s["query"].as_str().unwrap_or("");
        println!(
            "  {:>8.2} {:>8.2} {:>8.4} {:>8.1}  {query}",
            num(&s["exec_us_per_slot"]),
            num(&s["plan_us_per_slot"]),
            num(&s["per_slot"]),
            num(&s["rows_per_call"])
        );
    }
}

/// Runs each shape in each mode `runs` times (configurations alternating)
/// on the bench's own Postgres and Redis, `workers` worker processes;
/// prints medians.
pub async fn run(
    shapes: &[String],
    modes: &[String],
    slots: usize,
    workers: usize,
    runs: usize,
    batch: usize,
    body_bytes: usize,
) -> Result<Value> {
    let pg = tokio::task::spawn_blocking(|| OwnedPostgres::launch(POSTGRES_SETTINGS))
        .await?
        .context("the bench's own Postgres")?;
    let redis = tokio::task::spawn_blocking(OwnedRedis::launch)
        .await?
        .context("the bench's own Redis")?;
    let (pg_url, redis_url) = (pg.url("postgres"), redis.url());
    let servers = Servers {
        postgres: Some(&pg_url),
        redis: Some(&redis_url),
    };
    let cms = Cms::start().await;
    let (kinds, concurrency) = (10, 8);
    let configurations: Vec<(&str, &str)> = shapes
        .iter()
        .flat_map(|s| modes.iter().map(move |m| (s.as_str(), m.as_str())))
        .collect();
    let mut by_configuration: Vec<Vec<Run>> = configurations.iter().map(|_| Vec::new()).collect();
    for _ in 0..runs.max(1) {
        for (&(shape, mode), done) in configurations.iter().zip(&mut by_configuration) {
            let mut meter = Meter {
                postmaster: pg.postmaster_pid().context("postmaster.pid")?,
                redis_pid: redis.proc.pid(),
                redis_port: redis.port,
                ..Meter::default()
            };
            let spec = Spec {
                shape,
                mode,
                workers,
                slots,
                kinds,
                concurrency,
                batch,
                body_bytes,
            };
            let Timed { stack, n, secs, .. } =
                burst::timed_burst(&cms, &spec, servers, &mut meter).await?;
            // On the same database, right after, as `burst` does.
            let url = &stack.db().url;
            let cpu_so_far =
                || -> Result<Duration> { Ok(meter.postgres_cpu()? + Meter::bench_cpu()?) };
            let least = match mode {
                "webhook" => Least::Webhook(
                    ceiling::WebhookYardsticks::measure(
                        url,
                        &cms,
                        workers,
                        concurrency,
                        batch,
                        &cpu_so_far,
                    )
                    .await?,
                ),
                _ => Least::Settle(
                    ceiling::after_burst_metered(url, ceiling::Shape::Settle, &cpu_so_far).await?,
                ),
            };
            done.push(Run {
                n: n as f64,
                rate: n as f64 / secs,
                secs,
                least,
                cpu: meter.cpu.map(|c| c.map(|d| d.as_secs_f64())),
                commands: meter.commands,
                statements: meter.statements,
            });
        }
    }
    println!("\n## Breakdown: {slots} slots already due over {kinds} kinds, {workers} workers (concurrency {concurrency}, batch {batch}), draft bodies of {body_bytes} bytes; the bench's own Postgres (fsync on) and Redis; median of {runs} runs");
    println!("CPU-seconds per 10,000 slots from the workers' start to the last slot recorded (`—`: the planner ran in-process before that, not counted); `busy`: cores kept busy; the ratio is to the batched-write ceiling, or in webhook mode to the bound of its writes and calls; `plan µs`: Postgres's planning per slot; `ceil cpu`: the ceiling's CPU-seconds per 10,000 of its slots (Postgres and its clients), in webhook mode the two-phase floor's plus as many calls' (the bench: client and stand-in CMS), `ceil busy` the cores the ceiling (webhook: the floor) kept busy, and `cpu bound` that CPU per slot over the burst's: the ratio if both were bound by the cores alone");
    println!(
        "{:<12} {:<12} {:>9} {:>10} {:>6} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>6} {:>10} {:>10} {:>8} {:>9} {:>9} {:>9}",
        "shape",
        "mode",
        "slots/s",
        "baseline/s",
        "ratio",
        "workers",
        "planner",
        "postgres",
        "redis",
        "bench",
        "total",
        "busy",
        "cmds/slot",
        "stmts/slot",
        "plan µs",
        "ceil cpu",
        "ceil busy",
        "cpu bound"
    );
    let rows: Vec<Value> = configurations
        .iter()
        .zip(&by_configuration)
        .map(|(&(shape, mode), done)| summary(shape, mode, done))
        .collect();
    for row in &rows {
        print_tops(row);
    }
    let v = json!({"slots": slots, "kinds": kinds, "workers": workers, "concurrency": concurrency, "batch": batch, "body_bytes": body_bytes,
                   "postgres_settings": POSTGRES_SETTINGS.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>(),
                   "rows": rows});
    emit("breakdown", v.clone());
    Ok(v)
}
