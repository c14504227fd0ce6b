//! `planner`: slotgate's control plane. Parsing and printing live here; every
//! operation is in the `slotgate` library.

use anyhow::{bail, Context, Result};
use chrono::{DateTime, NaiveDate, Utc};
use clap::{Args, Parser, Subcommand};
use slotgate::clock::{SharedClock, SystemClock};
use slotgate::config::Config;
use slotgate::job_name::JobName;
use slotgate::plan::Planner;
use slotgate::queue::{KeySpace, Queue};
use slotgate::slot::{local_today, SlotKey};
use slotgate::store;
use slotgate::watch::{Final, Watched};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

mod console;

#[derive(Parser, Debug)]
#[command(
    name = "planner",
    version,
    about = "slotgate control plane: plan, trigger, backfill, drafts, report, status, operator verbs, console"
)]
struct Cli {
    /// Configuration file.
    #[arg(
        long,
        global = true,
        env = "SLOTGATE_CONFIG",
        default_value = "slotgate.toml"
    )]
    config: PathBuf,
    #[command(flatten)]
    conn: Connections,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Args, Debug)]
struct Connections {
    /// Postgres URL.
    #[arg(long, global = true, env = "DATABASE_URL", hide_env_values = true)]
    database_url: Option<String>,
    /// Redis URL.
    #[arg(long, global = true, env = "REDIS_URL", hide_env_values = true)]
    redis_url: Option<String>,
    /// Prefix of every Redis key.
    #[arg(
        long,
        global = true,
        env = "SLOTGATE_PREFIX",
        default_value = "slotgate"
    )]
    prefix: String,
    #[command(flatten)]
    pg: slotgate::session::Session,
    #[command(flatten)]
    redis: slotgate::queue::RedisOptions,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Apply the database migrations.
    Migrate,
    /// Plan a day's slots (idempotent) and enqueue the new ones.
    Plan {
        /// Local day (default: today in each kind's time zone).
        #[arg(long)]
        day: Option<NaiveDate>,
        /// Only these kinds (repeatable; default: all).
        #[arg(long = "kind")]
        kinds: Vec<String>,
        /// Show what would be planned; change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Print {"slots": [...]} to stdout.
        #[arg(long)]
        json: bool,
    },
    /// Stay up: plan today and tomorrow now and again each interval.
    Run {
        /// 1s to 12h.
        #[arg(long, default_value = "10m", value_parser = |s: &str| slotgate::config::PLAN_EVERY.parse(s))]
        every: Duration,
        /// Do not plan this kind (repeatable): a kind a Kubernetes CronJob
        /// triggers with `trigger --from-job-name` has its own clock.
        #[arg(long = "skip-kind", value_name = "KIND")]
        skip_kinds: Vec<String>,
        /// Serve Prometheus `/metrics`, `/healthz` and `/readyz` on HOST:PORT.
        #[arg(long, value_name = "HOST:PORT")]
        metrics_addr: Option<std::net::SocketAddr>,
    },
    /// Deliver one slot now, planning it first if needed: the slot given by
    /// --day and --slot (caller = manual), or the slot a Kubernetes CronJob's
    /// Job name points at (caller = cronjob). A slot due more than a minute
    /// from now is refused (exit 2) unless --early.
    Trigger {
        /// The slot's kind.
        #[arg(long)]
        kind: String,
        /// The slot's local day (with --slot).
        #[arg(long, required_unless_present = "from_job_name")]
        day: Option<NaiveDate>,
        /// The slot's number, 1-based (with --day).
        #[arg(long = "slot", required_unless_present = "from_job_name")]
        slot_no: Option<u32>,
        /// A CronJob's Job name, `<cronjob>-<scheduled Unix minute>`: deliver
        /// the slot of --kind whose nominal time is in that minute (caller =
        /// cronjob). Set it from the pod label
        /// `batch.kubernetes.io/job-name` with the downward API.
        #[arg(
            long,
            env = "SLOTGATE_JOB_NAME",
            value_name = "NAME",
            conflicts_with_all = ["day", "slot_no"]
        )]
        from_job_name: Option<JobName>,
        /// Print {"slot", "caller", "entry_id", ...} (with --wait, and "outcome").
        #[arg(long)]
        json: bool,
        /// Wait until the slot has an outcome. Exit 0: published or skipped;
        /// 1: failed; 3: no outcome known (--wait-timeout passed, or a signal).
        #[arg(long)]
        wait: bool,
        /// How long --wait waits for the outcome.
        /// 1s to 1d.
        #[arg(long, default_value = "10m", value_parser = |s: &str| slotgate::config::WAIT_TIMEOUT.parse(s), requires = "wait")]
        wait_timeout: Duration,
        /// Run the slot now even though its time has not come (the delivery
        /// carries early=1 with caller manual; without it a worker records
        /// skipped/not_due).
        #[arg(long, conflicts_with = "from_job_name")]
        early: bool,
    },
    /// Plan a range of days and deliver each past slot without an outcome (caller = backfill).
    Backfill {
        #[arg(long)]
        kind: String,
        #[arg(long)]
        from: NaiveDate,
        #[arg(long)]
        to: NaiveDate,
    },
    /// Manage drafts.
    #[command(subcommand)]
    Drafts(DraftsCmd),
    /// The day's slots and outcomes.
    Report {
        #[arg(long)]
        day: Option<NaiveDate>,
        #[arg(long = "kind")]
        kinds: Vec<String>,
        #[arg(long)]
        json: bool,
    },
    /// A failed slot: one more attempt, same key and draft.
    Retry {
        #[arg(long)]
        slot: SlotKey,
    },
    /// Give a failed slot up.
    Abandon {
        #[arg(long)]
        slot: SlotKey,
        /// Return the draft to `ready` (only after checking the CMS did not publish it).
        #[arg(long)]
        requeue_draft: bool,
    },
    /// Review CronJob manifests, crontabs and slotgate configs for jobs that
    /// can run twice or never. Exit 0: nothing high; 1: something high;
    /// 2: an input cannot be read or parsed.
    Audit {
        /// Files or directories (searched recursively).
        #[arg(required = true)]
        paths: Vec<PathBuf>,
        #[arg(long)]
        json: bool,
        /// Evaluate as of this instant (RFC 3339; default: now). DST windows
        /// are computed for the 12 months after it.
        #[arg(long)]
        now: Option<DateTime<Utc>>,
        /// Zone of crontabs that set no CRON_TZ/TZ (default: this machine's).
        #[arg(long)]
        zone: Option<chrono_tz::Tz>,
    },
    /// Pause a kind: its due slots are recorded `skipped/paused` (final;
    /// they do not run after `resume`) until `--until` or `planner resume`.
    Pause {
        #[arg(long)]
        kind: String,
        /// When the pause ends by itself (RFC 3339; default: never).
        #[arg(long)]
        until: Option<DateTime<Utc>>,
        /// Why (shown in status and on the console).
        #[arg(long, default_value = "")]
        note: String,
    },
    /// End a kind's pause.
    Resume {
        #[arg(long)]
        kind: String,
    },
    /// Take a slot's gate row ahead of time as `skipped/operator`, so it
    /// never runs. Refused (exit 1) when the slot already has a gate row.
    Skip {
        #[arg(long)]
        slot: SlotKey,
        /// Why (kept in the execution's detail).
        #[arg(long, default_value = "")]
        note: String,
    },
    /// Dead letters: list, replay, purge.
    #[command(subcommand)]
    Dead(DeadCmd),
    /// Print a shell completion script.
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// The operator console: a JSON API and a page over it.
    Serve {
        /// Address to listen on.
        #[arg(long = "http", default_value = "127.0.0.1:8080")]
        http: std::net::SocketAddr,
        /// Allow actions (retry, abandon, trigger, pause, resume, skip,
        /// replay) as `POST /api/<verb>` with `Authorization: Bearer
        /// $SLOTGATE_CONSOLE_TOKEN` (at least 16 characters).
        #[arg(long)]
        allow_actions: bool,
    },
    /// Queue depths, leader, live workers, paused kinds.
    Status {
        #[arg(long)]
        json: bool,
    },
    /// Delete old history in small batches: executions, stored CMS answers,
    /// planned rows. Gate rows stay, and every configured slot of a pruned
    /// day without one is sealed (`skipped/pruned`), so a pruned day can
    /// never run again.
    Prune {
        /// Age of the history to delete (8d to 36500d), e.g. `90d`.
        #[arg(long, value_parser = slotgate::config::parse_duration)]
        older_than: Duration,
        /// Count what would go; change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Print the counts as one JSON object.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand, Debug)]
enum DeadCmd {
    /// Dead letters, newest first.
    List {
        #[arg(long, default_value_t = 100)]
        limit: usize,
        #[arg(long)]
        json: bool,
    },
    /// Re-deliver a dead letter's slot (caller manual) and remove it.
    Replay {
        /// The dead letter's id or its original entry id.
        entry_id: String,
    },
    /// Delete dead letters older than a duration, e.g. `30d`.
    Purge {
        #[arg(long, value_parser = slotgate::config::parse_duration)]
        older_than: Duration,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand, Debug)]
enum DraftsCmd {
    /// Add one draft.
    Add {
        #[arg(long)]
        kind: String,
        #[arg(long)]
        title: String,
        /// File holding the body (default: empty).
        #[arg(long)]
        body_file: Option<PathBuf>,
        /// When it becomes ready (RFC 3339; default: now).
        #[arg(long)]
        ready_at: Option<DateTime<Utc>>,
    },
    /// Import drafts from JSON Lines: {"kind","title","body","ready_at"?} per line.
    Import { file: PathBuf },
    /// List drafts.
    List {
        #[arg(long)]
        kind: Option<String>,
        #[arg(long)]
        status: Option<String>,
        #[arg(long)]
        json: bool,
    },
}

/// Exit status 2: bad configuration (DESIGN).
#[derive(Debug)]
struct BadConfig(slotgate::config::ConfigError);
impl std::fmt::Display for BadConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}
impl std::error::Error for BadConfig {}

