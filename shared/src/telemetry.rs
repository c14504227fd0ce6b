//! Telemetry: logs, Prometheus metrics, and the health endpoints of the
//! worker and of `planner run`.
//!
//! Logs are human-readable lines by default; `SLOTGATE_LOG_FORMAT=json` for
//! machines. Level from `RUST_LOG` (default `info`).
//!
//! Metrics go through the `metrics` facade, so recording is a no-op until a
//! process installs the Prometheus recorder ([`serve`], behind
//! `worker --metrics-addr`). Names:
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `slotgate_executions_total` | counter | `kind`, `outcome`, `reason` |
//! | `slotgate_schedule_lag_seconds` | histogram | `kind` (first execution start − due) |
//! | `slotgate_queue_delayed` / `_ready` / `_pending` | gauge | — |
//! | `slotgate_queue_oldest_pending_seconds` | gauge | — |
//! | `slotgate_dead_letters_total` | counter | `reason` |
//! | `slotgate_dead_letters` | gauge | — (length of `P:dead`) |
//! | `slotgate_leader` | gauge | — (1 while this worker leads) |
//! | `slotgate_lease_changes_total` | counter | `change` (`acquired`, `lost`) |
//! | `slotgate_webhook_attempts_total` | counter | `endpoint`, `class` (`2xx`, `3xx`, `4xx`, `5xx`, `timeout`, `error`) |
//! | `slotgate_plan_rounds_total` | counter | `kind`, `result` (`ok`, `error`) — `planner run` |
//! | `slotgate_planned_slots_total` | counter | `kind` (slots `planner run` created) |
//! | `slotgate_stream_repairs_total` | counter | `stream` (`ready`, `dead`): broken streams moved aside |
//!
//! [`serve`] is shared by `worker --metrics-addr` and `planner run
//! --metrics-addr`: the same endpoints, probes and queue gauges.

use crate::clock::{unix_ms, SharedClock};
use crate::queue::Queue;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use sqlx::PgPool;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;

