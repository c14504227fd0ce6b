//! `slotgate-bench burst`: slots already due, record-only and webhook
//! mode, N workers → slots/s next to pgbench's bare gate insert and the
//! batched-write ceiling; webhook mode also next to its two-phase write
//! floor and the publish calls alone.

use crate::ceiling;
use crate::figures::{emit, median};
use crate::procstat;
use crate::stack::{kinds_toml, stop_all, Servers, Stack};
use anyhow::{Context, Result};
use chrono::Utc;
use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;
use std::time::Duration;
use testkit::cms::Cms;
use testkit::process::Proc;

/// pgbench running the bare gate insert at `clients` concurrency for 5 s on
/// the stack's database → transactions per second.
pub(crate) fn pgbench_gate(db_url: &str, clients: usize, dir: &Path) -> Result<f64> {
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

/// The variable `record-notify` names in `[notify] secret_env`: set by
/// [`run`] for the bench and the workers it starts (they inherit it).
const NOTIFY_SECRET_ENV: &str = "SLOTGATE_BENCH_NOTIFY_SECRET";

/// What one burst measured.
pub(crate) struct BurstRun {
    /// Slots per second, first start to last finish.
    pub(crate) rate: f64,
    /// First start to last finish.
    pub(crate) secs: f64,
    /// pgbench's bare gate insert (transactions per second).
    pub(crate) gate_tps: f64,
    /// The batched-write ceiling (slots per second).
    pub(crate) ceiling: f64,
    /// Webhook mode: the two-phase write floor and the calls alone.
    pub(crate) webhook: Option<ceiling::WebhookYardsticks>,
    /// Peak worker RSS.
    pub(crate) rss: f64,
}

/// What a caller measures around a burst's timed section: from just before
/// the workers start to the moment every slot is recorded, the workers
/// still running. [`burst_once`] measures nothing there (`()`); `breakdown`
/// measures each process's CPU and the servers' command counts.
pub(crate) trait Probe {
    /// Just before the workers start (the drafts are in; in every shape but
    /// `user` the day is planned too).
    async fn start(&mut self, stack: &Stack) -> Result<()>;
    /// The `user` shape's `planner plan` ran, inside the section, and spent
    /// `cpu` (its own CPU time, reaped by the bench).
    fn planner(&mut self, cpu: Duration);
    /// Every slot recorded; `workers` still run.
    async fn end(&mut self, stack: &Stack, workers: &[Proc]) -> Result<()>;
}

impl Probe for () {
    async fn start(&mut self, _: &Stack) -> Result<()> {
        Ok(())
    }
    fn planner(&mut self, _: Duration) {}
    async fn end(&mut self, _: &Stack, _: &[Proc]) -> Result<()> {
        Ok(())
    }
}

/// One burst's configuration.
pub(crate) struct Spec<'a> {
    /// One of `burst --shapes`.
    pub(crate) shape: &'a str,
    /// One of `burst --modes`.
    pub(crate) mode: &'a str,
    /// Worker processes.
    pub(crate) workers: usize,
    pub(crate) slots: usize,
    pub(crate) kinds: usize,
    /// Each worker's `--concurrency`.
    pub(crate) concurrency: usize,
    /// Each worker's `--batch`.
    pub(crate) batch: usize,
    /// Bytes of each draft's body (`--body-bytes`).
    pub(crate) body_bytes: usize,
}

/// A burst run to its end: the stack (for the baselines, on the same
/// database), the slots it recorded, first start to last finish, and the
/// workers' peak RSS.
pub(crate) struct Timed {
    pub(crate) stack: Stack,
    pub(crate) n: i64,
    pub(crate) secs: f64,
    pub(crate) rss: f64,
}

