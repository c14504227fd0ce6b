//! `slotgate-bench`: how slotgate performs, next to the ceiling of the
//! machine it runs on, measured in the same run. Not part of the test suite.
//!
//! Every benchmark prints a table for people and one JSON line (prefixed
//! `BENCH `) for tools. Run against release binaries:
//!
//! ```text
//! cargo build --release -p planner -p worker -p bench
//! scripts/with-services target/release/slotgate-bench all
//! ```

use anyhow::{bail, Context, Result};
use chrono::Utc;
use clap::{Parser, Subcommand};
use rand::{rngs::StdRng, Rng, SeedableRng};
use serde_json::{json, Value};
use slotgate::retry::Backoff;
use std::collections::BinaryHeap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};
use testkit::cms::Cms;
use testkit::process::Proc;
use testkit::{TestDb, TestRedis};

mod ceiling;
mod cluster;
mod import;
mod migration;
mod plan;
mod reconcile;
mod wordpress;

#[derive(Parser)]
#[command(
    name = "slotgate-bench",
    about = "slotgate benchmarks, each with its baseline measured in the same run"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Clone)]
enum Cmd {
    /// Slots already due, record-only and webhook mode, N workers → slots/s vs pgbench's bare gate insert and the batched-write ceiling; webhook mode also vs its two-phase write floor and the publish calls alone.
    Burst {
        #[arg(long, default_value_t = 10_000)]
        slots: usize,
        #[arg(long, default_value = "1,2,4", value_delimiter = ',')]
        workers: Vec<usize>,
        /// Kinds the slots are spread over (each kind's quota row is taken by its slots in turn).
        #[arg(long, default_value_t = 10)]
        kinds: usize,
        #[arg(long, default_value_t = 8)]
        concurrency: usize,
        /// Worker `--batch` (1 = one transaction per slot).
        #[arg(long, default_value_t = slotgate::worker::DEFAULT_BATCH)]
        batch: usize,
        /// Runs per configuration; the table shows medians.
        #[arg(long, default_value_t = 3)]
        runs: usize,
        /// `record-only`, `webhook`, and/or `webhook-probe` (a `probe_url`
        /// kind: one probe before each first send without a synchronous
        /// standby).
        #[arg(long, default_value = "record-only,webhook", value_delimiter = ',', value_parser = ["record-only", "webhook", "webhook-probe"])]
        modes: Vec<String>,
        /// How the slots' times are laid out: `interleaved` (each kind's
        /// slots one second apart, kinds interleaved in due order, as real
        /// schedules are) and/or `same-time` (every slot at 00:00:00, so
        /// each kind's slots arrive together).
        #[arg(long, default_value = "interleaved,same-time", value_delimiter = ',', value_parser = ["interleaved", "same-time"])]
        shapes: Vec<String>,
    },
    /// Slots due spread over a window → scheduling lag p50/p99/max.
    Lag {
        #[arg(long, default_value_t = 2000)]
        slots: usize,
        #[arg(long, default_value_t = 10)]
        seconds: usize,
    },
    /// kill -9 the leader under load → seconds until the next promotion.
    Failover {
        #[arg(long, default_value = "3,10", value_delimiter = ',')]
        ttls: Vec<u64>,
    },
    /// Redis bytes per queued slot; worker peak RSS.
    Footprint {
        #[arg(long, default_value_t = 100_000)]
        slots: usize,
    },
    /// Record-only slots of many kinds all due at once → first start
    /// to last finish and worker RSS, next to the batched-write ceiling.
    Crowd {
        #[arg(long, default_value_t = 100_000)]
        slots: usize,
        #[arg(long, default_value_t = 10)]
        kinds: usize,
        #[arg(long, default_value_t = 2)]
        workers: usize,
        #[arg(long, default_value_t = 3)]
        runs: usize,
        /// `interleaved` (kinds interleaved in due order, as real schedules
        /// are) or `same-time` (every slot at 00:00:00); all already due.
        #[arg(long, default_value = "interleaved", value_parser = ["interleaved", "same-time"])]
        shape: String,
    },
    /// Many kinds at the same nominal second, jitter 0 vs 60 s.
    Herd {
        #[arg(long, default_value_t = 5000)]
        slots: usize,
        #[arg(long, default_value_t = 50)]
        kinds: usize,
        #[arg(long, default_value_t = 60)]
        jitter: u64,
    },
    /// Seeded simulation of clients contending on one optimistic-concurrency row.
    Backoff {
        #[arg(long, default_value = "10,50,100,150,190", value_delimiter = ',')]
        clients: Vec<usize>,
        #[arg(long, default_value_t = 42)]
        seed: u64,
        /// Runs per point (medians are reported).
        #[arg(long, default_value_t = 5)]
        runs: usize,
    },
    /// One leader reconcile pass next to a long finished history
    /// (kinds × slots × days planned slots, gate rows and executions).
    Reconcile {
        #[arg(long, default_value_t = 10)]
        kinds: usize,
        #[arg(long, default_value_t = 100)]
        slots: usize,
        #[arg(long, default_value_t = 1000)]
        days: usize,
        #[arg(long, default_value_t = 10)]
        passes: usize,
    },
    /// `planner drafts import` → drafts/s vs a bare COPY and the old row-by-row insert.
    Import {
        #[arg(long, default_value_t = 100_000)]
        drafts: usize,
        /// Runs; the table shows medians.
        #[arg(long, default_value_t = 3)]
        runs: usize,
    },
    /// `planner plan` of kinds × slots slots, and again → seconds vs a bare COPY + ZADD.
    Plan {
        #[arg(long, default_value_t = 20)]
        kinds: usize,
        /// Slots per kind (at most 86,400: one a second).
        #[arg(long, default_value_t = 50_000)]
        slots: usize,
        /// Runs; the table shows medians.
        #[arg(long, default_value_t = 3)]
        runs: usize,
    },
    /// WordPress publishes (drafts in WordPress: a status read and a write per slot) against the webhook path, with the same calls sent alone as the baseline → ms per slot and the overhead. Needs Debian's wordpress, mariadb-server, php-cli, php-mysql.
    Wordpress {
        #[arg(long, default_value_t = 60)]
        slots: usize,
        /// The worker's `--concurrency`, and the calls in flight alone.
        #[arg(long, default_value_t = 4)]
        concurrency: usize,
        #[arg(long, default_value_t = 3)]
        runs: usize,
    },
    /// An index build on an execution table of --rows rows while a worker delivers --per-sec slots/s: the released migrations' way (CREATE INDEX in a transaction) against CONCURRENTLY → lag of the slots due during the build, next to the lag outside it.
    Migration {
        #[arg(long, default_value_t = 1_000_000)]
        rows: usize,
        #[arg(long, default_value_t = 200)]
        per_sec: usize,
        /// Seconds of slots (the build starts a third of the way in).
        #[arg(long, default_value_t = 30)]
        seconds: usize,
    },
    /// A record-only burst on one standalone Redis against the same burst on a 3-master Redis Cluster with redis_partitions = 3, same run → slots/s and Redis commands per slot on each shard.
    Cluster {
        #[arg(long, default_value_t = 10_000)]
        slots: usize,
        #[arg(long, default_value_t = 3)]
        runs: usize,
    },
    /// Everything, with defaults.
    All,
}

