//! `planner plan` and `planner run`: laying out a day's slots once, or
//! round after round until a signal.

use crate::env::Env;
use crate::exit::BadInput;
use anyhow::{Context, Result};
use chrono::NaiveDate;
use slotgate::plan::Fate;
use std::io::Write;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// `planner plan`: plans `day` (each kind's today by default) and prints the
/// slots, as lines or as JSON.
pub async fn plan(
    env: &Env,
    day: Option<NaiveDate>,
    kinds: &[String],
    dry_run: bool,
    json: bool,
) -> Result<ExitCode> {
    let p = env.planner().await?;
    let plan = p.plan_day(day, kinds, dry_run).await.context("planning")?;
    if json {
        println!("{}", serde_json::to_string(&plan)?);
    } else {
        // Buffered: a plan of a million slots is a million lines.
        let mut out = std::io::BufWriter::new(std::io::stdout().lock());
        for s in &plan.slots {
            writeln!(
                out,
                "{:<32} nominal {}  due {}  jitter {:>8} ms  {}",
                s.slot,
                s.nominal_at,
                s.due_at,
                s.jitter_ms,
                if s.new { "new" } else { "existing" }
            )?;
        }
        for u in &plan.unscheduled {
            let fate = match u.fate {
                Fate::Cancelled => "cancelled (skipped/unscheduled)".to_owned(),
                Fate::WouldBeCancelled => "would be cancelled".to_owned(),
                Fate::AlreadyGated { state } => format!("kept: already {}", state.as_str()),
            };
            writeln!(
                out,
                "{:<32} removed time {}  due {}  {fate}",
                u.slot, u.local_time, u.due_at
            )?;
        }
        out.flush()?;
        for w in &plan.warnings {
            eprintln!("planner plan: warning: {w}");
        }
        let new = plan.slots.iter().filter(|s| s.new).count();
        let dry = if dry_run {
            " (dry run: nothing changed)"
        } else {
            ""
        };
        if plan.unscheduled.is_empty() {
            eprintln!("{} slots, {new} new{dry}", plan.slots.len());
        } else {
            eprintln!(
                "{} slots, {new} new, {} of removed times{dry}",
                plan.slots.len(),
                plan.unscheduled.len()
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `planner run`: planning rounds every `every` until a signal, with the
/// health listener on `metrics_addr` when given.
pub async fn run(
    env: &Env,
    every: Duration,
    skip_kinds: &[String],
    round_deadline: Duration,
    metrics_addr: Option<SocketAddr>,
) -> Result<ExitCode> {
    let p = env.planner().await?;
    for k in skip_kinds {
        if p.config.kind(k).is_none() {
            return Err(BadInput(format!(
                "--skip-kind {k:?}: unknown kind (not in {})",
                env.config.display()
            ))
            .into());
        }
    }
    let cancel = CancellationToken::new();
    slotgate_process::shutdown::on_signals(cancel.clone());
    let metrics = CancellationToken::new();
    let live = crate::console::liveness::Liveness::new(every, round_deadline);
    if let Some(addr) = metrics_addr {
        let probe = slotgate_process::health::Probe {
            pool: p.pool.clone(),
            queue: p.queue.clone(),
            clock: p.clock.clone(),
            config: std::sync::Arc::new(p.config.fingerprint().into()),
            alive: Some({
                let live = live.clone();
                std::sync::Arc::new(move || live.unhealthy())
            }),
        };
        slotgate_process::health::serve(addr, probe, metrics.clone())
            .await
            .with_context(|| format!("serving metrics on {addr}"))?;
    }
    crate::console::liveness::run_rounds(&p, skip_kinds, every, round_deadline, &live, &cancel)
        .await;
    metrics.cancel();
    eprintln!("planner run: stopped");
    Ok(ExitCode::SUCCESS)
}
