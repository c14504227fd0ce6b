//! The metrics and health endpoints of `worker --metrics-addr` and `planner
//! run --metrics-addr`: `/metrics` (Prometheus), `/healthz` (process alive)
//! and `/readyz` (Postgres reachable and taking writes, Redis reachable).
//!
//! An HTTP listener is a process's business, not the library's: the library
//! only records metrics (`slotgate::telemetry`); this module installs the
//! Prometheus recorder and answers, for the worker and `planner run` alike.

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use slotgate::clock::{unix_ms, SharedClock};
use slotgate::queue::Queue;
use sqlx::PgPool;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Everything the health endpoints need.
#[derive(Clone)]
pub struct Probe {
    /// Postgres, checked by `/readyz`.
    pub pool: PgPool,
    /// Redis, checked by `/readyz`; its depths are the queue gauges.
    pub queue: Queue,
    /// The clock the queue depths are measured against.
    pub clock: SharedClock,
}

impl Probe {
    /// `None` when both stores answer, else what failed. A Postgres that
    /// answers but takes no writes (a standby behind the address after a
    /// failover) is not ready: nothing could be recorded there.
    async fn not_ready(&self) -> Option<String> {
        let pg = tokio::time::timeout(
            Duration::from_secs(2),
            slotgate::store::server_role(&self.pool),
        )
        .await;
        let pg = match pg {
            Ok(Ok(role)) => {
                let d = role.durability();
                (!d.writable()).then(|| format!("postgres: {}", d.warning().unwrap_or_default()))
            }
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
/// (process alive) and `/readyz` (Postgres reachable and writable, Redis
/// reachable) on `addr`
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
