//! `planner serve`: the operator console. A JSON API over the same library
//! calls as the CLI (`report`, `status`, dead letters, the latest
//! executions), server-sent events when executions are recorded, and one
//! page (HTML/CSS/JS embedded in the binary; no external assets) over it.
//!
//! Actions (`POST /api/<verb>`) exist only when the console was started with
//! `--allow-actions`; each needs `Authorization: Bearer <token>` and calls the
//! same `Planner` method as its CLI twin, so it is recorded the same way
//! (caller `manual`). Without `--allow-actions` those routes are not there
//! at all (404).
//!
//! Events: one task polls Postgres once a second for execution ids above
//! the last one seen and fans them out to every open `/api/events` stream.
//! Polling (rather than LISTEN/NOTIFY) needs no trigger on the hot path's
//! table and no dedicated connection per console, and a second is well
//! inside the page's five-second promise.
//!
//! Exposure (DESIGN.md 4.14): every request's Host must be the bound
//! address (or `localhost:PORT` on loopback, or an `--allow-host` name), so
//! a page on another origin that rebinds its DNS name to this address reads
//! nothing; connections and event streams are capped; a client has
//! [`HEADER_READ_TIMEOUT`](slotgate_process::listener::HEADER_READ_TIMEOUT) to send its request head and a request
//! [`REQUEST_TIMEOUT`] to be answered; on shutdown, connections without a
//! whole request close at once, event streams end, in-flight requests get
//! [`SHUTDOWN_GRACE`], then everything is closed.
//!
//! - `slotgate_process::listener`: the connection cap and the socket-level
//!   deadlines, shared with the health listener.
//! - [`liveness`]: `planner run`'s rounds under a deadline and its
//!   `/healthz` (the planner's other HTTP listener).

pub mod liveness;

