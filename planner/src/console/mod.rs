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

use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
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
use sqlx::Row;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

/// The shortest `SLOTGATE_CONSOLE_TOKEN` accepted with `--allow-actions`.
pub const MIN_TOKEN_CHARS: usize = 16;

/// How often the event task looks for new executions.
const POLL_EVERY: Duration = Duration::from_secs(1);

/// Most rows any list endpoint returns.
const MAX_LIMIT: usize = 1000;

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
    pub fn new(planner: Planner, token: Option<String>) -> Self {
        Console { planner, token }
    }
}

struct Shared {
    console: Console,
    events: broadcast::Sender<Value>,
    cancel: CancellationToken,
}

type AppState = Arc<Shared>;

/// Serves until `cancel` fires, then finishes open requests (event streams
/// end at once) and returns.
pub async fn serve(
    console: Console,
    listener: tokio::net::TcpListener,
    cancel: CancellationToken,
) -> std::io::Result<()> {
    let (sender, _) = broadcast::channel(256);
    let actions = console.token.is_some();
    let state = Arc::new(Shared {
        console,
        events: sender,
        cancel: cancel.clone(),
    });
    let poller = tokio::spawn(poll_executions(state.clone()));
    let mut app = Router::new()
        .route("/", get(index))
        .route("/console.css", get(css))
        .route("/console.js", get(js))
        .route("/api/report", get(report))
        .route("/api/status", get(status))
        .route("/api/dead", get(dead))
        .route("/api/executions", get(executions))
        .route("/api/events", get(events));
    if actions {
        app = app.route("/api/{verb}", post(action));
    }
    let app = app.with_state(state);
    let stop = cancel.clone();
    let r = axum::serve(listener, app)
        .with_graceful_shutdown(async move { stop.cancelled().await })
        .await;
    cancel.cancel();
    let _ = poller.await;
    r
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
            OperatorError::AlreadyGated { .. } => StatusCode::CONFLICT,
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
    slotgate::pause::status(&p.queue, &p.pool, &p.clock)
        .await
        .map(Json)
        .map_err(|e| internal("status", e))
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

/// One recorded execution, for the page's "latest executions".
#[derive(Serialize)]
struct ExecutionView {
    id: i64,
    slot: String,
    caller: String,
    worker: String,
    outcome: String,
    reason: Option<String>,
    started_at: DateTime<Utc>,
    finished_at: DateTime<Utc>,
}

/// `GET /api/executions`: the latest executions, newest first.
async fn executions(
    State(s): State<AppState>,
    Query(q): Query<LimitQuery>,
) -> Result<Json<Value>, ApiError> {
    let limit = q.limit.unwrap_or(50).min(MAX_LIMIT) as i64;
    let rows = sqlx::query(
        "SELECT id, slot_key, caller, worker_id, outcome, reason, started_at, finished_at
           FROM execution ORDER BY id DESC LIMIT $1",
    )
    .bind(limit)
    .fetch_all(&s.console.planner.pool)
    .await
    .map_err(|e| internal("executions", e))?;
    let v: Result<Vec<ExecutionView>, sqlx::Error> = rows
        .iter()
        .map(|r| {
            Ok(ExecutionView {
                id: r.try_get("id")?,
                slot: r.try_get("slot_key")?,
                caller: r.try_get("caller")?,
                worker: r.try_get("worker_id")?,
                outcome: r.try_get("outcome")?,
                reason: r.try_get("reason")?,
                started_at: r.try_get("started_at")?,
                finished_at: r.try_get("finished_at")?,
            })
        })
        .collect();
    Ok(Json(
        json!({ "executions": v.map_err(|e| internal("executions", e))? }),
    ))
}

// ---------------------------------------------------------------- events

/// Polls for new execution ids and broadcasts each as
/// `{"id", "slot", "outcome", "reason"}`.
async fn poll_executions(s: AppState) {
    let pool = &s.console.planner.pool;
    let mut last: Option<i64> = None;
    loop {
        if last.is_none() {
            match sqlx::query_scalar::<_, Option<i64>>("SELECT max(id) FROM execution")
                .fetch_one(pool)
                .await
            {
                Ok(m) => last = Some(m.unwrap_or(0)),
                Err(e) => {
                    tracing::warn!(error = %e, "console: reading the last execution id failed; will retry")
                }
            }
        } else if let Some(after) = last {
            match sqlx::query(
                "SELECT id, slot_key, outcome, reason FROM execution WHERE id > $1 ORDER BY id LIMIT 500",
            )
            .bind(after)
            .fetch_all(pool)
            .await
            {
                Ok(rows) => {
                    for r in rows {
                        let id: i64 = r.get("id");
                        last = Some(id);
                        let ev = json!({
                            "id": id,
                            "slot": r.get::<String, _>("slot_key"),
                            "outcome": r.get::<String, _>("outcome"),
                            "reason": r.get::<Option<String>, _>("reason"),
                        });
                        // No subscriber is fine: nobody is watching.
                        let _ = s.events.send(ev);
                    }
                }
                Err(e) => tracing::warn!(error = %e, "console: polling executions failed; will retry"),
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
async fn events(State(s): State<AppState>) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let rx = s.events.subscribe();
    let cancel = s.cancel.clone();
    let stream = futures_util::stream::unfold((rx, cancel), |(mut rx, cancel)| async move {
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
        Some((Ok(ev), (rx, cancel)))
    });
    Sse::new(stream).keep_alive(KeepAlive::default())
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
            let (dead, entry) = p.replay_dead(id).await?;
            json!({"dead": dead, "entry_id": entry})
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
    use super::token_matches;

    #[test]
    fn tokens_match_only_when_equal() {
        assert!(token_matches(b"0123456789abcdef", b"0123456789abcdef"));
        assert!(!token_matches(b"0123456789abcdeF", b"0123456789abcdef"));
        assert!(!token_matches(b"0123456789abcde", b"0123456789abcdef"));
        assert!(!token_matches(b"0123456789abcdef0", b"0123456789abcdef"));
        assert!(!token_matches(b"", b"0123456789abcdef"));
    }
}
