//! The planner's command line: every subcommand and flag (DESIGN.md section
//! 4.3), parsed by clap. Only the shape lives here; [`crate::command`] runs
//! them.
//!
//! clap prints a derive's doc comments as the `--help` text, so a flag whose
//! meaning its subcommand's help already gives carries none, and
//! `missing_docs` is allowed here as in the worker's `cli`.
#![allow(missing_docs)]

use chrono::{DateTime, NaiveDate, Utc};
use clap::{Args, Parser, Subcommand};
use slotgate::job_name::JobName;
use slotgate::slot::SlotKey;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Parser, Debug)]
#[command(
    name = "planner",
    version,
    about = "slotgate control plane: plan, trigger, backfill, drafts, report, status, operator verbs, console",
    long_about = None
)]
pub struct Cli {
    /// Configuration file.
    #[arg(
        long,
        global = true,
        env = "SLOTGATE_CONFIG",
        default_value = "slotgate.toml"
    )]
    pub config: PathBuf,
    /// Client-side deadline of a one-shot command (1s to 24h; not `run`
    /// or `serve`, which have their own; `trigger --wait` adds its
    /// --wait-timeout): a command still waiting then — a Postgres or Redis
    /// that went silent, which no server-side timeout can end — stops and
    /// exits 1 saying so. Every command is safe to run again.
    #[arg(
        long,
        global = true,
        env = "SLOTGATE_DEADLINE",
        default_value = "10m",
        value_parser = parse_deadline
    )]
    pub deadline: Duration,
    #[command(flatten)]
    pub conn: Connections,
    #[command(subcommand)]
    pub cmd: Cmd,
}

#[derive(Args, Debug)]
pub struct Connections {
    /// Postgres URL.
    #[arg(long, global = true, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,
    /// Redis URL.
    #[arg(long, global = true, env = "REDIS_URL", hide_env_values = true)]
    pub redis_url: Option<String>,
    /// Prefix of every Redis key.
    #[arg(
        long,
        global = true,
        env = "SLOTGATE_PREFIX",
        default_value = "slotgate"
    )]
    pub prefix: String,
    #[command(flatten)]
    pub pg: slotgate::session::Session,
    #[command(flatten)]
    pub redis: slotgate::queue::RedisOptions,
}