use axum::extract::{Path, Query, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use chrono::{DateTime, NaiveDate, Utc};
use futures_util::stream::Stream;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use slotgate::operator::OperatorError;
use slotgate::plan::{PlanError, Planner};
use slotgate::slot::SlotKey;
use std::convert::Infallible;
use std::future::IntoFuture;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{broadcast, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

/// The shortest `SLOTGATE_CONSOLE_TOKEN` accepted with `--allow-actions`.
pub const MIN_TOKEN_CHARS: usize = 16;

/// How often the event task looks for new executions.
const POLL_EVERY: Duration = Duration::from_secs(1);

/// Most rows any list endpoint returns.
const MAX_LIMIT: usize = 1000;

/// Longest a request may take from its head to its response's head
/// (reading its body included; an event stream's body is not counted): its
/// Postgres statements are bounded well inside it (`--pg-acquire-timeout`
/// 5 s, `--pg-statement-timeout` 10 s by default), so only a server that
/// went silent reaches it. Answered 503.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// How long in-flight requests may finish after SIGTERM before every
/// connection is closed.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

const INDEX_HTML: &str = include_str!("index.html");
const CONSOLE_CSS: &str = include_str!("console.css");
const CONSOLE_JS: &str = include_str!("console.js");

/// What the server needs: the planner (config, Postgres, Redis, clock) and,
/// when actions are allowed, their token.
pub struct Console {
    planner: Planner,
    token: Option<String>,
}

impl Console {
    /// A console over `planner`; `token`, when set, is required of every request.
    pub fn new(planner: Planner, token: Option<String>) -> Self {
        Console { planner, token }
    }
}

/// The listener's exposure settings (`planner serve` flags).
#[derive(Debug, Clone)]
pub struct Exposure {
    /// `--allow-host`: lowercased names accepted as Host (any port).
    pub allow_hosts: Vec<String>,
    /// `--max-connections`.
    pub max_connections: usize,
    /// `--max-event-streams`.
    pub max_event_streams: usize,
}

impl Default for Exposure {
    fn default() -> Self {
        Exposure {
            allow_hosts: Vec::new(),
            max_connections: 128,
            max_event_streams: 32,
        }
    }
}

struct Shared {
    console: Console,
    events: broadcast::Sender<Value>,
    cancel: CancellationToken,
    /// One permit per open event stream.
    streams: Arc<Semaphore>,
    max_streams: usize,
    hosts: Hosts,
}

type AppState = Arc<Shared>;

/// Serves until `cancel` fires; then stops accepting, closes connections
/// that have not sent a whole request, ends event streams, gives in-flight
/// requests [`SHUTDOWN_GRACE`], closes whatever is left and returns.
pub async fn serve(
    console: Console,
    listener: tokio::net::TcpListener,
    exposure: Exposure,
    cancel: CancellationToken,
) -> std::io::Result<()> {
    let (sender, _) = broadcast::channel(256);
    let actions = console.token.is_some();
    let bound = listener.local_addr()?;
    let state = Arc::new(Shared {
        console,
        events: sender,
        cancel: cancel.clone(),
        streams: Arc::new(Semaphore::new(exposure.max_event_streams)),
        max_streams: exposure.max_event_streams,
        hosts: Hosts::new(bound, &exposure.allow_hosts),
    });
    let poller = tokio::spawn(poll_executions(state.clone()));
    let mut app = Router::new()
        .route("/", get(index))
        .route("/console.css", get(css))
        .route("/console.js", get(js))
        .route("/api/report", get(report))
        .route("/api/status", get(status))
        .route("/api/dead", get(dead))
        .route("/api/forecast", get(forecast))
        .route("/api/drafts", get(drafts))
        .route("/api/executions", get(executions))
        .route("/api/events", get(events));
    if actions {
        app = app.route("/api/{verb}", post(action));
    }
    let app = app
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            exposure_guard,
        ))
        .with_state(state);
    let hard = CancellationToken::new();
    let listener = slotgate_process::listener::GuardedListener::new(
        listener,
        slotgate_process::listener::Limits {
            name: "console",
            cap_set_by: "--max-connections",
            max_connections: exposure.max_connections,
            stop: cancel.clone(),
            hard: hard.clone(),
        },
    );
    let stop = cancel.clone();
    let server = axum::serve(listener, app)
        .with_graceful_shutdown(async move { stop.cancelled().await })
        .into_future();
    let mut server = std::pin::pin!(server);
    let r = tokio::select! {
        r = &mut server => r,
        _ = async { cancel.cancelled().await; tokio::time::sleep(SHUTDOWN_GRACE).await } => {
            tracing::warn!(grace = ?SHUTDOWN_GRACE, "console: requests still open after the shutdown grace; closing them");
            hard.cancel();
            // Each connection fails its next read or write; one that is
            // not polled again is dropped with the runtime.
            tokio::time::timeout(Duration::from_secs(1), &mut server)
                .await
                .unwrap_or(Ok(()))
        }
    };
    cancel.cancel();
    let _ = poller.await;
    r
}

// ---------------------------------------------------------------- exposure

/// The Host header values the console answers (see [`Hosts::check`]).
struct Hosts {
    port: u16,
    /// The bound IP as a Host writes it (`127.0.0.1`, `[::1]`).
    ip: String,
    loopback: bool,
    unspecified: bool,
    names: Vec<String>,
}

impl Hosts {
    fn new(bound: SocketAddr, names: &[String]) -> Self {
        let ip = match bound {
            SocketAddr::V4(a) => a.ip().to_string(),
            SocketAddr::V6(a) => format!("[{}]", a.ip()),
        };
        Hosts {
            port: bound.port(),
            ip,
            loopback: bound.ip().is_loopback(),
            unspecified: bound.ip().is_unspecified(),
            names: names.to_vec(),
        }
    }

    /// `Ok` when `host` (a Host header) names this console: the bound
    /// IP:port; `localhost:PORT` when bound to loopback or to every
    /// address; any IP literal with the bound port when bound to every
    /// address (a page can only reach an IP literal from its own origin,
    /// so it is no rebinding); an `--allow-host` name with any port. The
    /// port may be left out only when it is 80. Anything else is a name some
    /// other origin chose: refused.
    fn check(&self, host: Option<&HeaderValue>) -> Result<(), String> {
        let Some(raw) = host else {
            return Err("the request has no Host header".into());
        };
        let Ok(raw) = raw.to_str() else {
            return Err("the Host header is not text".into());
        };
        let host = raw.trim().to_ascii_lowercase();
        let (name, port) = split_host(&host);
        let port_ok = port.map_or(self.port == 80, |p| p == Some(self.port));
        let allowed = self.names.iter().any(|n| *n == name)
            || (port_ok
                && (name == self.ip
                    || ((self.loopback || self.unspecified) && name == "localhost")
                    || (self.unspecified && is_ip_literal(name))));
        if allowed {
            Ok(())
        } else {
            Err(format!(
                "Host {:?} is not this console's address ({}:{}{}); add --allow-host to serve another name",
                printable_host(raw),
                self.ip,
                self.port,
                if self.loopback {
                    format!(" or localhost:{}", self.port)
                } else {
                    String::new()
                }
            ))
        }
    }
}