fn emit(name: &str, v: Value) {
    println!(
        "BENCH {}",
        json!({"bench": name, "at": Utc::now().to_rfc3339(), "result": v})
    );
}

fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn bin(name: &str) -> PathBuf {
    let me = std::env::current_exe().expect("current exe");
    let p = me.with_file_name(name);
    assert!(
        p.exists(),
        "{} not built (cargo build --release -p planner -p worker)",
        p.display()
    );
    p
}

/// A fresh database and Redis prefix with a config, like a new installation.
struct Stack {
    db: TestDb,
    redis: TestRedis,
    /// `REDIS_URL` of the workers and the planner: the shared Redis's, or
    /// a topology the bench started ([`Stack::on`]).
    redis_url: String,
    dir: PathBuf,
    config_path: PathBuf,
    config: Arc<slotgate::config::Config>,
}

impl Stack {
    async fn new(toml: &str) -> Result<Stack> {
        Self::on(toml, None).await
    }

    /// [`Stack::new`] on the Redis at `url` (a Cluster's seed nodes, say)
    /// instead of the shared one; the prefix is still the test's own.
    async fn on(toml: &str, url: Option<&str>) -> Result<Stack> {
        let db = TestDb::new().await;
        let redis = TestRedis::new();
        let redis_url = url.map_or_else(|| redis.url.clone(), str::to_owned);
        let dir = std::env::temp_dir().join(format!("slotgate-bench-{}", redis.prefix));
        std::fs::create_dir_all(&dir)?;
        let config_path = dir.join("slotgate.toml");
        std::fs::write(&config_path, toml)?;
        let config = Arc::new(slotgate::config::Config::load(&config_path)?);
        Ok(Stack {
            db,
            redis,
            redis_url,
            dir,
            config_path,
            config,
        })
    }

    fn queue(&self) -> slotgate::queue::Queue {
        slotgate::queue::Queue::new(
            slotgate::queue::pool(&self.redis_url, 8).expect("redis"),
            slotgate::queue::KeySpace::partitioned(
                self.redis.prefix.clone(),
                self.config.redis_partitions,
                false,
            ),
        )
    }

    async fn plan(&self, day: chrono::NaiveDate) -> Result<usize> {
        let p = slotgate::plan::Planner {
            config: self.config.clone(),
            pool: self.db.pool.clone(),
            queue: self.queue(),
            clock: Arc::new(slotgate::clock::SystemClock),
        };
        Ok(p.plan(Some(day), &[], false).await?.len())
    }

