//! The worker's command line and what it starts: flags are parsed here, the
//! runtime itself is `slotgate::worker`.

use anyhow::{Context, Result};
use clap::Parser;
use slotgate::clock::SystemClock;
use slotgate::config::{Config, LEASE_TTL, VISIBILITY, WORKER_PERIOD};
use slotgate::executor::Hooks;
use slotgate::queue::{KeySpace, Queue};
use slotgate::secret::redact_url;
use slotgate::worker::{Worker, WorkerOptions};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

// The flags. No doc comment: clap would print it as the long help.
#[allow(missing_docs)]
#[derive(Parser, Debug)]
#[command(
    name = "worker",
    version,
    about = "slotgate worker: runs slot deliveries exactly once in effect; stops on SIGTERM/SIGINT",
    long_about = None
)]
pub struct Cli {
    /// Configuration file.
    #[arg(long, env = "SLOTGATE_CONFIG", default_value = "slotgate.toml")]
    config: PathBuf,
    /// Postgres URL.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    database_url: String,
    /// Redis URL.
    #[arg(long, env = "REDIS_URL", hide_env_values = true)]
    redis_url: String,
    /// Prefix of every Redis key.
    #[arg(long, env = "SLOTGATE_PREFIX", default_value = "slotgate")]
    prefix: String,
    /// Worker id (consumer name; default: hostname-pid).
    #[arg(long)]
    id: Option<String>,
    /// Gates (or single deliveries) in flight at once.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..=1024))]
    concurrency: u16,
    /// Batch size: up to concurrency × batch slots read together share one
    /// gate transaction (twice that for a read of record-only slots), and up
    /// to concurrency × batch webhook calls may be in flight, each holding
    /// its permit until it returns; calls that return are recorded together
    /// within 10 ms. 1 turns batching off.
    #[arg(long, default_value_t = slotgate::worker::DEFAULT_BATCH as u16, value_parser = clap::value_parser!(u16).range(1..=1000))]
    batch: u16,
    /// Leader lease time to live (100ms to 10m).
    #[arg(long, default_value = "10s", value_parser = |s: &str| LEASE_TTL.parse(s))]
    lease_ttl: Duration,
    /// How long a delivery (and its claim) may go without a heartbeat before another worker takes it over (100ms to 1h).
    #[arg(long, default_value = "30s", value_parser = |s: &str| VISIBILITY.parse(s))]
    visibility: Duration,
    /// Time in-flight deliveries get to finish after SIGTERM (100ms to 1h).
    #[arg(long, default_value = "30s", value_parser = |s: &str| WORKER_PERIOD.parse(s))]
    shutdown_grace: Duration,
    /// Serve Prometheus `/metrics`, `/healthz` and `/readyz` on HOST:PORT.
    #[arg(long, value_name = "HOST:PORT")]
    metrics_addr: Option<std::net::SocketAddr>,
    /// How often the leader reconciles Postgres against Redis (100ms to 1h).
    #[arg(long, default_value = "5s", value_parser = |s: &str| WORKER_PERIOD.parse(s))]
    reconcile_every: Duration,
    #[command(flatten)]
    pg: slotgate::session::Session,
    #[command(flatten)]
    redis: slotgate::queue::RedisOptions,
    /// Most dead letters kept in P:dead (approximately: Redis trims whole stream nodes).
    #[arg(long, env = "SLOTGATE_MAX_DEAD_LETTERS", default_value_t = slotgate::queue::DEFAULT_DEAD_LETTER_CAP, value_parser = clap::value_parser!(u64).range(1..))]
    max_dead_letters: u64,
    /// The leader removes consumers idle this long with nothing pending, and heartbeats this old.
    /// 1m to 30d.
    #[arg(long, default_value = "24h", value_parser = |s: &str| slotgate::config::FORGET_AFTER.parse(s))]
    forget_after: Duration,
}

/// Runs the worker until a signal stops it: checks the flags and the config
/// (exit 2), then drains on the first SIGTERM/SIGINT (exit 0) or fails (exit
/// 1).
pub fn run(cli: Cli) -> ExitCode {
    run_with_hooks(cli, Hooks::default())
}