/// `host[:port]` split; the port is `None` when absent and `Some(None)`
/// when it is not a number.
fn split_host(h: &str) -> (&str, Option<Option<u16>>) {
    let (name, port) = if let Some(rest) = h.strip_prefix('[') {
        match rest.split_once(']') {
            Some((ip, tail)) => (&h[..ip.len() + 2], tail.strip_prefix(':')),
            None => (h, None),
        }
    } else {
        match h.rsplit_once(':') {
            Some((n, p)) => (n, Some(p)),
            None => (h, None),
        }
    };
    (name, port.map(|p| p.parse().ok()))
}

fn is_ip_literal(name: &str) -> bool {
    let bare = name
        .strip_prefix('[')
        .and_then(|n| n.strip_suffix(']'))
        .unwrap_or(name);
    bare.parse::<std::net::IpAddr>().is_ok()
}

/// A Host header as it may be quoted back: at most 100 characters.
fn printable_host(raw: &str) -> String {
    raw.chars().take(100).collect()
}

/// Every request: the Host check (421), the request deadline (503), and
/// `Connection: close` on every answer, so that each connection carries one
/// request and the socket's head deadline covers it (see `slotgate_process::listener`).
async fn exposure_guard(State(s): State<AppState>, req: Request, next: Next) -> Response {
    let mut resp = match s.hosts.check(req.headers().get(header::HOST)) {
        Err(why) => {
            tracing::warn!(reason = %why, "console: request refused");
            ApiError(StatusCode::MISDIRECTED_REQUEST, why).into_response()
        }
        Ok(()) => match tokio::time::timeout(REQUEST_TIMEOUT, next.run(req)).await {
            Ok(r) => r,
            Err(_) => {
                tracing::warn!(timeout = ?REQUEST_TIMEOUT, "console: request timed out");
                ApiError(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!(
                        "the request took longer than {}s (Postgres or Redis did not answer)",
                        REQUEST_TIMEOUT.as_secs()
                    ),
                )
                .into_response()
            }
        },
    };
    resp.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    resp
}

// ---------------------------------------------------------------- errors

/// An API error: a status and a message, as `{"error": "..."}`.
struct ApiError(StatusCode, String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.0, Json(json!({"error": self.1}))).into_response()
    }
}

fn internal(what: &str, e: impl std::error::Error) -> ApiError {
    tracing::warn!(error = %e, "console: {what} failed");
    ApiError(StatusCode::INTERNAL_SERVER_ERROR, format!("{what}: {e}"))
}

impl From<OperatorError> for ApiError {
    fn from(e: OperatorError) -> Self {
        let code = match &e {
            OperatorError::Plan(p) => return p_error(p, e.to_string()),
            OperatorError::AlreadyGated { .. }
            | OperatorError::ReplayPastDeadline { .. }
            | OperatorError::ReplayNotPlanned { .. } => StatusCode::CONFLICT,
            OperatorError::UntilPast(_) | OperatorError::NotReplayable { .. } => {
                StatusCode::BAD_REQUEST
            }
            OperatorError::NoSuchDeadLetter(_) => StatusCode::NOT_FOUND,
            OperatorError::Store(_) | OperatorError::Queue(_) => {
                return internal("action", e);
            }
        };
        ApiError(code, e.to_string())
    }
}

impl From<PlanError> for ApiError {
    fn from(e: PlanError) -> Self {
        let msg = e.to_string();
        p_error(&e, msg)
    }
}