#[derive(Subcommand, Debug)]
pub enum Cmd {
    /// Apply the database migrations.
    Migrate,
    /// Validate the config and reach each kind's CMS: a WordPress site must
    /// answer at /wp-json/ as WordPress and its user must be allowed to
    /// publish. With DATABASE_URL, also ask Postgres: a standby (read-only)
    /// is a problem; a primary without a synchronous standby is a warning
    /// (a failover can lose committed gate rows). Exit 0 when all is well
    /// or only warned, 1 naming what is not.
    Check,
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
        /// Client-side deadline of each planning round (1s to 1h): a round
        /// whose Postgres or Redis went silent is abandoned, logged as an
        /// error and retried next round.
        #[arg(long, default_value = "30s", value_parser = parse_round_deadline)]
        round_deadline: Duration,
        /// Serve Prometheus `/metrics`, `/healthz` and `/readyz` on
        /// HOST:PORT. `/healthz` answers 503 once no round has succeeded
        /// for 3 x --every + --round-deadline.
        #[arg(long, value_name = "HOST:PORT")]
        metrics_addr: Option<std::net::SocketAddr>,
    },
    /// Deliver one slot now, planning it first if needed: the slot given by
    /// --day and --slot (caller = manual), or the slot a Kubernetes CronJob's
    /// Job name points at (caller = cronjob). A slot due more than a minute
    /// from now is refused (exit 2) unless --early.
    Trigger(TriggerArgs),
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
    /// Predict each kind's runway, reading only: for each local day from
    /// today (in the kind's time zone), the slots the calendar gives, how
    /// many would publish, how many would be skipped and why (blackout,
    /// paused, missed_deadline, quota_full, no_ready_draft; slots already
    /// gated as recorded), and `runs_dry_on`, the first day a slot finds
    /// no ready draft. Drafts kept in WordPress are forecast from their
    /// mirror as last synced; drafts added later are not foreseen.
    Forecast {
        /// Only these kinds (repeatable; default: all).
        #[arg(long = "kind")]
        kinds: Vec<String>,
        /// Days per kind, today first (1 to 366).
        #[arg(long, default_value_t = slotgate::forecast::DEFAULT_DAYS, value_parser = clap::value_parser!(u32).range(1..=slotgate::forecast::MAX_DAYS as i64))]
        days: u32,
        /// Print {"kinds": [{"kind", "runs_dry_on", "days": [...]}]} to stdout.
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
        /// Also compare slotgate configs with Postgres (--database-url):
        /// warn when an edit would move a slot that already ran today.
        #[arg(long)]
        with_history: bool,
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
        /// Also accept requests whose Host header is NAME (with any port or
        /// none), e.g. the name a reverse proxy forwards (repeatable). The
        /// bound address (and `localhost:PORT` when bound to loopback) is
        /// always accepted; any other Host is refused (421), so a web page
        /// that rebinds its own DNS name to this address cannot read it.
        #[arg(long = "allow-host", value_name = "NAME", value_parser = parse_host_name)]
        allow_hosts: Vec<String>,
        /// Most connections open at once; one more is answered 503 and
        /// closed.
        #[arg(long, default_value_t = 128, value_parser = clap::value_parser!(u32).range(1..=65535))]
        max_connections: u32,
        /// Most `/api/events` streams open at once (each open console page
        /// holds one); one more is answered 503.
        #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=10000))]
        max_event_streams: u32,
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

/// `planner trigger`'s flags: which slot (by `--day` and `--slot`, or by a
/// CronJob's Job name) and whether to wait for its outcome.
#[derive(Args, Debug)]
pub struct TriggerArgs {
    /// The slot's kind.
    #[arg(long)]
    pub kind: String,
    /// The slot's local day (with --slot).
    #[arg(long, required_unless_present = "from_job_name")]
    pub day: Option<NaiveDate>,
    /// The slot's number, 1-based (with --day).
    #[arg(long = "slot", required_unless_present = "from_job_name")]
    pub slot_no: Option<u32>,
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
    pub from_job_name: Option<JobName>,
    /// Print {"slot", "caller", "entry_id", ...} (with --wait, and "outcome").
    #[arg(long)]
    pub json: bool,
    /// Wait until the slot has an outcome. Exit 0: published or skipped;
    /// 1: failed; 3: no outcome known (--wait-timeout passed, or a signal).
    #[arg(long)]
    pub wait: bool,
    /// How long --wait waits for the outcome.
    /// 1s to 1d.
    #[arg(long, default_value = "10m", value_parser = |s: &str| slotgate::config::WAIT_TIMEOUT.parse(s), requires = "wait")]
    pub wait_timeout: Duration,
    /// Run the slot now even though its time has not come (the delivery
    /// carries early=1 with caller manual; without it a worker records
    /// skipped/not_due).
    #[arg(long, conflicts_with = "from_job_name")]
    pub early: bool,
}

#[derive(Subcommand, Debug)]
pub enum DeadCmd {
    /// Dead letters, newest first.
    List {
        #[arg(long, default_value_t = 100)]
        limit: usize,
        #[arg(long)]
        json: bool,
    },
    /// Re-deliver a dead letter's slot (caller manual) and remove it. A
    /// slot past its due time + starting_deadline, or not planned in
    /// Postgres, is refused (exit 2) unless --force.
    Replay {
        /// The dead letter's id or its original entry id.
        entry_id: String,
        /// Replay even a slot past its deadline or not planned in
        /// Postgres: the operator's word that this dead letter's slot
        /// should run (a dead letter is Redis data anyone who can write to
        /// Redis can forge).
        #[arg(long)]
        force: bool,
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
pub enum DraftsCmd {
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
        /// Picked before drafts of a lower priority, whatever their age
        /// (default 0; negative goes after every default draft).
        #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
        priority: i32,
        /// Its section: a kind with `rotate_by = "category"` picks the
        /// category published least recently first.
        #[arg(long)]
        category: Option<String>,
    },
    /// Import drafts from JSON Lines: {"kind","title","body"?,"ready_at"?,"priority"?,"category"?} per line.
    Import { file: PathBuf },
    /// Mirror the ready posts of WordPress kinds (`[kinds.wordpress] drafts`)
    /// into the draft table. Workers also do this before each such kind's
    /// gate, so this is never needed for correctness.
    Sync {
        /// Only this kind (default: every kind whose drafts live in WordPress).
        #[arg(long)]
        kind: Option<String>,
    },
    /// List drafts.
    List {
        #[arg(long)]
        kind: Option<String>,
        /// Only drafts in this status: draft, ready, publishing, published, failed.
        #[arg(long)]
        status: Option<slotgate::store::DraftStatus>,
        #[arg(long)]
        json: bool,
    },
}

/// `--deadline`: 1s to 24h.
fn parse_deadline(s: &str) -> Result<Duration, String> {
    let d = slotgate::config::parse_duration(s)?;
    if !(Duration::from_secs(1)..=Duration::from_secs(24 * 3600)).contains(&d) {
        return Err(format!(
            "{} is outside 1s..=24h",
            humantime::format_duration(d)
        ));
    }
    Ok(d)
}

/// `--round-deadline`: 1s to 1h.
fn parse_round_deadline(s: &str) -> Result<Duration, String> {
    let d = slotgate::config::parse_duration(s)?;
    if !(Duration::from_secs(1)..=Duration::from_secs(3600)).contains(&d) {
        return Err(format!(
            "{} is outside 1s..=1h",
            humantime::format_duration(d)
        ));
    }
    Ok(d)
}

/// `--allow-host`: a host name or IP literal without a port, lowercased (an
/// IPv6 literal in brackets, as a Host header writes it).
fn parse_host_name(s: &str) -> Result<String, String> {
    let bare = s.strip_prefix('[').and_then(|v| v.strip_suffix(']'));
    if let Ok(v6) = bare.unwrap_or(s).parse::<std::net::Ipv6Addr>() {
        return Ok(format!("[{v6}]"));
    }
    let ok = !s.is_empty()
        && s.len() <= 253
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.'));
    if !ok {
        return Err(format!("{s:?} is not a host name (give it without a port)"));
    }
    Ok(s.to_ascii_lowercase())
}

/// `planner completions`: the shell's completion script, from the flags
/// above, on stdout.
pub fn print_completions(shell: clap_complete::Shell) {
    let mut cmd = <Cli as clap::CommandFactory>::command();
    clap_complete::generate(shell, &mut cmd, "planner", &mut std::io::stdout());
}