/// Exit status 2: input that names nothing (a Job name without a slot).
#[derive(Debug)]
struct BadInput(String);
impl std::fmt::Display for BadInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for BadInput {}

/// `trigger --wait`: 0 when the slot published or was skipped, 1 when it
/// (or the delivery) failed, 3 when no outcome is known yet.
fn wait_exit_code(w: &Watched) -> u8 {
    match w {
        Watched::Settled { slot, .. } => match slot.state {
            Final::Published | Final::Skipped => 0,
            Final::Failed => 1,
        },
        Watched::DeliveryFailed { .. } => 1,
        Watched::TimedOut { .. } | Watched::Cancelled => 3,
    }
}

fn main() -> ExitCode {
    slotgate::telemetry::init();
    let cli = Cli::parse();
    if let Err(e) = cli.conn.pg.validate() {
        eprintln!("planner: error: {e}");
        return ExitCode::from(2);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    match rt.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("planner: error: {e:#}");
            let not_due = matches!(
                e.downcast_ref::<slotgate::plan::PlanError>(),
                Some(slotgate::plan::PlanError::NotDue { .. })
            );
            if not_due
                || e.downcast_ref::<BadConfig>().is_some()
                || e.downcast_ref::<BadInput>().is_some()
            {
                ExitCode::from(2)
            } else {
                ExitCode::from(1)
            }
        }
    }
}