fn p_error(e: &PlanError, msg: String) -> ApiError {
    let code = match e {
        PlanError::UnknownKind(_) | PlanError::UnknownSlot { .. } | PlanError::BadRange { .. } => {
            StatusCode::BAD_REQUEST
        }
        // Not yet due: the console's trigger never sends --early.
        PlanError::NotDue { .. } => StatusCode::CONFLICT,
        PlanError::NoSuchSlot(_) => StatusCode::NOT_FOUND,
        PlanError::NotFailed { .. } => StatusCode::CONFLICT,
        PlanError::Store(_) | PlanError::Queue(_) => {
            tracing::warn!(error = %msg, "console: action failed");
            StatusCode::INTERNAL_SERVER_ERROR
        }
    };
    ApiError(code, msg)
}

// ---------------------------------------------------------------- assets

/// The page loads nothing but its own script and style, and talks only to
/// this server: even a string that slipped past the page's escaping (slot
/// keys and callers are whatever a stranger sent) could not run.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; \
                   connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; \
                   frame-ancestors 'none'";

async fn index() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CONTENT_SECURITY_POLICY, CSP),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        INDEX_HTML,
    )
}

async fn css() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
        CONSOLE_CSS,
    )
}

async fn js() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        CONSOLE_JS,
    )
}

// ---------------------------------------------------------------- reads

#[derive(Deserialize)]
struct ReportQuery {
    day: Option<NaiveDate>,
    /// One kind, or several separated by commas.
    kind: Option<String>,
}

/// `GET /api/report`: the same JSON as `planner report --json`.
async fn report(
    State(s): State<AppState>,
    Query(q): Query<ReportQuery>,
) -> Result<Json<slotgate::report::Report>, ApiError> {
    let p = &s.console.planner;
    let kinds: Vec<String> = q
        .kind
        .iter()
        .flat_map(|k| k.split(','))
        .filter(|k| !k.is_empty())
        .map(str::to_owned)
        .collect();
    if let Some(k) = kinds.iter().find(|k| p.config.kind(k).is_none()) {
        return Err(ApiError(
            StatusCode::BAD_REQUEST,
            format!("unknown kind {k:?} (not in the config)"),
        ));
    }
    slotgate::report::build(&p.pool, &p.config, &p.clock, q.day, &kinds)
        .await
        .map(Json)
        .map_err(|e| internal("report", e))
}

/// `GET /api/status`: the same JSON as `planner status --json`.
async fn status(State(s): State<AppState>) -> Result<Json<slotgate::report::Status>, ApiError> {
    let p = &s.console.planner;
    let mut status = slotgate::report::full_status(&p.queue, &p.pool, &p.clock)
        .await
        .map_err(|e| internal("status", e))?;
    status.compare_config(p.config.fingerprint());
    Ok(Json(status))
}

#[derive(Deserialize)]
struct LimitQuery {
    limit: Option<usize>,
}

/// `GET /api/dead`: dead letters, newest first.
async fn dead(
    State(s): State<AppState>,
    Query(q): Query<LimitQuery>,
) -> Result<Json<Value>, ApiError> {
    let limit = q.limit.unwrap_or(100).min(MAX_LIMIT);
    let v = s.console.planner.dead_letters(limit).await?;
    Ok(Json(json!({ "dead": v })))
}

/// `?days=&kind=` of `/api/forecast`.
#[derive(Deserialize)]
struct ForecastQuery {
    days: Option<u32>,
    /// One kind, or several separated by commas.
    kind: Option<String>,
}

/// The kinds a query names (comma-separated; none: every kind), or a 400
/// naming the first one the config does not have.
fn chosen_kinds<'a>(
    config: &'a slotgate::config::Config,
    kind: Option<&str>,
) -> Result<Vec<&'a slotgate::config::KindConfig>, ApiError> {
    let names: Vec<&str> = kind
        .into_iter()
        .flat_map(|k| k.split(','))
        .filter(|k| !k.is_empty())
        .collect();
    if let Some(k) = names.iter().find(|k| config.kind(k).is_none()) {
        return Err(ApiError(
            StatusCode::BAD_REQUEST,
            format!("unknown kind {k:?} (not in the config)"),
        ));
    }
    Ok(config
        .kinds
        .iter()
        .filter(|k| names.is_empty() || names.contains(&k.name.as_str()))
        .collect())
}

