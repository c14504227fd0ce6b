//! `planner trigger` and `planner backfill`: delivering slots now, one by
//! its key or its CronJob's Job name, or every past one of a range of days.

use crate::cli::TriggerArgs;
use crate::env::Env;
use crate::exit::{wait_exit_code, BadInput};
use anyhow::Result;
use chrono::NaiveDate;
use slotgate::slot::SlotKey;
use slotgate::terminal::printable;
use std::process::ExitCode;
use tokio_util::sync::CancellationToken;

/// `planner trigger`: delivers one slot and, with `--wait`, waits for its
/// outcome, whose kind is the exit status.
pub async fn trigger(env: &Env, args: TriggerArgs) -> Result<ExitCode> {
    let TriggerArgs {
        kind,
        day,
        slot_no,
        from_job_name,
        json,
        wait,
        wait_timeout,
        early,
    } = args;
    let p = env.planner().await?;
    let (key, caller) = match (from_job_name.as_ref(), day, slot_no) {
        (Some(job), _, _) => {
            let k = p.config.kind(&kind).ok_or_else(|| {
                BadInput(format!(
                    "unknown kind {kind:?} (not in {})",
                    env.config.display()
                ))
            })?;
            let s = slotgate::job_name::slot_of(k, job, &p.config.jitter_seed)
                .map_err(|e| BadInput(format!("Job name {:?}: {e}", job.name)))?;
            (s.key, "cronjob")
        }
        (None, Some(day), Some(slot_no)) => (SlotKey::new(kind, day, slot_no), "manual"),
        _ => unreachable!("clap requires --day and --slot without --from-job-name"),
    };
    let entry_id = if early {
        p.trigger_early(&key.kind, key.day, key.slot_no).await?
    } else {
        p.trigger(&key.kind, key.day, key.slot_no, caller).await?
    };
    let mut out = serde_json::json!({
        "slot": key.to_string(),
        "caller": caller,
        "entry_id": entry_id,
        "job_name": from_job_name.as_ref().map(|j| j.name.as_str()),
    });
    if !json {
        println!(
            "delivered {key} (entry {entry_id}, caller {caller}{})",
            if early { ", early" } else { "" }
        );
    }
    if !wait {
        if json {
            println!("{out}");
        }
        return Ok(ExitCode::SUCCESS);
    }
    let cancel = CancellationToken::new();
    slotgate_process::shutdown::on_signals(cancel.clone());
    let watched =
        slotgate::watch::until_settled(&p.pool, &key, &entry_id, wait_timeout, &cancel).await;
    let code = wait_exit_code(&watched);
    if json {
        out["outcome"] = serde_json::to_value(&watched)?;
        println!("{out}");
    } else {
        // Reasons and errors are stored text: shown printable.
        println!("{key}: {}", printable(&watched.to_string()));
    }
    Ok(ExitCode::from(code))
}

/// `planner backfill`: plans `from..=to` for `kind` and delivers each past
/// slot without an outcome; prints what it did as JSON.
pub async fn backfill(env: &Env, kind: &str, from: NaiveDate, to: NaiveDate) -> Result<ExitCode> {
    let p = env.planner().await?;
    let b = p.backfill(kind, from, to).await?;
    println!("{}", serde_json::to_string(&b)?);
    Ok(ExitCode::SUCCESS)
}
