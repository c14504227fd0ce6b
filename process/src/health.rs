//! The metrics and health endpoints of `worker --metrics-addr` and `planner
//! run --metrics-addr`: `/metrics` (Prometheus), `/healthz` (process alive;
//! for `planner run` also its planning rounds succeeding, [`Probe::alive`])
//! and `/readyz` (Postgres reachable and taking writes, Redis reachable;
//! a worker whose config fingerprint differs from this process's is named
//! in the body).
//!
//! An HTTP listener is a process's business, not the library's: the library
//! only records metrics (`slotgate::telemetry`); this module installs the
//! Prometheus recorder and answers, for the worker and `planner run` alike.

use crate::listener::{GuardedListener, Limits};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use slotgate::clock::{unix_ms, SharedClock};
use slotgate::queue::Queue;
use sqlx::PgPool;
use std::future::IntoFuture;
use std::net::SocketAddr;
use std::time::Duration;
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
    /// This process's config fingerprint
    /// (`slotgate::config::Config::fingerprint`), once its config is
    /// numbered; `/readyz` names live workers whose fingerprint differs.
    pub config: std::sync::Arc<std::sync::OnceLock<String>>,
    /// What `/healthz` asks besides "the process answers": `None` while
    /// healthy, else why not (answered `503 unhealthy: <why>`). `planner
    /// run` sets it to its planning rounds' liveness
    /// (`planner/src/console/liveness.rs`); the worker leaves it unset.
    ///
    pub alive: Option<Alive>,
}

/// See [`Probe::alive`].
pub type Alive = std::sync::Arc<dyn Fn() -> Option<String> + Send + Sync>;

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

    /// Live workers (clock measured within a minute) whose config
    /// fingerprint is not this process's, as `id (fingerprint)`. Named,
    /// not made a reason to fail: during a rolling update old and new
    /// fingerprints meet by design, and failing readiness then would stall
    /// the rollout; the operator reads it here, in `planner status` and in
    /// the console.
    async fn config_differs(&self) -> Vec<String> {
        let Some(ours) = self.config.get() else {
            return Vec::new();
        };
        let clocks = tokio::time::timeout(
            Duration::from_secs(2),
            slotgate::store::worker_clocks(&self.pool, Duration::from_secs(60)),
        )
        .await;
        match clocks {
            Ok(Ok(clocks)) => clocks
                .into_iter()
                .filter_map(|c| {
                    let theirs = c.config?;
                    (theirs != *ours).then(|| {
                        format!("{} ({theirs})", slotgate::terminal::printable(&c.worker_id))
                    })
                })
                .collect(),
            _ => Vec::new(),
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
/// reachable) on `addr` until `cancel`. Returns the bound address (port 0
/// picks one).
///
/// Served with `axum` through [`crate::listener`], as the console is: at
/// most [`MAX_CONNECTIONS`] open at once, a request head within
/// [`crate::listener::HEADER_READ_TIMEOUT`], one request per connection.
/// A metrics port is often reachable by more than the scraper (a pod
/// network, a host port), so whoever can connect meets the same limits
/// as at the console, not a hand-written server that took one read as
/// the request.
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
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .fallback(not_found)
        .with_state(State { probe, handle });
    let hard = CancellationToken::new();
    let listener = GuardedListener::new(
        listener,
        Limits {
            name: "health",
            cap_set_by: "",
            max_connections: MAX_CONNECTIONS,
            stop: cancel.clone(),
            hard: hard.clone(),
        },
    );
    tokio::spawn(async move {
        let stop = cancel.clone();
        let server = axum::serve(listener, app)
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .into_future();
        tokio::pin!(server);
        tokio::select! {
            r = &mut server => {
                if let Err(e) = r {
                    tracing::warn!(error = %e, "metrics and health listener ended");
                }
            }
            // A scrape in flight gets a second; the process is ending.
            _ = async { cancel.cancelled().await; tokio::time::sleep(Duration::from_secs(1)).await } => {
                hard.cancel();
            }
        }
    });
    Ok(bound)
}

/// Connections the health listener keeps open at once: a scraper and a
/// few probes need a handful; a stranger opening thousands gets `503`s
/// instead of the process's file descriptors.
pub const MAX_CONNECTIONS: usize = 64;

#[derive(Clone)]
struct State {
    probe: Probe,
    handle: PrometheusHandle,
}

/// A plain-text answer that closes its connection (one request per
/// connection, so the head deadline covers the whole of it).
fn text(status: StatusCode, ctype: &'static str, body: String) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, ctype), (header::CONNECTION, "close")],
        body,
    )
        .into_response()
}

async fn metrics(axum::extract::State(s): axum::extract::State<State>) -> Response {
    s.probe.refresh_gauges().await;
    text(
        StatusCode::OK,
        "text/plain; version=0.0.4",
        s.handle.render(),
    )
}

async fn healthz(axum::extract::State(s): axum::extract::State<State>) -> Response {
    match s.probe.alive.as_ref().and_then(|alive| alive()) {
        None => text(StatusCode::OK, "text/plain", "ok\n".to_owned()),
        Some(why) => text(
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            format!("unhealthy: {why}\n"),
        ),
    }
}

async fn readyz(axum::extract::State(s): axum::extract::State<State>) -> Response {
    let probe = &s.probe;
    match probe.not_ready().await {
        None => {
            let differs = probe.config_differs().await;
            let mut body = "ready\n".to_owned();
            if !differs.is_empty() {
                body.push_str(&format!(
                    "config {} differs from live workers: {} (they disagree on slots: deploy one config)\n",
                    probe.config.get().map(String::as_str).unwrap_or(""),
                    differs.join(", ")
                ));
            }
            text(StatusCode::OK, "text/plain", body)
        }
        Some(why) => text(
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            format!("not ready: {why}\n"),
        ),
    }
}

async fn not_found() -> Response {
    text(
        StatusCode::NOT_FOUND,
        "text/plain",
        "not found\n".to_owned(),
    )
}