/// `GET /api/forecast`: the same JSON as `planner forecast --json`
/// (`days` 1..=366, default 14). It only reads.
async fn forecast(
    State(s): State<AppState>,
    Query(q): Query<ForecastQuery>,
) -> Result<Json<slotgate::forecast::Forecast>, ApiError> {
    let p = &s.console.planner;
    let days = q.days.unwrap_or(slotgate::forecast::DEFAULT_DAYS);
    let max = slotgate::forecast::MAX_DAYS;
    if !(1..=max).contains(&days) {
        return Err(ApiError(
            StatusCode::BAD_REQUEST,
            format!("days {days}: expected 1 to {max}"),
        ));
    }
    let kinds = chosen_kinds(&p.config, q.kind.as_deref())?;
    slotgate::report::forecast(&p.pool, &p.config, &kinds, days)
        .await
        .map(Json)
        .map_err(|e| internal("forecast", e))
}

/// `?kind=&status=&next=` of `/api/drafts`.
#[derive(Deserialize)]
struct DraftsQuery {
    kind: Option<String>,
    status: Option<String>,
    /// Only the first this many ready drafts, in the pick's order
    /// (`status` is then ignored): what the page lists.
    next: Option<i64>,
}

/// `GET /api/drafts`: the same JSON as `planner drafts list --json`
/// (priority and category included); with `next=N`, the first N ready
/// drafts in the pick's order, which is what the page shows.
async fn drafts(
    State(s): State<AppState>,
    Query(q): Query<DraftsQuery>,
) -> Result<Json<Vec<slotgate::store::Draft>>, ApiError> {
    let p = &s.console.planner;
    if let Some(k) = q.kind.as_deref().filter(|k| p.config.kind(k).is_none()) {
        return Err(ApiError(
            StatusCode::BAD_REQUEST,
            format!("unknown kind {k:?} (not in the config)"),
        ));
    }
    if let Some(n) = q.next {
        return slotgate::store::next_drafts(
            &p.pool,
            q.kind.as_deref(),
            n.clamp(0, MAX_LIMIT as i64),
        )
        .await
        .map(Json)
        .map_err(|e| internal("drafts", e));
    }
    let status = match q.status.as_deref() {
        None => None,
        Some(st) => Some(st.parse::<slotgate::store::DraftStatus>().map_err(|_| {
            ApiError(
                StatusCode::BAD_REQUEST,
                format!(
                    "unknown status {st:?}: expected draft, ready, publishing, published or failed"
                ),
            )
        })?),
    };
    slotgate::store::list_drafts(&p.pool, q.kind.as_deref(), status)
        .await
        .map(Json)
        .map_err(|e| internal("drafts", e))
}

/// One recorded execution, for the page's "latest executions".
#[derive(Serialize)]
struct ExecutionView {
    id: i64,
    slot: String,
    caller: String,
    worker: String,
    outcome: slotgate::outcome::SlotState,
    reason: Option<slotgate::outcome::Reason>,
    started_at: DateTime<Utc>,
    finished_at: DateTime<Utc>,
}

/// `GET /api/executions`: the latest executions, newest first.
async fn executions(
    State(s): State<AppState>,
    Query(q): Query<LimitQuery>,
) -> Result<Json<Value>, ApiError> {
    let limit = q.limit.unwrap_or(50).min(MAX_LIMIT) as i64;
    let rows = slotgate::store::latest_executions(&s.console.planner.pool, limit)
        .await
        .map_err(|e| internal("executions", e))?;
    let v: Vec<ExecutionView> = rows
        .into_iter()
        .map(|r| ExecutionView {
            id: r.id,
            slot: r.slot_key,
            caller: r.caller,
            worker: r.worker_id,
            outcome: r.outcome,
            reason: r.reason,
            started_at: r.started_at,
            finished_at: r.finished_at,
        })
        .collect();
    Ok(Json(json!({ "executions": v })))
}

// ---------------------------------------------------------------- events