/// The burst itself: a fresh stack on `servers` laid out as `spec.shape`
/// says, then its workers (and in the `user` shape the planner) until every
/// slot is recorded, `probe` called around that; the workers stopped.
pub(crate) async fn timed_burst(
    cms: &Cms,
    spec: &Spec<'_>,
    servers: Servers<'_>,
    probe: &mut impl Probe,
) -> Result<Timed> {
    let Spec {
        shape,
        mode,
        workers: w,
        slots,
        kinds,
        concurrency,
        batch,
        body_bytes,
    } = *spec;
    // `webhook-probe`: with `probe_url`, which (without a synchronous
    // standby, as here) probes before every first send (DESIGN 4.20).
    let extra = match mode {
        "webhook" | "webhook-slow" => format!("publish_url = \"{}\"", cms.url("/publish")),
        "webhook-probe" => format!(
            "publish_url = \"{}\"\nprobe_url = \"{}\"",
            cms.url("/publish"),
            cms.url("/probe")
        ),
        _ => String::new(),
    };
    let extra = if shape.ends_with("-rotation") {
        format!("{extra}\nrotate_by = \"category\"")
    } else {
        extra
    };
    let per = slots / kinds;
    // Interleaved: slot i of every kind at i seconds past midnight, so the
    // delayed set hands them out k0, k1, … k9, k0, … (ties by key); of
    // yesterday, so every slot is due whatever the time of day.
    let (time, day): (&dyn Fn(usize) -> String, _) = if shape != "same-time" {
        (
            &|i| format!("{:02}:{:02}:{:02}", i / 3600 % 24, i / 60 % 60, i % 60),
            Utc::now().date_naive().pred_opt().expect("yesterday"),
        )
    } else {
        (&|_| "00:00:00".into(), Utc::now().date_naive())
    };
    let mut toml = kinds_toml(kinds, per, time, "0", per, &extra);
    if mode == "record-notify" {
        // Notices on, sent to the stand-in (which answers 200). The key is
        // the bench's own, in the variable `run` set before any stack.
        toml.push_str(&format!(
            "[notify]\nurl = \"{}\"\nsecret_env = \"{NOTIFY_SECRET_ENV}\"\n",
            cms.url("/notify")
        ));
    }
    let stack = Stack::on(&toml, servers).await?;
    // `user`: what a user runs, in their order: drafts imported with the
    // release `planner drafts import`, the workers started, then the day
    // planned with the release `planner plan` while they wait (issue 43:
    // the user's path against the bench's).
    let user = shape == "user";
    if user {
        let file = stack.kit.dir.join("drafts.jsonl");
        let mut text = String::new();
        let body = serde_json::to_string(&crate::stack::draft_body(body_bytes))?;
        for k in 0..kinds {
            for i in 0..per {
                text.push_str(&format!(
                    "{{\"kind\":\"k{k}\",\"title\":\"draft {i}\",\"body\":{body},\"ready_at\":\"2000-01-01T00:00:00Z\"}}\n"
                ));
            }
        }
        std::fs::write(&file, text)?;
        stack.planner(&["drafts", "import", file.to_str().expect("utf-8 path")])?;
    } else {
        for k in 0..kinds {
            stack
                .drafts_with_body(&format!("k{k}"), per, body_bytes)
                .await?;
        }
    }
    // The pick's variants: spread priorities, or categories to rotate by.
    let spread = match shape {
        "interleaved-priority" => Some("UPDATE draft SET priority = id % 5"),
        "interleaved-rotation" => Some("UPDATE draft SET category = 'c' || (id % 5)"),
        _ => None,
    };
    if let Some(sql) = spread {
        sqlx::query(sql).execute(&stack.db().pool).await?;
        // As after an import: no dead row versions left by the update.
        sqlx::query("VACUUM ANALYZE draft")
            .execute(&stack.db().pool)
            .await?;
    }
    let n = if user {
        (per * kinds) as i64
    } else {
        stack.plan(day).await? as i64
    };
    let conc = concurrency.to_string();
    let batch_s = batch.to_string();
    if mode == "webhook-slow" {
        cms.set_chooser(Some(slow_one_in_100()));
    }
    probe.start(&stack).await?;
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
    if user {
        // The only child the bench reaps meanwhile: the difference is the
        // planner's CPU.
        let reaped = procstat::reaped_by_me();
        stack.planner(&["plan", "--day", &day.to_string()])?;
        probe.planner(procstat::reaped_by_me().saturating_sub(reaped));
    }
    let done = stack
        .wait_count(
            "SELECT count(*) FROM execution",
            n,
            Duration::from_secs(600),
            &mut procs,
        )
        .await;
    // The yardsticks after it are measured on the plain stand-in.
    cms.set_chooser(None);
    done?;
    probe.end(&stack, &procs).await?;
    let secs = stack.all_published_within(n, "burst").await?;
    let rss = procs
        .iter()
        .filter_map(Proc::peak_rss_mib)
        .fold(0.0, f64::max);
    stop_all(&mut procs);
    Ok(Timed {
        stack,
        n,
        secs,
        rss,
    })
}

/// `webhook-slow`'s stand-in CMS: the publish of every kind's 100th slot
/// (by `slot_no`, so 1 in 100 and the same ones every run) answered 200
/// after 2 s, the others at once, as a CMS that is sometimes slow.
fn slow_one_in_100() -> testkit::cms::Chooser {
    std::sync::Arc::new(|path, _key, body| {
        let slot = body.get("slot_no").and_then(serde_json::Value::as_i64)?;
        (path == "/publish" && slot % 100 == 0)
            .then_some(testkit::cms::Reply::Delay(Duration::from_secs(2), 200))
    })
}