    async fn drafts(&self, kind: &str, n: usize) -> Result<()> {
        sqlx::query("INSERT INTO draft (kind, title, ready_at) SELECT $1, 'draft ' || g, now() - interval '1 hour' FROM generate_series(1, $2) g")
            .bind(kind)
            .bind(n as i32)
            .execute(&self.db.pool)
            .await?;
        Ok(())
    }

    fn worker(&self, id: &str, args: &[&str]) -> Proc {
        let mut all = vec!["--id", id];
        all.extend_from_slice(args);
        let envs = [
            ("DATABASE_URL", self.db.url.as_str()),
            ("REDIS_URL", self.redis_url.as_str()),
            ("SLOTGATE_PREFIX", self.redis.prefix.as_str()),
            ("SLOTGATE_CONFIG", self.config_path.to_str().unwrap()),
            ("RUST_LOG", "warn"),
        ];
        Proc::spawn(id, &bin("worker"), &all, &envs, &self.dir)
    }

    /// Runs the release `planner` against this stack and returns its wall
    /// time. Stdout is discarded: `plan` prints a line per slot.
    fn planner(&self, args: &[&str]) -> Result<Duration> {
        let started = Instant::now();
        let out = Command::new(bin("planner"))
            .args(args)
            .env("DATABASE_URL", &self.db.url)
            .env("REDIS_URL", &self.redis_url)
            .env("SLOTGATE_PREFIX", &self.redis.prefix)
            .env("SLOTGATE_CONFIG", &self.config_path)
            .env("RUST_LOG", "warn")
            .stdout(std::process::Stdio::null())
            .output()
            .context("running planner")?;
        let took = started.elapsed();
        if !out.status.success() {
            bail!("planner {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(took)
    }

    /// The ceiling for loading `table`: the rows it holds now, taken by a
    /// bare `COPY` into a scratch table with the same columns, constraints
    /// and indexes — Postgres's own ingest, no parsing, no round trip per
    /// row → seconds. The rows are read out first, untimed.
    async fn copy_ceiling(&self, table: &str) -> Result<f64> {
        use futures_util::TryStreamExt;
        let mut c = self.db.pool.acquire().await?;
        let rows: Vec<u8> = c
            .copy_out_raw(&format!("COPY {table} TO STDOUT"))
            .await?
            .try_fold(Vec::new(), |mut all, b| async move {
                all.extend_from_slice(&b);
                Ok(all)
            })
            .await?;
        let scratch = format!("scratch_{table}");
        sqlx::query(&format!(
            "CREATE TABLE {scratch} (LIKE {table} INCLUDING ALL)"
        ))
        .execute(&mut *c)
        .await?;
        let started = Instant::now();
        let mut tx = sqlx::Acquire::begin(&mut *c).await?;
        let mut copy = tx
            .copy_in_raw(&format!("COPY {scratch} FROM STDIN"))
            .await?;
        for chunk in rows.chunks(1 << 20) {
            copy.send(chunk).await?;
        }
        copy.finish().await?;
        tx.commit().await?;
        let took = started.elapsed().as_secs_f64();
        sqlx::query(&format!("DROP TABLE {scratch}"))
            .execute(&mut *c)
            .await?;
        Ok(took)
    }

    async fn count(&self, sql: &str) -> i64 {
        testkit::count(&self.db.pool, sql).await
    }

    /// Seconds from the first start to the last finish of the executions,
    /// once all `n` of them published (`what` names the bench otherwise).
    async fn all_published_within(&self, n: i64, what: &str) -> Result<f64> {
        let secs: f64 = sqlx::query_scalar(
            "SELECT EXTRACT(EPOCH FROM max(finished_at) - min(started_at))::float8 FROM execution",
        )
        .fetch_one(&self.db.pool)
        .await?;
        let published = self
            .count("SELECT count(*) FROM execution WHERE outcome = 'published'")
            .await;
        if published != n {
            bail!("{what}: {published} of {n} published");
        }
        Ok(secs)
    }

    async fn wait_count(&self, sql: &str, n: i64, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        while self.count(sql).await < n {
            if Instant::now() > deadline {
                bail!("timed out waiting for {n} from {sql}");
            }
            // Not faster: `sql` is typically a count over a table the run
            // is filling, and polled every 50 ms it took about 12 % of the
            // machine in a 100,000-slot crowd (120 scans of ~16 ms). Results
            // are read from the rows' own timestamps, so the poll's period
            // only delays the end of a run, never changes its figure.
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        Ok(())
    }
}

/// SIGTERM to every worker; each has 30 s to finish.
fn stop_all(procs: &mut [Proc]) {
    testkit::process::terminate_all(procs, Duration::from_secs(30));
}

fn kinds_toml(
    kinds: usize,
    slots_per_kind: usize,
    time: &dyn Fn(usize) -> String,
    jitter: &str,
    cap: usize,
    extra: &str,
) -> String {
    let mut t = String::new();
    for k in 0..kinds {
        let slots: Vec<String> = (0..slots_per_kind)
            .map(|i| format!("\"{}\"", time(i)))
            .collect();
        t.push_str(&format!(
            "[[kinds]]\nname = \"k{k}\"\ntimezone = \"UTC\"\nslots = [{}]\njitter = \"{jitter}\"\ndaily_cap = {cap}\nstarting_deadline = \"48h\"\n{extra}\n\n",
            slots.join(", ")
        ));
    }
    t
}

/// pgbench running the bare gate insert at `clients` concurrency for 5 s on
/// the stack's database → transactions per second.
fn pgbench_gate(db_url: &str, clients: usize, dir: &Path) -> Result<f64> {
    let script = dir.join("gate.sql");
    std::fs::write(
        &script,
        "\\set s random(1, 2000000000)\nINSERT INTO publish_slot (day, slot, kind, state, claimed_by) VALUES (CURRENT_DATE, :s, 'pgbench', 'claimed', 'pgbench') ON CONFLICT (day, slot, kind) DO NOTHING RETURNING id;\n",
    )?;
    let out = Command::new("pgbench")
        .args([
            "-n",
            "-f",
            script.to_str().unwrap(),
            "-c",
            &clients.to_string(),
            "-j",
            &clients.min(4).to_string(),
            "-T",
            "5",
            db_url,
        ])
        .output()
        .context("running pgbench (apt-get install postgresql-client)")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let tps = text
        .lines()
        .find(|l| l.starts_with("tps"))
        .and_then(|l| l.split_whitespace().nth(2))
        .and_then(|v| v.parse().ok())
        .with_context(|| {
            format!(
                "pgbench output: {text} {}",
                String::from_utf8_lossy(&out.stderr)
            )
        })?;
    Ok(tps)
}

// ------------------------------------------------------------------ burst

/// What one burst measured.
struct BurstRun {
    /// Slots per second, first start to last finish.
    rate: f64,
    /// First start to last finish.
    secs: f64,
    /// pgbench's bare gate insert (transactions per second).
    gate_tps: f64,
    /// The batched-write ceiling (slots per second).
    ceiling: f64,
    /// Webhook mode: the two-phase write floor and the calls alone.
    webhook: Option<ceiling::WebhookYardsticks>,
    /// Peak worker RSS.
    rss: f64,
}

/// One burst: a fresh stack, `w` worker processes, then the baselines on
/// the same database: pgbench's one-row gate and the batched-write ceiling.
#[allow(clippy::too_many_arguments)]
async fn burst_once(
    cms: &Cms,
    shape: &str,
    mode: &str,
    w: usize,
    slots: usize,
    kinds: usize,
    concurrency: usize,
    batch: usize,
) -> Result<BurstRun> {
    // `webhook-probe`: with `probe_url`, which (without a synchronous
    // standby, as here) probes before every first send (DESIGN 4.20).
    let extra = match mode {
        "webhook" => format!("publish_url = \"{}\"", cms.url("/publish")),
        "webhook-probe" => format!(
            "publish_url = \"{}\"\nprobe_url = \"{}\"",
            cms.url("/publish"),
            cms.url("/probe")
        ),
        _ => String::new(),
    };
    let per = slots / kinds;
    // Interleaved: slot i of every kind at i seconds past midnight, so the
    // delayed set hands them out k0, k1, … k9, k0, … (ties by key); of
    // yesterday, so every slot is due whatever the time of day.
    let (time, day): (&dyn Fn(usize) -> String, _) = if shape == "interleaved" {
        (
            &|i| format!("{:02}:{:02}:{:02}", i / 3600 % 24, i / 60 % 60, i % 60),
            Utc::now().date_naive().pred_opt().expect("yesterday"),
        )
    } else {
        (&|_| "00:00:00".into(), Utc::now().date_naive())
    };
    let stack = Stack::new(&kinds_toml(kinds, per, time, "0", per, &extra)).await?;
    for k in 0..kinds {
        stack.drafts(&format!("k{k}"), per).await?;
    }
    let n = stack.plan(day).await? as i64;
    let conc = concurrency.to_string();
    let batch_s = batch.to_string();
    let mut procs: Vec<Proc> = (0..w)
        .map(|i| {
            stack.worker(
                &format!("b{i}"),
                &[
                    "--concurrency",
                    &conc,
                    "--batch",
                    &batch_s,
                    "--lease-ttl",
                    "3s",
                ],
            )
        })
        .collect();
    stack
        .wait_count(
            "SELECT count(*) FROM execution",
            n,
            Duration::from_secs(600),
        )
        .await?;
    let secs = stack.all_published_within(n, "burst").await?;
    let rss = procs
        .iter()
        .filter_map(Proc::peak_rss_mib)
        .fold(0.0, f64::max);
    stop_all(&mut procs);
    let rate = n as f64 / secs;
    let gate_tps = pgbench_gate(&stack.db.url, w * concurrency, &stack.dir)?;
    let ceiling = ceiling::batched(&stack.db.url, 16, 32, 5, ceiling::Shape::Settle).await?;
    let webhook = if mode.starts_with("webhook") {
        let floor = ceiling::batched(&stack.db.url, 16, 32, 5, ceiling::Shape::TwoPhase).await?;
        // The better of two: as many calls in flight as the workers'
        // chunks (one per permit), and as many as the workers may have
        // (every call of every chunk); more in flight costs more per call.
        let calls = ceiling::calls(cms, w * concurrency, 3)
            .await?
            .max(ceiling::calls(cms, w * concurrency * batch, 3).await?);
        Some(ceiling::WebhookYardsticks { floor, calls })
    } else {
        None
    };
    Ok(BurstRun {
        rate,
        secs,
        gate_tps,
        ceiling,
        webhook,
        rss,
    })
}

/// A webhook configuration's medians against its own yardsticks.
struct WebhookLine {
    shape: &'static str,
    workers: usize,
    /// The two-phase write floor, slots per second.
    floor: f64,
    /// slotgate's slots per second over the floor.
    floor_ratio: f64,
    /// The publish calls alone, calls per second.
    calls: f64,
    /// [`ceiling::WebhookYardsticks::bound`], slots per second.
    bound: f64,
    /// The bound over the batched ceiling.
    bound_ratio: f64,
}

#[allow(clippy::too_many_arguments)]
async fn burst(
    shapes: &[String],
    slots: usize,
    workers: &[usize],
    kinds: usize,
    concurrency: usize,
    batch: usize,
    modes: &[String],
    runs: usize,
) -> Result<Value> {
    let mut rows = Vec::new();
    let cms = Cms::start().await;
    println!("\n## Burst: {slots} slots already due over {kinds} kinds, concurrency {concurrency} and batch {batch} per worker; median of {runs} runs (baselines on the same database right after each)");
    println!(
        "{:<12} {:<12} {:>7} {:>10} {:>12} {:>7} {:>12} {:>7} {:>12}",
        "shape",
        "mode",
        "workers",
        "slots/s",
        "gate tps",
        "ratio",
        "ceiling/s",
        "ratio",
        "peak RSS MiB"
    );
    let mut webhook_lines = Vec::new();
    for shape in shapes.iter().map(String::as_str) {
        for mode in modes.iter().map(String::as_str) {
            for &w in workers {
                let mut runs_of: Vec<BurstRun> = Vec::new();
                for _ in 0..runs.max(1) {
                    runs_of.push(
                        burst_once(&cms, shape, mode, w, slots, kinds, concurrency, batch).await?,
                    );
                }
                let col =
                    |f: &dyn Fn(&BurstRun) -> f64| -> Vec<f64> { runs_of.iter().map(f).collect() };
                let rates = col(&|r| r.rate);
                let tpss = col(&|r| r.gate_tps);
                let ceils = col(&|r| r.ceiling);
                let gate_ratios = col(&|r| r.rate / r.gate_tps);
                let ceiling_ratios = col(&|r| r.rate / r.ceiling);
                let rss = runs_of.iter().map(|r| r.rss).fold(0.0, f64::max);
                let (rate, tps, ceil) = (
                    median(&mut rates.clone()),
                    median(&mut tpss.clone()),
                    median(&mut ceils.clone()),
                );
                let (gate_ratio, ceiling_ratio) = (
                    median(&mut gate_ratios.clone()),
                    median(&mut ceiling_ratios.clone()),
                );
                println!(
                    "{:<12} {:<12} {:>7} {:>10.0} {:>12.0} {:>7.2} {:>12.0} {:>7.2} {:>12.1}",
                    shape, mode, w, rate, tps, gate_ratio, ceil, ceiling_ratio, rss
                );
                let mut row = json!({"shape": shape, "mode": mode, "workers": w, "slots_per_s": rate, "pgbench_gate_tps": tps, "ratio": gate_ratio,
                             "batched_ceiling_slots_per_s": ceil, "ceiling_ratio": ceiling_ratio, "peak_rss_mib": rss,
                             "runs": {"slots_per_s": rates, "pgbench_gate_tps": tpss, "ratio": gate_ratios,
                                      "batched_ceiling_slots_per_s": ceils, "ceiling_ratio": ceiling_ratios}});
                // Every run of a webhook configuration has them.
                let yardsticks: Option<Vec<ceiling::WebhookYardsticks>> =
                    runs_of.iter().map(|r| r.webhook).collect();
                if let Some(yardsticks) = yardsticks {
                    let floors: Vec<f64> = yardsticks.iter().map(|y| y.floor).collect();
                    let calls: Vec<f64> = yardsticks.iter().map(|y| y.calls).collect();
                    let bounds: Vec<f64> = yardsticks.iter().map(|y| y.bound()).collect();
                    let floor_ratios: Vec<f64> =
                        rates.iter().zip(&floors).map(|(r, f)| r / f).collect();
                    let bound_ratios: Vec<f64> =
                        bounds.iter().zip(&ceils).map(|(b, c)| b / c).collect();
                    let line = WebhookLine {
                        shape: if shape == "interleaved" {
                            "interleaved"
                        } else {
                            "same-time"
                        },
                        workers: w,
                        floor: median(&mut floors.clone()),
                        floor_ratio: median(&mut floor_ratios.clone()),
                        calls: median(&mut calls.clone()),
                        bound: median(&mut bounds.clone()),
                        bound_ratio: median(&mut bound_ratios.clone()),
                    };
                    row["two_phase_floor_slots_per_s"] = json!(line.floor);
                    row["floor_ratio"] = json!(line.floor_ratio);
                    row["calls_per_s"] = json!(line.calls);
                    row["writes_then_calls_bound_slots_per_s"] = json!(line.bound);
                    row["bound_to_ceiling_ratio"] = json!(line.bound_ratio);
                    row["runs"]["two_phase_floor_slots_per_s"] = json!(floors);
                    row["runs"]["floor_ratio"] = json!(floor_ratios);
                    row["runs"]["calls_per_s"] = json!(calls);
                    row["runs"]["writes_then_calls_bound_slots_per_s"] = json!(bounds);
                    webhook_lines.push(line);
                }
                rows.push(row);
            }
        }
    }
    if !webhook_lines.is_empty() {
        println!("\nwebhook mode, against what its writes and its calls alone reach on this machine (same runs):");
        println!(
            "{:<12} {:>7} {:>14} {:>7} {:>12} {:>14} {:>16}",
            "shape", "workers", "two-phase/s", "ratio", "calls/s", "bound/s", "bound/ceiling"
        );
        for l in webhook_lines {
            println!(
                "{:<12} {:>7} {:>14.0} {:>7.2} {:>12.0} {:>14.0} {:>16.2}",
                l.shape, l.workers, l.floor, l.floor_ratio, l.calls, l.bound, l.bound_ratio
            );
        }
    }
    let v = json!({"slots": slots, "kinds": kinds, "concurrency": concurrency, "batch": batch, "rows": rows});
    emit("burst", v.clone());
    Ok(v)
}

// ------------------------------------------------------------------ lag

async fn lag(slots: usize, seconds: usize) -> Result<Value> {
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
    let base = redis_handoff_ms(&stack.redis).await?;
    stack
        .wait_count(
            "SELECT count(*) FROM execution",
            slots as i64,
            Duration::from_secs(seconds as u64 + 120),
        )
        .await?;
    stop_all(&mut procs);
    let mut lags: Vec<f64> = sqlx::query_scalar(
        "SELECT EXTRACT(EPOCH FROM min(e.started_at) - p.due_at)::float8 * 1000
           FROM execution e JOIN planned_slot p ON p.kind = e.kind AND p.day = e.day AND p.slot = e.slot
          GROUP BY p.kind, p.day, p.slot, p.due_at",
    )
    .fetch_all(&stack.db.pool)
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

async fn redis_handoff_ms(redis: &TestRedis) -> Result<f64> {
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

// ------------------------------------------------------------------ failover

async fn failover(ttls: &[u64]) -> Result<Value> {
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
        let mut c = stack.redis.conn().await;
        let leader_key = format!("{}:leader", stack.redis.prefix);
        let ready_key = format!("{}:ready", stack.redis.prefix);
        let deadline = Instant::now() + Duration::from_secs(30);
        let leader: String = loop {
            if let Some(v) = redis::cmd("GET")
                .arg(&leader_key)
                .query_async::<Option<String>>(&mut c)
                .await?
            {
                break v;
            }
            if Instant::now() > deadline {
                bail!("no leader");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        tokio::time::sleep(Duration::from_secs(3)).await;
        let id = leader.rsplit_once(':').unwrap().0.to_owned();
        let victim = procs
            .iter()
            .position(|p| p.name == id)
            .context("leader process")?;
        let added = |c: &mut redis::aio::MultiplexedConnection| {
            let key = ready_key.clone();
            let mut c = c.clone();
            async move {
                let v: Vec<redis::Value> = redis::cmd("XINFO")
                    .arg("STREAM")
                    .arg(&key)
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
        };
        if let Err(st) = procs[victim].kill_9() {
            bail!("the leader had exited by itself before kill -9: {st}");
        }
        let killed = Instant::now();
        let before = added(&mut c).await;
        let mut promoted = None;
        let mut new_leader = None;
        while killed.elapsed() < Duration::from_secs(ttl * 3 + 10)
            && (promoted.is_none() || new_leader.is_none())
        {
            if promoted.is_none() && added(&mut c).await > before {
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

// ------------------------------------------------------------------ footprint

async fn footprint(slots: usize) -> Result<Value> {
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

// ------------------------------------------------------------------ crowd

/// `slots` record-only slots of `kinds` kinds all due in the same second,
/// `workers` workers: first start to last finish and peak worker RSS,
/// next to the time the batched-write ceiling (measured on the same
/// database right after) would take for as many slots. Medians of `runs`.
async fn crowd(
    slots: usize,
    kinds: usize,
    workers: usize,
    runs: usize,
    shape: &str,
) -> Result<Value> {
    let cms = Cms::start().await;
    println!("\n## Crowd: {slots} record-only slots of {kinds} kinds all due at once ({shape}), {workers} workers; median of {runs} runs");
    println!(
        "{:>10} {:>10} {:>16} {:>12}",
        "seconds", "slots/s", "ceiling seconds", "peak RSS MiB"
    );
    let (mut secs, mut rates, mut ceil_secs, mut rsss) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..runs.max(1) {
        let r = burst_once(
            &cms,
            shape,
            "record-only",
            workers,
            slots,
            kinds,
            8,
            slotgate::worker::DEFAULT_BATCH,
        )
        .await?;
        secs.push(r.secs);
        rates.push(r.rate);
        ceil_secs.push(slots as f64 / r.ceiling);
        rsss.push(r.rss);
    }
    let rss = rsss.iter().copied().fold(0.0, f64::max);
    let (s, r, c) = (
        median(&mut secs.clone()),
        median(&mut rates.clone()),
        median(&mut ceil_secs.clone()),
    );
    println!("{s:>10.2} {r:>10.0} {c:>16.2} {rss:>12.1}");
    let v = json!({"slots": slots, "kinds": kinds, "workers": workers, "shape": shape, "seconds": s, "slots_per_s": r,
                   "ceiling_seconds": c, "peak_rss_mib": rss,
                   "runs": {"seconds": secs, "slots_per_s": rates, "ceiling_seconds": ceil_secs, "peak_rss_mib": rsss}});
    emit("crowd", v.clone());
    Ok(v)
}

// ------------------------------------------------------------------ herd

async fn herd(slots: usize, kinds: usize, jitter: u64) -> Result<Value> {
    let mut rows = Vec::new();
    println!("\n## Jitter at the top of the hour: {slots} slots of {kinds} kinds at one nominal second, 3 workers");
    println!(
        "{:>9} {:>22} {:>16} {:>18} {:>16}",
        "jitter s", "peak gate txns (avg)", "peak lock waits", "lock-wait samples", "p99 exec ms"
    );
    for j in [0, jitter] {
        let at = (Utc::now() + chrono::Duration::seconds(8))
            .format("%H:%M:%S")
            .to_string();
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
        stack.plan(Utc::now().date_naive()).await?;
        let mut procs: Vec<Proc> = (0..3)
            .map(|i| {
                stack.worker(
                    &format!("h{i}"),
                    &["--concurrency", "8", "--lease-ttl", "3s"],
                )
            })
            .collect();
        // Sample the database's sessions every 10 ms while slots run.
        let sampler = sqlx::PgPool::connect(&stack.db.url).await?;
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
        .fetch_all(&stack.db.pool)
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

// ------------------------------------------------------------------ backoff

/// One run of the AWS experiment: `clients` each want one successful
/// conditional write to a single row. A write carries the version the client
/// last saw and succeeds only if nobody wrote since; every answer tells the
/// client the current version. Network delay per hop |N(10 ms, 2 ms)|.
/// Returns (total calls, completion time in ms).
fn simulate(strategy: Backoff, clients: usize, rng: &mut StdRng) -> (u64, f64) {
    #[derive(PartialEq)]
    struct Ev(f64, usize, bool); // time ms, client, arrives at server (else: answer back)
    impl Eq for Ev {}
    // Reversed, so the heap pops the earliest event first. PartialOrd must
    // agree with Ord: BinaryHeap compares with `<=`.
    impl PartialOrd for Ev {
        fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
            Some(self.cmp(o))
        }
    }
    impl Ord for Ev {
        fn cmp(&self, o: &Self) -> std::cmp::Ordering {
            o.0.total_cmp(&self.0).then(o.1.cmp(&self.1))
        }
    }
    let hop = |rng: &mut StdRng| {
        // Box-Muller.
        let (u1, u2): (f64, f64) = (rng.gen_range(f64::EPSILON..1.0), rng.gen());
        (10.0 + 2.0 * (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()).abs()
    };
    let (base, cap) = (Duration::from_millis(5), Duration::from_secs(2));
    let mut version = 0u64;
    let mut seen = vec![0u64; clients];
    let mut attempts = vec![0u32; clients];
    let mut prev = vec![base; clients];
    let mut ok = vec![false; clients];
    let mut heap = BinaryHeap::new();
    for c in 0..clients {
        heap.push(Ev(hop(rng), c, true));
    }
    let (mut calls, mut done, mut last) = (clients as u64, 0usize, 0.0f64);
    while let Some(Ev(t, c, at_server)) = heap.pop() {
        if at_server {
            if seen[c] == version {
                version += 1;
                ok[c] = true;
            }
            seen[c] = version;
            heap.push(Ev(t + hop(rng), c, false));
        } else if ok[c] {
            done += 1;
            last = t;
            if done == clients {
                break;
            }
        } else {
            let d = strategy.delay(rng, base, cap, attempts[c], prev[c]);
            prev[c] = d.max(base);
            attempts[c] += 1;
            calls += 1;
            heap.push(Ev(t + d.as_secs_f64() * 1000.0 + hop(rng), c, true));
        }
    }
    (calls, last)
}

fn backoff(clients: &[usize], seed: u64, runs: usize) -> Value {
    println!("\n## Backoff strategies: clients contending on one row (seed {seed}, median of {runs} runs; base 5 ms, cap 2 s)");
    println!(
        "{:>8} {:<13} {:>12} {:>14} {:>20}",
        "clients", "strategy", "calls", "completion ms", "calls ÷ exponential"
    );
    let mut rows = Vec::new();
    let mut rng = StdRng::seed_from_u64(seed);
    for &n in clients {
        let mut exp_calls = f64::NAN;
        for s in Backoff::ALL {
            let (mut calls, mut ms): (Vec<f64>, Vec<f64>) = (0..runs)
                .map(|_| simulate(s, n, &mut rng))
                .map(|(c, t)| (c as f64, t))
                .unzip();
            let (c, t) = (median(&mut calls), median(&mut ms));
            if s == Backoff::Exponential {
                exp_calls = c;
            }
            rows.push(json!({"clients": n, "strategy": s.name(), "calls": c, "completion_ms": t}));
            println!(
                "{:>8} {:<13} {:>12.0} {:>14.0} {:>20}",
                n,
                s.name(),
                c,
                t,
                if exp_calls.is_nan() {
                    "-".into()
                } else {
                    format!("{:.2}", c / exp_calls)
                }
            );
        }
    }
    let v = json!({"seed": seed, "runs": runs, "rows": rows});
    emit("backoff", v.clone());
    v
}

#[tokio::main]
async fn main() -> Result<()> {
    let cli = Cli::parse();
    println!(
        "# slotgate benchmarks — {} — {} cores",
        Utc::now().format("%Y-%m-%d %H:%M UTC"),
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0)
    );
    match cli.cmd {
        Cmd::Burst {
            slots,
            workers,
            kinds,
            concurrency,
            batch,
            modes,
            runs,
            shapes,
        } => {
            burst(
                &shapes,
                slots,
                &workers,
                kinds,
                concurrency,
                batch,
                &modes,
                runs,
            )
            .await?;
        }
        Cmd::Lag { slots, seconds } => {
            lag(slots, seconds).await?;
        }
        Cmd::Failover { ttls } => {
            failover(&ttls).await?;
        }
        Cmd::Footprint { slots } => {
            footprint(slots).await?;
        }
        Cmd::Herd {
            slots,
            kinds,
            jitter,
        } => {
            herd(slots, kinds, jitter).await?;
        }
        Cmd::Crowd {
            slots,
            kinds,
            workers,
            runs,
            shape,
        } => {
            crowd(slots, kinds, workers, runs, &shape).await?;
        }
        Cmd::Backoff {
            clients,
            seed,
            runs,
        } => {
            backoff(&clients, seed, runs);
        }
        Cmd::Reconcile {
            kinds,
            slots,
            days,
            passes,
        } => {
            reconcile::run(kinds, slots, days, passes).await?;
        }
        Cmd::Migration {
            rows,
            per_sec,
            seconds,
        } => {
            migration::run(rows, per_sec, seconds).await?;
        }
        Cmd::Cluster { slots, runs } => {
            cluster::run(slots, runs).await?;
        }
        Cmd::Import { drafts, runs } => {
            import::run(drafts, runs).await?;
        }
        Cmd::Plan { kinds, slots, runs } => {
            plan::run(kinds, slots, runs).await?;
        }
        Cmd::Wordpress {
            slots,
            concurrency,
            runs,
        } => {
            wordpress::run(slots, concurrency, runs).await?;
        }
        Cmd::All => {
            backoff(&[10, 50, 100, 150, 190], 42, 5);
            footprint(100_000).await?;
            lag(2000, 10).await?;
            failover(&[3, 10]).await?;
            let modes = ["record-only".to_owned(), "webhook".to_owned()];
            let shapes = ["interleaved".to_owned(), "same-time".to_owned()];
            burst(
                &shapes,
                10_000,
                &[1, 2, 4],
                10,
                8,
                slotgate::worker::DEFAULT_BATCH,
                &modes,
                3,
            )
            .await?;
            herd(5000, 50, 60).await?;
            import::run(100_000, 3).await?;
            plan::run(20, 50_000, 3).await?;
            crowd(100_000, 10, 2, 3, "interleaved").await?;
        }
    }
    Ok(())
}