/// Polls for new execution ids and broadcasts each as
/// `{"id", "slot", "outcome", "reason"}`.
async fn poll_executions(s: AppState) {
    let pool = &s.console.planner.pool;
    let mut last: Option<i64> = None;
    loop {
        if last.is_none() {
            match slotgate::store::last_execution_id(pool).await {
                Ok(m) => last = Some(m.unwrap_or(0)),
                Err(e) => {
                    tracing::warn!(error = %e, "console: reading the last execution id failed; will retry")
                }
            }
        } else if let Some(after) = last {
            match slotgate::store::executions_after(pool, after, 500).await {
                Ok(rows) => {
                    for r in rows {
                        last = Some(r.id);
                        let ev = json!({
                            "id": r.id,
                            "slot": r.slot_key,
                            "outcome": r.outcome,
                            "reason": r.reason,
                        });
                        // No subscriber is fine: nobody is watching.
                        let _ = s.events.send(ev);
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "console: polling executions failed; will retry")
                }
            }
        }
        tokio::select! {
            _ = s.cancel.cancelled() => return,
            _ = tokio::time::sleep(POLL_EVERY) => {}
        }
    }
}

/// `GET /api/events`: `event: execution` with the JSON above, per new
/// execution. A slow reader that falls behind gets `event: lagged` and
/// should reload its data.
/// At most `--max-event-streams` are open at once (each holds a permit
/// until its client goes); one more is 503 with the reason.
async fn events(
    State(s): State<AppState>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let permit: OwnedSemaphorePermit = s.streams.clone().try_acquire_owned().map_err(|_| {
        ApiError(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "too many event streams open (the cap is {}, --max-event-streams); close a console page or raise the cap",
                s.max_streams
            ),
        )
    })?;
    let rx = s.events.subscribe();
    let cancel = s.cancel.clone();
    let state = (rx, cancel, permit);
    let stream = futures_util::stream::unfold(state, |(mut rx, cancel, permit)| async move {
        let ev = tokio::select! {
            _ = cancel.cancelled() => return None,
            r = rx.recv() => match r {
                Ok(v) => Event::default().event("execution").data(v.to_string()),
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    Event::default().event("lagged").data(n.to_string())
                }
                Err(broadcast::error::RecvError::Closed) => return None,
            },
        };
        Some((Ok(ev), (rx, cancel, permit)))
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()))
}

// ---------------------------------------------------------------- actions

/// Constant-time comparison of the presented token with the configured one
/// (the time taken depends only on the presented token's length).
fn token_matches(presented: &[u8], expected: &[u8]) -> bool {
    let mut diff = presented.len() ^ expected.len();
    for (i, b) in presented.iter().enumerate() {
        let e = expected
            .get(i % expected.len().max(1))
            .copied()
            .unwrap_or(0);
        diff |= usize::from(b ^ e);
    }
    diff == 0
}

fn authorized(s: &Shared, headers: &HeaderMap) -> bool {
    let Some(expected) = s.console.token.as_deref() else {
        return false;
    };
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "))
        .is_some_and(|t| token_matches(t, expected.as_bytes()))
}

/// The body of every action; which fields are needed depends on the verb.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct ActionBody {
    slot: Option<String>,
    kind: Option<String>,
    day: Option<NaiveDate>,
    slot_no: Option<u32>,
    requeue_draft: Option<bool>,
    until: Option<DateTime<Utc>>,
    note: Option<String>,
    id: Option<String>,
    force: Option<bool>,
}

fn need<T>(v: Option<T>, field: &str, verb: &str) -> Result<T, ApiError> {
    v.ok_or_else(|| {
        ApiError(
            StatusCode::BAD_REQUEST,
            format!("{verb} needs the field {field:?}"),
        )
    })
}

fn slot_of(b: &ActionBody, verb: &str) -> Result<SlotKey, ApiError> {
    let raw = need(b.slot.as_deref(), "slot", verb)?;
    raw.parse()
        .map_err(|e| ApiError(StatusCode::BAD_REQUEST, format!("slot {raw:?}: {e}")))
}