/// One burst ([`timed_burst`] on the shared servers, nothing measured
/// inside), then the baselines on the same database: pgbench's one-row
/// gate and the batched-write ceiling.
pub(crate) async fn burst_once(cms: &Cms, spec: &Spec<'_>) -> Result<BurstRun> {
    let Timed {
        stack,
        n,
        secs,
        rss,
    } = timed_burst(cms, spec, Servers::default(), &mut ()).await?;
    let (w, concurrency, batch) = (spec.workers, spec.concurrency, spec.batch);
    let rate = n as f64 / secs;
    let gate_tps = pgbench_gate(&stack.db().url, w * concurrency, &stack.kit.dir)?;
    let ceiling = ceiling::after_burst(&stack.db().url, ceiling::Shape::Settle).await?;
    let webhook = if spec.mode.starts_with("webhook") {
        let (url, unmetered) = (&stack.db().url, || Ok(std::time::Duration::ZERO));
        let y = ceiling::WebhookYardsticks::measure(url, cms, w, concurrency, batch, &unmetered);
        Some(y.await?)
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
pub(crate) struct WebhookLine {
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
pub(crate) async fn run(
    shapes: &[String],
    slots: usize,
    workers: &[usize],
    kinds: usize,
    concurrency: usize,
    batch: usize,
    modes: &[String],
    runs: usize,
    body_bytes: usize,
) -> Result<Value> {
    let mut rows = Vec::new();
    if modes.iter().any(|m| m == "record-notify") {
        // A throwaway Standard Webhooks key ("whsec_" + base64 of 26 fixed bytes),
        // set before any stack loads a config or starts a worker.
        std::env::set_var(
            NOTIFY_SECRET_ENV,
            "whsec_c2xvdGdhdGUtYmVuY2gtbm90aWNlLWtleSE=",
        );
    }
    let cms = Cms::start().await;
    println!("\n## Burst: {slots} slots already due over {kinds} kinds, concurrency {concurrency} and batch {batch} per worker, draft bodies of {body_bytes} bytes; median of {runs} runs (baselines on the same database right after each)");
    println!(
        "{:<20} {:<12} {:>7} {:>10} {:>12} {:>7} {:>12} {:>7} {:>12}",
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
                    let spec = Spec {
                        shape,
                        mode,
                        workers: w,
                        slots,
                        kinds,
                        concurrency,
                        batch,
                        body_bytes,
                    };
                    runs_of.push(burst_once(&cms, &spec).await?);
                }
                let (row, webhook_line) = configuration(shape, mode, w, &runs_of);
                webhook_lines.extend(webhook_line);
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
    let v = json!({"slots": slots, "kinds": kinds, "concurrency": concurrency, "batch": batch, "body_bytes": body_bytes, "rows": rows});
    emit("burst", v.clone());
    Ok(v)
}

/// One configuration's runs summarised: its table line (printed), its JSON
/// row, and in webhook mode its line against the write floor and calls.
fn configuration(
    shape: &str,
    mode: &str,
    w: usize,
    runs_of: &[BurstRun],
) -> (Value, Option<WebhookLine>) {
    let col = |f: &dyn Fn(&BurstRun) -> f64| -> Vec<f64> { runs_of.iter().map(f).collect() };
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
        "{:<20} {:<12} {:>7} {:>10.0} {:>12.0} {:>7.2} {:>12.0} {:>7.2} {:>12.1}",
        shape, mode, w, rate, tps, gate_ratio, ceil, ceiling_ratio, rss
    );
    let mut row = json!({"shape": shape, "mode": mode, "workers": w, "slots_per_s": rate, "pgbench_gate_tps": tps, "ratio": gate_ratio,
                 "batched_ceiling_slots_per_s": ceil, "ceiling_ratio": ceiling_ratio, "peak_rss_mib": rss,
                 "runs": {"slots_per_s": rates, "pgbench_gate_tps": tpss, "ratio": gate_ratios,
                          "batched_ceiling_slots_per_s": ceils, "ceiling_ratio": ceiling_ratios}});
    // Every run of a webhook configuration has them.
    let yardsticks: Option<Vec<ceiling::WebhookYardsticks>> =
        runs_of.iter().map(|r| r.webhook).collect();
    let Some(yardsticks) = yardsticks else {
        return (row, None);
    };
    let floors: Vec<f64> = yardsticks.iter().map(|y| y.floor.rate).collect();
    let calls: Vec<f64> = yardsticks.iter().map(|y| y.calls.rate).collect();
    let bounds: Vec<f64> = yardsticks.iter().map(|y| y.bound()).collect();
    let floor_ratios: Vec<f64> = rates.iter().zip(&floors).map(|(r, f)| r / f).collect();
    let bound_ratios: Vec<f64> = bounds.iter().zip(&ceils).map(|(b, c)| b / c).collect();
    let line = WebhookLine {
        shape: match shape {
            "interleaved" => "interleaved",
            "interleaved-priority" => "interleaved-priority",
            "interleaved-rotation" => "interleaved-rotation",
            "user" => "user",
            _ => "same-time",
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
    (row, Some(line))
}
