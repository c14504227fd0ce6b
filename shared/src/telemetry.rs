//! Telemetry: logs and the recording side of Prometheus metrics. Serving
//! them (`/metrics`, `/healthz`, `/readyz`) is the binaries' business: the
//! `slotgate-process` crate's `health` module, which installs the recorder.
//!
//! Logs are human-readable lines by default; `SLOTGATE_LOG_FORMAT=json` for
//! machines. Level from `RUST_LOG` (default `info`).
//!
//! Metrics go through the `metrics` facade, so recording is a no-op until a
//! process installs the Prometheus recorder
//! (`slotgate_process::health::serve`, behind `worker --metrics-addr` and
//! `planner run --metrics-addr`). Names:
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
//! | `slotgate_runway_days` | gauge | `kind`: days from the kind's today to the first with a slot `no_ready_draft` in a 14-day forecast, 14 when the drafts last (`planner run`, each round) |
//! | `slotgate_stream_repairs_total` | counter | `stream` (`ready`, `dead`): broken streams moved aside |

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

/// A delivery dead-lettered, by reason: a rising count means something is
/// writing malformed entries or deliveries keep failing.
pub fn dead_letter(reason: &'static str) {
    metrics::counter!("slotgate_dead_letters_total", "reason" => reason).increment(1);
}

/// A stream Redis refused to add to was moved aside and recreated.
pub fn stream_repair(stream: &'static str) {
    metrics::counter!("slotgate_stream_repairs_total", "stream" => stream).increment(1);
}

/// This worker's clock minus Postgres's, as last measured: a value far from
/// zero is a node whose time sync has failed (Postgres's clock decides every
/// shared time rule, but what the worker records is dated by its own).
pub fn clock_skew(skew_ms: i64) {
    metrics::gauge!("slotgate_worker_clock_skew_seconds").set(skew_ms as f64 / 1000.0);
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

/// A kind's runway after a `planner run` round: days until the first day a
/// slot would find no ready draft (0: today), or `horizon` (the forecast's
/// length) when the drafts last it. An alert on it warns before a day
/// publishes nothing.
pub fn runway(kind: &str, days: Option<i64>, horizon: u32) {
    metrics::gauge!("slotgate_runway_days", "kind" => kind.to_owned())
        .set(days.unwrap_or(i64::from(horizon)) as f64);
}