/// Installs the global log subscriber; safe to call more than once.
pub fn init() {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn"));
    let json = std::env::var("SLOTGATE_LOG_FORMAT").is_ok_and(|v| v == "json");
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_ansi(ansi)
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = if json {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}

/// One handled delivery.
pub fn execution(kind: &str, outcome: &'static str, reason: Option<&'static str>) {
    metrics::counter!("slotgate_executions_total", "kind" => kind.to_owned(), "outcome" => outcome, "reason" => reason.unwrap_or("")).increment(1);
}

/// Scheduling lag of a slot's first execution.
pub fn lag(kind: &str, lag: chrono::Duration) {
    metrics::histogram!("slotgate_schedule_lag_seconds", "kind" => kind.to_owned())
        .record(lag.num_milliseconds() as f64 / 1000.0);
}

pub fn dead_letter(reason: &'static str) {
    metrics::counter!("slotgate_dead_letters_total", "reason" => reason).increment(1);
}

/// A stream Redis refused to add to was moved aside and recreated.
pub fn stream_repair(stream: &'static str) {
    metrics::counter!("slotgate_stream_repairs_total", "stream" => stream).increment(1);
}

/// `acquired` or `lost`.
pub fn lease_change(change: &'static str, leading: bool) {
    metrics::counter!("slotgate_lease_changes_total", "change" => change).increment(1);
    metrics::gauge!("slotgate_leader").set(if leading { 1.0 } else { 0.0 });
}

/// One webhook try: `class` is `2xx`, `3xx`, `4xx`, `5xx`, `timeout` or `error`.
pub fn webhook_attempt(endpoint: &'static str, class: &'static str) {
    metrics::counter!("slotgate_webhook_attempts_total", "endpoint" => endpoint, "class" => class)
        .increment(1);
}

/// One planning round of `planner run` for a kind: `Some(new slots)` when it
/// succeeded, `None` when it failed (it is retried next round).
pub fn plan_round(kind: &str, new: Option<usize>) {
    let result = if new.is_some() { "ok" } else { "error" };
    metrics::counter!("slotgate_plan_rounds_total", "kind" => kind.to_owned(), "result" => result)
        .increment(1);
    if let Some(n) = new {
        metrics::counter!("slotgate_planned_slots_total", "kind" => kind.to_owned())
            .increment(n as u64);
    }
}

/// Everything the health endpoints need.
#[derive(Clone)]
pub struct Probe {
    pub pool: PgPool,
    pub queue: Queue,
    pub clock: SharedClock,
}

impl Probe {
    /// `None` when both stores answer, else what failed.
    async fn not_ready(&self) -> Option<String> {
        let pg = tokio::time::timeout(
            Duration::from_secs(2),
            sqlx::query("SELECT 1").execute(&self.pool),
        )
        .await;
        let pg = match pg {
            Ok(Ok(_)) => None,
            Ok(Err(e)) => Some(format!("postgres: {e}")),
            Err(_) => Some("postgres: timed out".into()),
        };
        let redis = match tokio::time::timeout(Duration::from_secs(2), self.queue.ping()).await {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(format!("redis: {e}")),
            Err(_) => Some("redis: timed out".into()),
        };
        match (pg, redis) {
            (None, None) => None,
            (a, b) => Some([a, b].into_iter().flatten().collect::<Vec<_>>().join("; ")),
        }
    }

    async fn refresh_gauges(&self) {
        if let Ok(d) = self.queue.depths(unix_ms(self.clock.now())).await {
            metrics::gauge!("slotgate_queue_delayed").set(d.delayed as f64);
            metrics::gauge!("slotgate_queue_ready").set(d.ready as f64);
            metrics::gauge!("slotgate_queue_pending").set(d.pending as f64);
            metrics::gauge!("slotgate_queue_oldest_pending_seconds")
                .set(d.oldest_pending_ms.unwrap_or(0) as f64 / 1000.0);
            metrics::gauge!("slotgate_dead_letters").set(d.dead as f64);
        }
    }
}

/// Installs the Prometheus recorder and serves `/metrics`, `/healthz`
/// (process alive) and `/readyz` (Postgres and Redis reachable) on `addr`
/// until `cancel`. Returns the bound address (port 0 picks one).
pub async fn serve(
    addr: SocketAddr,
    probe: Probe,
    cancel: CancellationToken,
) -> std::io::Result<SocketAddr> {
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(
            metrics_exporter_prometheus::Matcher::Suffix("_seconds".into()),
            &[
                0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
            ],
        )
        .map_err(std::io::Error::other)?
        .install_recorder()
        .map_err(std::io::Error::other)?;
    let listener = TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    tracing::info!(%bound, "metrics and health endpoints listening");
    tokio::spawn(async move {
        loop {
            let sock = tokio::select! {
                _ = cancel.cancelled() => return,
                r = listener.accept() => match r { Ok((s, _)) => s, Err(_) => continue },
            };
            let (probe, handle) = (probe.clone(), handle.clone());
            tokio::spawn(async move {
                let _ = respond(sock, &probe, &handle).await;
            });
        }
    });
    Ok(bound)
}

async fn respond(
    mut sock: tokio::net::TcpStream,
    probe: &Probe,
    handle: &PrometheusHandle,
) -> std::io::Result<()> {
    let mut buf = vec![0u8; 2048];
    let n = tokio::time::timeout(Duration::from_secs(5), sock.read(&mut buf))
        .await
        .map_err(std::io::Error::other)??;
    let head = String::from_utf8_lossy(&buf[..n]);
    let path = head.split_whitespace().nth(1).unwrap_or("/");
    let (status, ctype, body) = match path {
        "/metrics" => {
            probe.refresh_gauges().await;
            ("200 OK", "text/plain; version=0.0.4", handle.render())
        }
        "/healthz" => ("200 OK", "text/plain", "ok\n".to_owned()),
        "/readyz" => match probe.not_ready().await {
            None => ("200 OK", "text/plain", "ready\n".to_owned()),
            Some(why) => (
                "503 Service Unavailable",
                "text/plain",
                format!("not ready: {why}\n"),
            ),
        },
        _ => ("404 Not Found", "text/plain", "not found\n".to_owned()),
    };
    let resp = format!("HTTP/1.1 {status}\r\ncontent-type: {ctype}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}", body.len());
    sock.write_all(resp.as_bytes()).await?;
    sock.shutdown().await
}