struct Env {
    clock: SharedClock,
    conn: Connections,
}

impl Env {
    async fn pool(&self) -> Result<sqlx::PgPool> {
        let url = self
            .conn
            .database_url
            .as_deref()
            .context("DATABASE_URL is not set (or pass --database-url)")?;
        store::connect(url, 4, &self.conn.pg)
            .await
            .with_context(|| {
                format!(
                    "connecting to Postgres at {}",
                    slotgate::secret::redact_url(url)
                )
            })
    }
    fn queue(&self) -> Result<Queue> {
        let url = self
            .conn
            .redis_url
            .as_deref()
            .context("REDIS_URL is not set (or pass --redis-url)")?;
        let pool = slotgate::queue::pool_with(url, 4, &self.conn.redis)?;
        Ok(Queue::new(pool, KeySpace::new(self.conn.prefix.clone())))
    }
}

fn load_config(path: &std::path::Path) -> Result<Arc<Config>> {
    Config::load(path)
        .map(Arc::new)
        .map_err(|e| BadConfig(e).into())
}

async fn run(cli: Cli) -> Result<ExitCode> {
    let env = Env {
        clock: Arc::new(SystemClock),
        conn: cli.conn,
    };
    let planner = || async {
        let config = load_config(&cli.config)?;
        Ok::<_, anyhow::Error>(Planner {
            config,
            pool: env.pool().await?,
            queue: env.queue()?,
            clock: env.clock.clone(),
        })
    };
    match cli.cmd {
        Cmd::Migrate => {
            let pool = env.pool().await?;
            slotgate::MIGRATOR
                .run(&pool)
                .await
                .context("applying migrations")?;
            eprintln!("migrations applied");
        }
        Cmd::Plan {
            day,
            kinds,
            dry_run,
            json,
        } => {
            let p = planner().await?;
            let slots = p.plan(day, &kinds, dry_run).await.context("planning")?;
            if json {
                println!("{}", serde_json::json!({ "slots": slots }));
            } else {
                // Buffered: a plan of a million slots is a million lines.
                let mut out = std::io::BufWriter::new(std::io::stdout().lock());
                for s in &slots {
                    writeln!(
                        out,
                        "{:<32} nominal {}  due {}  jitter {:>8} ms  {}",
                        s.slot,
                        s.nominal_at,
                        s.due_at,
                        s.jitter_ms,
                        if s.new { "new" } else { "existing" }
                    )?;
                }
                out.flush()?;
                let new = slots.iter().filter(|s| s.new).count();
                eprintln!(
                    "{} slots, {} new{}",
                    slots.len(),
                    new,
                    if dry_run {
                        " (dry run: nothing changed)"
                    } else {
                        ""
                    }
                );
            }
        }
        Cmd::Run {
            every,
            skip_kinds,
            metrics_addr,
        } => {
            let p = planner().await?;
            for k in &skip_kinds {
                if p.config.kind(k).is_none() {
                    return Err(BadInput(format!(
                        "--skip-kind {k:?}: unknown kind (not in {})",
                        cli.config.display()
                    ))
                    .into());
                }
            }
            let cancel = CancellationToken::new();
            slotgate::worker::stop_on_signals(cancel.clone());
            let metrics = CancellationToken::new();
            if let Some(addr) = metrics_addr {
                let probe = slotgate::telemetry::Probe {
                    pool: p.pool.clone(),
                    queue: p.queue.clone(),
                    clock: p.clock.clone(),
                };
                slotgate::telemetry::serve(addr, probe, metrics.clone())
                    .await
                    .with_context(|| format!("serving metrics on {addr}"))?;
            }
            loop {
                let now = p.clock.now();
                for k in p
                    .config
                    .kinds
                    .iter()
                    .filter(|k| !skip_kinds.contains(&k.name))
                {
                    let today = local_today(k.timezone, now);
                    for day in [today, today.succ_opt().expect("date")] {
                        match p
                            .plan(Some(day), std::slice::from_ref(&k.name), false)
                            .await
                        {
                            Ok(v) => {
                                let new = v.iter().filter(|s| s.new).count();
                                slotgate::telemetry::plan_round(&k.name, Some(new));
                                if new > 0 {
                                    tracing::info!(kind = %k.name, %day, new, "planned");
                                }
                            }
                            Err(e) => {
                                slotgate::telemetry::plan_round(&k.name, None);
                                tracing::warn!(kind = %k.name, %day, error = %e, "planning failed; will retry next round")
                            }
                        }
                    }
                }
                tokio::select! {
                    _ = cancel.cancelled() => break,
                    _ = tokio::time::sleep(every) => {}
                }
            }
            metrics.cancel();
            eprintln!("planner run: stopped");
        }
        Cmd::Trigger {
            kind,
            day,
            slot_no,
            from_job_name,
            json,
            wait,
            wait_timeout,
            early,
        } => {
            let p = planner().await?;
            let (key, caller) = match (from_job_name.as_ref(), day, slot_no) {
                (Some(job), _, _) => {
                    let k = p.config.kind(&kind).ok_or_else(|| {
                        BadInput(format!(
                            "unknown kind {kind:?} (not in {})",
                            cli.config.display()
                        ))
                    })?;
                    let s = slotgate::job_name::slot_of(k, job, &p.config.jitter_seed)
                        .map_err(|e| BadInput(format!("Job name {:?}: {e}", job.name)))?;
                    (s.key, "cronjob")
                }
                (None, Some(day), Some(slot_no)) => (SlotKey::new(kind, day, slot_no), "manual"),
                _ => unreachable!("clap requires --day and --slot without --from-job-name"),
            };
            let entry_id = if early {
                p.trigger_early(&key.kind, key.day, key.slot_no).await?
            } else {
                p.trigger(&key.kind, key.day, key.slot_no, caller).await?
            };
            let mut out = serde_json::json!({
                "slot": key.to_string(),
                "caller": caller,
                "entry_id": entry_id,
                "job_name": from_job_name.as_ref().map(|j| j.name.as_str()),
            });
            if !json {
                println!(
                    "delivered {key} (entry {entry_id}, caller {caller}{})",
                    if early { ", early" } else { "" }
                );
            }
            if !wait {
                if json {
                    println!("{out}");
                }
                return Ok(ExitCode::SUCCESS);
            }
            let cancel = CancellationToken::new();
            slotgate::worker::stop_on_signals(cancel.clone());
            let watched =
                slotgate::watch::until_settled(&p.pool, &key, &entry_id, wait_timeout, &cancel)
                    .await;
            let code = wait_exit_code(&watched);
            if json {
                out["outcome"] = serde_json::to_value(&watched)?;
                println!("{out}");
            } else {
                println!("{key}: {watched}");
            }
            return Ok(ExitCode::from(code));
        }
        Cmd::Backfill { kind, from, to } => {
            let p = planner().await?;
            let b = p.backfill(&kind, from, to).await?;
            println!("{}", serde_json::to_string(&b)?);
        }
        Cmd::Drafts(d) => drafts(d, &env, &cli.config).await?,
        Cmd::Report { day, kinds, json } => {
            let config = load_config(&cli.config)?;
            for k in &kinds {
                if config.kind(k).is_none() {
                    bail!("unknown kind {k:?} (not in {})", cli.config.display());
                }
            }
            let r = slotgate::report::build(&env.pool().await?, &config, &env.clock, day, &kinds)
                .await?;
            if json {
                println!("{}", serde_json::to_string(&r)?);
            } else {
                print!("{}", r.render());
            }
        }
        Cmd::Retry { slot } => {
            let p = planner().await?;
            let id = p.retry(&slot).await?;
            println!("retrying {slot} (entry {id}, caller manual)");
        }
        Cmd::Abandon {
            slot,
            requeue_draft,
        } => {
            let p = planner().await?;
            let draft = p.abandon(&slot, requeue_draft).await?;
            let what = match (draft, requeue_draft) {
                (Some(d), true) => format!("draft {d} is ready again"),
                (Some(d), false) => format!("draft {d} stays failed"),
                (None, _) => "no draft was bound".into(),
            };
            println!("abandoned {slot}; {what}");
        }
        Cmd::Audit {
            paths,
            json,
            now,
            zone,
        } => {
            let opts = slotgate::audit::AuditOptions {
                now: now.unwrap_or_else(|| env.clock.now()),
                local_zone: zone.unwrap_or_else(slotgate::audit::machine_zone),
            };
            return match slotgate::audit::audit_paths(&paths, &opts) {
                Ok(report) => {
                    if json {
                        println!("{}", report.to_json());
                    } else {
                        print!("{}", report.render_table());
                    }
                    Ok(ExitCode::from(report.exit_code() as u8))
                }
                Err(e) => {
                    eprintln!("planner audit: {e}");
                    Ok(ExitCode::from(2))
                }
            };
        }
        Cmd::Prune {
            older_than,
            dry_run,
            json,
        } => {
            let config = load_config(&cli.config)?;
            let pool = env.pool().await?;
            let pruned = match slotgate::retention::prune(
                &pool,
                &config,
                env.clock.now(),
                older_than,
                dry_run,
            )
            .await
            {
                Err(e @ slotgate::retention::RetentionError::OutOfRange { .. }) => {
                    eprintln!("planner prune: {e}");
                    return Ok(ExitCode::from(2));
                }
                r => r.context("pruning")?,
            };
            if json {
                println!("{}", serde_json::to_string(&pruned)?);
            } else {
                println!(
                    "{}executions started before {}: {}; stored answers: {}; planned rows: {}; slots sealed: {}",
                    if dry_run { "dry run (nothing changed): " } else { "pruned " },
                    pruned.executions_before,
                    pruned.executions,
                    pruned.responses,
                    pruned.planned,
                    pruned.sealed
                );
            }
        }
        Cmd::Pause { kind, until, note } => {
            let p = planner().await?;
            p.pause(&kind, until, &note).await?;
            match until {
                Some(u) => println!("paused {kind} until {}", u.to_rfc3339()),
                None => println!("paused {kind} until `planner resume --kind {kind}`"),
            }
        }
        Cmd::Resume { kind } => {
            let p = planner().await?;
            if p.resume(&kind).await? {
                println!("resumed {kind}");
            } else {
                println!("{kind} was not paused");
            }
        }
        Cmd::Skip { slot, note } => {
            let p = planner().await?;
            p.skip(&slot, &note).await?;
            println!("skipped {slot} (skipped/operator, caller manual)");
        }
        Cmd::Dead(d) => {
            let p = planner().await?;
            match d {
                DeadCmd::List { limit, json } => {
                    let v = p.dead_letters(limit).await?;
                    if json {
                        println!("{}", serde_json::to_string(&v)?);
                    } else {
                        println!(
                            "{:<16} {:<16} {:<24} {:<10} {:<16} SLOT",
                            "ID", "ENTRY", "AT (UTC)", "CALLER", "REASON"
                        );
                        for e in v {
                            let dash = || "-".to_owned();
                            println!(
                                "{:<16} {:<16} {:<24} {:<10} {:<16} {:?}",
                                e.id,
                                e.entry_id.unwrap_or_else(dash),
                                e.at.map(|a| a.format("%Y-%m-%d %H:%M:%S").to_string())
                                    .unwrap_or_else(dash),
                                e.caller.unwrap_or_else(dash),
                                e.reason.unwrap_or_else(dash),
                                e.slot.unwrap_or_default()
                            );
                        }
                    }
                }
                DeadCmd::Replay { entry_id } => {
                    let (dead, entry) = p.replay_dead(&entry_id).await?;
                    println!(
                        "replayed dead letter {} as entry {entry} (slot {}, caller manual)",
                        dead.id,
                        dead.slot.unwrap_or_default()
                    );
                }
                DeadCmd::Purge { older_than, json } => {
                    let n = p.purge_dead(older_than).await?;
                    if json {
                        println!("{}", serde_json::json!({ "purged": n }));
                    } else {
                        println!("purged {n} dead letters");
                    }
                }
            }
        }
        Cmd::Completions { shell } => {
            let mut cmd = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(shell, &mut cmd, "planner", &mut std::io::stdout());
        }
        Cmd::Serve {
            http,
            allow_actions,
        } => {
            let token = if allow_actions {
                let t = std::env::var("SLOTGATE_CONSOLE_TOKEN").unwrap_or_default();
                if t.chars().count() < console::MIN_TOKEN_CHARS {
                    eprintln!(
                        "planner serve: --allow-actions needs SLOTGATE_CONSOLE_TOKEN set to at least {} characters",
                        console::MIN_TOKEN_CHARS
                    );
                    return Ok(ExitCode::from(2));
                }
                Some(t)
            } else {
                None
            };
            let p = planner().await?;
            let listener = tokio::net::TcpListener::bind(http)
                .await
                .with_context(|| format!("listening on {http}"))?;
            let cancel = CancellationToken::new();
            slotgate::worker::stop_on_signals(cancel.clone());
            eprintln!(
                "planner serve: console on http://{} (actions {})",
                listener.local_addr()?,
                if token.is_some() { "on" } else { "off" }
            );
            console::serve(console::Console::new(p, token), listener, cancel)
                .await
                .context("serving the console")?;
            eprintln!("planner serve: stopped");
        }
        Cmd::Status { json } => {
            // Pauses and workers' clocks live in Postgres: shown when it is
            // configured and answers (status stays a Redis view while it is
            // down).
            let full = async {
                let pool = env.pool().await?;
                slotgate::pause::status(&env.queue()?, &pool, &env.clock)
                    .await
                    .map_err(anyhow::Error::from)
            };
            let s = match env.conn.database_url.is_some() {
                true => match full.await {
                    Ok(s) => s,
                    Err(e) => {
                        eprintln!("planner status: pauses and workers' clocks not shown: {e:#}");
                        slotgate::report::status(&env.queue()?, &env.clock)
                            .await
                            .context("reading Redis")?
                    }
                },
                false => slotgate::report::status(&env.queue()?, &env.clock)
                    .await
                    .context("reading Redis")?,
            };
            if json {
                println!("{}", serde_json::to_string(&s)?);
            } else {
                print!("{}", s.render());
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn drafts(cmd: DraftsCmd, env: &Env, config_path: &std::path::Path) -> Result<()> {
    match cmd {
        DraftsCmd::Add {
            kind,
            title,
            body_file,
            ready_at,
        } => {
            let config = load_config(config_path)?;
            if config.kind(&kind).is_none() {
                bail!("unknown kind {kind:?} (not in {})", config_path.display());
            }
            let body = match body_file {
                Some(f) => std::fs::read_to_string(&f)
                    .with_context(|| format!("reading {}", f.display()))?,
                None => String::new(),
            };
            let now = env.clock.now();
            let pool = env.pool().await?;
            let mut conn = pool.acquire().await?;
            let id = store::insert_draft(
                &mut conn,
                &kind,
                &title,
                &body,
                ready_at.unwrap_or(now),
                now,
            )
            .await?;
            println!("{id}");
        }
        DraftsCmd::Import { file } => {
            let config = load_config(config_path)?;
            let f = std::fs::File::open(&file)
                .with_context(|| format!("opening {}", file.display()))?;
            // All or nothing: every line is checked before Postgres is
            // touched, and the one COPY runs in one transaction.
            let rows = slotgate::import::DraftRows::parse(
                std::io::BufReader::new(f),
                &file.display().to_string(),
                &config,
                env.clock.now(),
            )?;
            rows.copy_into(&env.pool().await?).await?;
            println!("imported {} drafts", rows.len());
        }
        DraftsCmd::List { kind, status, json } => {
            let pool = env.pool().await?;
            let v = store::list_drafts(&pool, kind.as_deref(), status.as_deref()).await?;
            if json {
                println!("{}", serde_json::to_string(&v)?);
            } else {
                println!(
                    "{:>6} {:<12} {:<11} {:<26} {:<28} TITLE",
                    "ID", "KIND", "STATUS", "READY_AT", "SLOT"
                );
                for d in v {
                    println!(
                        "{:>6} {:<12} {:<11} {:<26} {:<28} {}",
                        d.id,
                        d.kind,
                        d.status,
                        d.ready_at.format("%Y-%m-%dT%H:%M:%SZ"),
                        d.slot_key.as_deref().unwrap_or("-"),
                        d.title
                    );
                }
            }
        }
    }
    Ok(())
}