/// [`run`], with `hooks` installed in the executor. Only a test build
/// passes any (the chaos suite's `chaos-worker`, whose sabotages break a
/// rule on purpose); the `worker` binary passes none, so it has no flag
/// or path that bends a delivery.
pub fn run_with_hooks(cli: Cli, hooks: Hooks) -> ExitCode {
    if let Err(e) = cli.pg.validate() {
        eprintln!("worker: error: {e}");
        return ExitCode::from(2);
    }
    let config = match Config::load(&cli.config) {
        Ok(c) => Arc::new(c),
        Err(e) => {
            eprintln!("worker: error: {e}");
            return ExitCode::from(2);
        }
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    match rt.block_on(serve(cli, config, hooks)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("worker: error: {e:#}");
            ExitCode::from(1)
        }
    }
}

/// The config with its slots numbered from Postgres (DESIGN 4.18), before
/// the first delivery is taken: a worker that judged slot numbers by list
/// position would refuse, or run under another time, every slot of an
/// edited schedule. Postgres down at start is waited for (doubling pauses,
/// 1 s to 30 s, each failure logged), like every other store call of the
/// worker; `None` when a signal came first.
async fn numbered(
    config: Arc<Config>,
    pool: &sqlx::PgPool,
    cancel: &CancellationToken,
) -> Option<Arc<Config>> {
    let mut config = Arc::unwrap_or_clone(config);
    let mut pause = std::time::Duration::from_secs(1);
    loop {
        match slotgate::store::number_kinds(pool, &mut config.kinds).await {
            Ok(()) => return Some(Arc::new(config)),
            Err(e) => {
                let e =
                    anyhow::Error::from(e).context("reading the slot numbers (table slot_number)");
                tracing::warn!(
                    error = format!("{e:#}"),
                    retry_in_s = pause.as_secs(),
                    "cannot number the config's slots yet; no delivery is taken until it can"
                );
            }
        }
        tokio::select! {
            () = cancel.cancelled() => return None,
            () = tokio::time::sleep(pause) => {}
        }
        pause = (pause * 2).min(std::time::Duration::from_secs(30));
    }
}

fn default_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "worker".into());
    format!("{host}-{}", std::process::id())
}

/// Wires the stores, the health endpoints and the signals to the runtime.
async fn serve(cli: Cli, config: Arc<Config>, hooks: Hooks) -> Result<()> {
    let id = cli.id.unwrap_or_else(default_id);
    let conns = u32::from(cli.concurrency) + 4;
    // Lazy: a store that is down at start is retried with backoff, not fatal.
    let pool = slotgate::store::connect_lazy(&cli.database_url, conns, &cli.pg)
        .with_context(|| format!("bad DATABASE_URL {}", redact_url(&cli.database_url)))?;
    let redis = slotgate::queue::pool_with(&cli.redis_url, conns as usize, &cli.redis)?;
    let queue = Queue::new(
        redis,
        KeySpace::partitioned(cli.prefix, config.redis_partitions, false),
    )
    .with_dead_letter_cap(cli.max_dead_letters);
    let mut opts = WorkerOptions::new(id);
    opts.concurrency = cli.concurrency.into();
    opts.batch = cli.batch.into();
    opts.lease_ttl = cli.lease_ttl;
    opts.visibility = cli.visibility;
    opts.shutdown_grace = cli.shutdown_grace;
    opts.reconcile_every = cli.reconcile_every;
    opts.tx_deadline = cli.pg.transaction_deadline;
    opts.forget_after = cli.forget_after;
    opts.hooks = hooks;
    let cancel = CancellationToken::new();
    slotgate_process::shutdown::on_signals(cancel.clone());
    let clock: slotgate::clock::SharedClock = Arc::new(SystemClock);
    let metrics = CancellationToken::new();
    let fingerprint: Arc<std::sync::OnceLock<String>> = Arc::default();
    if let Some(addr) = cli.metrics_addr {
        let probe = slotgate_process::health::Probe {
            pool: pool.clone(),
            queue: queue.clone(),
            clock: clock.clone(),
            config: fingerprint.clone(),
            alive: None,
        };
        slotgate_process::health::serve(addr, probe, metrics.clone())
            .await
            .with_context(|| format!("serving metrics on {addr}"))?;
    }
    let Some(config) = numbered(config, &pool, &cancel).await else {
        metrics.cancel();
        return Ok(());
    };
    let _ = fingerprint.set(config.fingerprint());
    let worker = Worker {
        opts,
        config,
        pool,
        queue,
        clock,
        entropy: Arc::new(slotgate::retry::OsEntropy),
    };
    worker.run(cancel).await;
    metrics.cancel();
    Ok(())
}
