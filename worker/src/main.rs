//! `worker`: consumes slot deliveries until SIGTERM/SIGINT. The runtime is
//! `slotgate::worker`; this file only parses flags and wires signals.

use anyhow::{Context, Result};
use clap::Parser;
use slotgate::clock::SystemClock;
use slotgate::config::Config;
use slotgate::queue::{KeySpace, Queue};
use slotgate::worker::{Worker, WorkerOptions};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

#[derive(Parser, Debug)]
#[command(
    name = "worker",
    version,
    about = "slotgate worker: runs slot deliveries exactly once in effect; stops on SIGTERM/SIGINT"
)]
struct Cli {
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
    /// Deliveries in flight at once.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..=1024))]
    concurrency: u16,
    /// Most record-only deliveries settled in one transaction; a batch takes one
    /// concurrency slot. 1 turns batching off.
    #[arg(long, default_value_t = slotgate::worker::DEFAULT_BATCH as u16, value_parser = clap::value_parser!(u16).range(1..=1000))]
    batch: u16,
    /// Leader lease time to live.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    lease_ttl: Duration,
    /// How long a delivery (and its claim) may go without a heartbeat before another worker takes it over.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    visibility: Duration,
    /// Time in-flight deliveries get to finish after SIGTERM.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    shutdown_grace: Duration,
    /// Serve Prometheus `/metrics`, `/healthz` and `/readyz` on HOST:PORT.
    #[arg(long, value_name = "HOST:PORT")]
    metrics_addr: Option<std::net::SocketAddr>,
    /// How often the leader reconciles Postgres against Redis.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    reconcile_every: Duration,
    /// TEST ONLY (the chaos suite's self-test): break one exactly-once rule
    /// on purpose. Hidden; logged at ERROR when the worker starts.
    #[arg(long, hide = true)]
    sabotage: Option<slotgate::sabotage::Sabotage>,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let d = slotgate::config::parse_duration(s)?;
    if d < Duration::from_millis(100) {
        return Err(format!("{s:?} is too short (at least 100ms)"));
    }
    Ok(d)
}

fn main() -> ExitCode {
    slotgate::telemetry::init();
    let cli = Cli::parse();
    if let Some(s) = cli.sabotage {
        slotgate::sabotage::arm(s);
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
    match rt.block_on(run(cli, config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("worker: error: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn default_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "worker".into());
    format!("{host}-{}", std::process::id())
}

async fn run(cli: Cli, config: Arc<Config>) -> Result<()> {
    let id = cli.id.unwrap_or_else(default_id);
    let conns = u32::from(cli.concurrency) + 4;
    // Lazy: a store that is down at start is retried with backoff, not fatal.
    let pool =
        slotgate::store::connect_lazy(&cli.database_url, conns).context("bad DATABASE_URL")?;
    let redis =
        slotgate::queue::pool(&cli.redis_url, conns as usize).map_err(anyhow::Error::msg)?;
    let queue = Queue::new(redis, KeySpace::new(cli.prefix));
    let mut opts = WorkerOptions::new(id);
    opts.concurrency = cli.concurrency.into();
    opts.batch = cli.batch.into();
    opts.lease_ttl = cli.lease_ttl;
    opts.visibility = cli.visibility;
    opts.shutdown_grace = cli.shutdown_grace;
    opts.reconcile_every = cli.reconcile_every;
    let cancel = CancellationToken::new();
    slotgate::worker::stop_on_signals(cancel.clone());
    let clock: slotgate::clock::SharedClock = Arc::new(SystemClock);
    let metrics = CancellationToken::new();
    if let Some(addr) = cli.metrics_addr {
        let probe = slotgate::telemetry::Probe {
            pool: pool.clone(),
            queue: queue.clone(),
            clock: clock.clone(),
        };
        slotgate::telemetry::serve(addr, probe, metrics.clone())
            .await
            .with_context(|| format!("serving metrics on {addr}"))?;
    }
    let worker = Worker {
        opts,
        config,
        pool,
        queue,
        clock,
    };
    worker.run(cancel).await;
    metrics.cancel();
    Ok(())
}
