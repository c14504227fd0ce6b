//! `planner run`: its planning rounds under a client-side deadline, and a
//! `/healthz` that says whether they still succeed.
//!
//! Why a deadline: Postgres's own `statement_timeout` and `lock_timeout`
//! (sent with every session's startup message, `slotgate::session`) end a
//! statement the server is running, but a server that went silent — a
//! frozen link, a vanished host, a hung proxy — sends nothing, so no
//! server-side timeout can reach the planner, and sqlx 0.8 cannot set TCP
//! keepalives on its client sockets (launchbadge/sqlx#3540 is open). A
//! tokio timeout around each round is what bounds it: the round's futures
//! are dropped (with their connections' queries), the miss is logged as an
//! error naming the plan it was stuck in, and the next round starts on time.
//!
//! Why `/healthz` follows the rounds: a planner whose rounds all fail is
//! alive only in name; an orchestrator restarting it gets fresh connections,
//! and an operator sees the reason in the body. The bound, 3 x `--every` +
//! `--round-deadline`, lets two rounds in a row fail (a Postgres restart)
//! before the third makes the planner unhealthy.
//!
//! The endpoints are `slotgate_process::health`'s, as in the worker (one
//! listener, one implementation of the metrics and the readiness checks);
//! `planner run` hands it [`Liveness::unhealthy`] as its `/healthz` check.

use slotgate::plan::Planner;
use slotgate::slot::local_today;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// When the last planning round succeeded, and the bound after which that is
/// too long ago.
pub struct Liveness {
    bound: Duration,
    state: Mutex<State>,
}

struct State {
    /// The last successful round's end, or the process's start before one.
    last_ok: Instant,
    succeeded_once: bool,
    last_error: Option<String>,
}

impl Liveness {
    /// Healthy until `3 * every + deadline` passes without a successful
    /// round (counted from now until the first one).
    pub fn new(every: Duration, deadline: Duration) -> Arc<Liveness> {
        Arc::new(Liveness {
            bound: every * 3 + deadline,
            state: Mutex::new(State {
                last_ok: Instant::now(),
                succeeded_once: false,
                last_error: None,
            }),
        })
    }

    /// The bound (3 x `--every` + `--round-deadline`).
    pub fn bound(&self) -> Duration {
        self.bound
    }

    fn succeeded(&self) {
        let mut s = self.state.lock().expect("liveness");
        s.last_ok = Instant::now();
        s.succeeded_once = true;
        s.last_error = None;
    }

    fn failed(&self, why: String) {
        self.state.lock().expect("liveness").last_error = Some(why);
    }

    /// `None` while healthy, else why not.
    pub fn unhealthy(&self) -> Option<String> {
        let s = self.state.lock().expect("liveness");
        let since = s.last_ok.elapsed();
        if since <= self.bound {
            return None;
        }
        Some(format!(
            "no planning round has succeeded {} {}s (bound {}s = 3 x --every + --round-deadline){}",
            if s.succeeded_once {
                "for"
            } else {
                "since the start,"
            },
            since.as_secs(),
            self.bound.as_secs(),
            s.last_error
                .as_deref()
                .map(|e| format!("; last error: {e}"))
                .unwrap_or_default()
        ))
    }
}

/// Plans today and tomorrow of every kind not in `skip`, each round under
/// `deadline`, every `every`, until `cancel`.
pub async fn run_rounds(
    p: &Planner,
    skip: &[String],
    every: Duration,
    deadline: Duration,
    live: &Liveness,
    cancel: &CancellationToken,
) {
    loop {
        // Which plan the round is in, for the log line of a missed deadline.
        let mut at = String::from("starting the round");
        let r = tokio::select! {
            _ = cancel.cancelled() => return,
            r = tokio::time::timeout(deadline, round(p, skip, &mut at)) => r,
        };
        match r {
            Ok(0) => live.succeeded(),
            Ok(failed) => live.failed(format!("{failed} plans of the round failed")),
            Err(_) => {
                let why = format!(
                    "the planning round missed its deadline of {} (--round-deadline) while {at}: Postgres or Redis did not answer",
                    humantime::format_duration(deadline)
                );
                tracing::error!(deadline = ?deadline, at = %at, "{why}; will retry next round");
                live.failed(why);
            }
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
    }
}

/// One round: each kind's today and tomorrow. Returns how many plans
/// failed (each is logged); `at` names the plan in progress.
async fn round(p: &Planner, skip: &[String], at: &mut String) -> usize {
    let now = p.clock.now();
    let mut failed = 0;
    for k in p.config.kinds.iter().filter(|k| !skip.contains(&k.name)) {
        let today = local_today(k.timezone, now);
        for day in [today, today.succ_opt().expect("date")] {
            *at = format!("planning kind {} day {day}", k.name);
            match p
                .plan_day(Some(day), std::slice::from_ref(&k.name), false)
                .await
            {
                Ok(v) => {
                    let new = v.slots.iter().filter(|s| s.new).count();
                    slotgate::telemetry::plan_round(&k.name, Some(new));
                    if new > 0 {
                        tracing::info!(kind = %k.name, %day, new, "planned");
                    }
                    for w in &v.warnings {
                        tracing::warn!(kind = %k.name, %day, "schedule edit: {w}");
                    }
                }
                Err(e) => {
                    failed += 1;
                    slotgate::telemetry::plan_round(&k.name, None);
                    tracing::warn!(kind = %k.name, %day, error = %e, "planning failed; will retry next round")
                }
            }
        }
    }
    *at = "forecasting the runway".into();
    runway(p, skip).await;
    failed
}

/// `slotgate_runway_days` for each kind this planner plans: a forecast of
/// [`slotgate::forecast::DEFAULT_DAYS`] read from Postgres; a kind
/// predicted to run dry within [`slotgate::config::Config::runway_days`]
/// gets its `runway.low` notice. A failed read is logged and leaves the
/// gauges as they were; it does not fail the round (planning succeeded).
async fn runway(p: &Planner, skip: &[String]) {
    let horizon = slotgate::forecast::DEFAULT_DAYS;
    let kinds: Vec<_> = p
        .config
        .kinds
        .iter()
        .filter(|k| !skip.contains(&k.name))
        .collect();
    let f = match slotgate::report::forecast(&p.pool, &p.config, &kinds, horizon).await {
        Ok(f) => f,
        Err(e) => {
            tracing::warn!(error = %e, "forecasting the runway failed; will retry next round");
            return;
        }
    };
    for k in &f.kinds {
        let first = k.days.first().map(|d| d.day);
        let dry = k
            .runs_dry_on
            .zip(first)
            .map(|(dry, today)| (dry - today).num_days());
        slotgate::telemetry::runway(&k.kind, dry, horizon);
        if let (Some(days), Some(on)) = (dry, k.runs_dry_on) {
            if days < i64::from(p.config.runway_days()) {
                tell_runway_low(p, &k.kind, on, days).await;
            }
        }
    }
}

/// Records `kind`'s `runway.low` notice for `on`. Told once per kind and
/// predicted dry day (the outbox's unique index), whoever forecasts how
/// often; a failed write is tried again next round.
async fn tell_runway_low(p: &Planner, kind: &str, on: chrono::NaiveDate, days: i64) {
    match slotgate::store::record_runway_low(&p.pool, kind, on).await {
        Ok(true) => {
            tracing::warn!(kind, runs_dry_on = %on, days, "the drafts run out soon; notice recorded (runway.low)")
        }
        Ok(false) => {}
        Err(e) => {
            tracing::warn!(kind, error = %e, "recording the runway notice failed; will retry next round")
        }
    }
}