/// `POST /api/<verb>`: 401 before anything else without the right token.
async fn action(
    State(s): State<AppState>,
    Path(verb): Path<String>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Json<Value>, ApiError> {
    if !authorized(&s, &headers) {
        return Err(ApiError(
            StatusCode::UNAUTHORIZED,
            "missing or wrong bearer token".into(),
        ));
    }
    let b: ActionBody = if body.is_empty() {
        ActionBody::default()
    } else {
        serde_json::from_slice(&body)
            .map_err(|e| ApiError(StatusCode::BAD_REQUEST, format!("bad JSON body: {e}")))?
    };
    let p = &s.console.planner;
    let note = b.note.clone().unwrap_or_default();
    let out = match verb.as_str() {
        "retry" => {
            let key = slot_of(&b, "retry")?;
            let entry = p.retry(&key).await?;
            json!({"slot": key.to_string(), "entry_id": entry})
        }
        "abandon" => {
            let key = slot_of(&b, "abandon")?;
            let requeue = b.requeue_draft.unwrap_or(false);
            let draft = p.abandon(&key, requeue).await?;
            json!({"slot": key.to_string(), "draft_id": draft, "requeue_draft": requeue})
        }
        "trigger" => {
            let kind = need(b.kind.as_deref(), "kind", "trigger")?;
            let day = need(b.day, "day", "trigger")?;
            let slot_no = need(b.slot_no, "slot_no", "trigger")?;
            let entry = p.trigger(kind, day, slot_no, "manual").await?;
            json!({"slot": SlotKey::new(kind, day, slot_no).to_string(), "entry_id": entry})
        }
        "pause" => {
            let kind = need(b.kind.as_deref(), "kind", "pause")?;
            p.pause(kind, b.until, &note).await?;
            json!({"kind": kind, "until": b.until})
        }
        "resume" => {
            let kind = need(b.kind.as_deref(), "kind", "resume")?;
            json!({"kind": kind, "was_paused": p.resume(kind).await?})
        }
        "skip" => {
            let key = slot_of(&b, "skip")?;
            p.skip(&key, &note).await?;
            json!({"slot": key.to_string()})
        }
        "replay" => {
            let id = need(b.id.as_deref(), "id", "replay")?;
            let force = b.force.unwrap_or(false);
            let (dead, entry) = p.replay_dead(id, force).await?;
            json!({"dead": dead, "entry_id": entry, "force": force})
        }
        other => {
            return Err(ApiError(
                StatusCode::NOT_FOUND,
                format!("no action {other:?}"),
            ))
        }
    };
    tracing::info!(verb, result = %out, "console action");
    Ok(Json(json!({"ok": true, "verb": verb, "result": out})))
}

#[cfg(test)]
mod tests {
    use super::{token_matches, HeaderValue, Hosts};

    fn check(h: &Hosts, host: &str) -> bool {
        h.check(Some(&HeaderValue::from_str(host).unwrap())).is_ok()
    }

    #[test]
    fn only_the_bound_address_and_allowed_names_are_hosts() {
        let h = Hosts::new(
            "127.0.0.1:8080".parse().unwrap(),
            &["console.internal".into()],
        );
        assert!(check(&h, "127.0.0.1:8080"));
        assert!(check(&h, "LOCALHOST:8080"));
        assert!(check(&h, "console.internal"));
        assert!(check(&h, "console.internal:443"));
        assert!(!check(&h, "evil.example:8080"));
        assert!(!check(&h, "127.0.0.1:8081"));
        assert!(!check(&h, "127.0.0.1"));
        assert!(!check(&h, "10.0.0.1:8080"));
        assert!(h.check(None).is_err());
        let any = Hosts::new("0.0.0.0:80".parse().unwrap(), &[]);
        assert!(check(&any, "10.0.0.1"));
        assert!(check(&any, "[fe80::1]:80"));
        assert!(check(&any, "localhost"));
        assert!(!check(&any, "evil.example"));
        let v6 = Hosts::new("[::1]:9000".parse().unwrap(), &[]);
        assert!(check(&v6, "[::1]:9000"));
        assert!(!check(&v6, "[::2]:9000"));
        let lan = Hosts::new("192.168.1.5:8080".parse().unwrap(), &[]);
        assert!(!check(&lan, "localhost:8080"));
    }

    #[test]
    fn tokens_match_only_when_equal() {
        assert!(token_matches(b"0123456789abcdef", b"0123456789abcdef"));
        assert!(!token_matches(b"0123456789abcdeF", b"0123456789abcdef"));
        assert!(!token_matches(b"0123456789abcde", b"0123456789abcdef"));
        assert!(!token_matches(b"0123456789abcdef0", b"0123456789abcdef"));
        assert!(!token_matches(b"", b"0123456789abcdef"));
    }
}
