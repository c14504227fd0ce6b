//! `planner retry`, `planner abandon` and `planner skip`: an operator's
//! decision about one slot — one more attempt at a failed one, giving a
//! failed one up, or taking one's gate row ahead of time so it never runs.

use crate::env::Env;
use anyhow::Result;
use slotgate::slot::SlotKey;
use std::process::ExitCode;

/// `planner retry`: one more attempt, same key and draft.
pub async fn retry(env: &Env, slot: &SlotKey) -> Result<ExitCode> {
    let p = env.planner().await?;
    let id = p.retry(slot).await?;
    println!("retrying {slot} (entry {id}, caller manual)");
    Ok(ExitCode::SUCCESS)
}

/// `planner abandon`: gives a failed slot up, its draft back to `ready`
/// only when asked.
pub async fn abandon(env: &Env, slot: &SlotKey, requeue_draft: bool) -> Result<ExitCode> {
    let p = env.planner().await?;
    let draft = p.abandon(slot, requeue_draft).await?;
    let what = match (draft, requeue_draft) {
        (Some(d), true) => format!("draft {d} is ready again"),
        (Some(d), false) => format!("draft {d} stays failed"),
        (None, _) => "no draft was bound".into(),
    };
    println!("abandoned {slot}; {what}");
    Ok(ExitCode::SUCCESS)
}

/// `planner skip`: the slot is recorded `skipped/operator` and never runs.
pub async fn skip(env: &Env, slot: &SlotKey, note: &str) -> Result<ExitCode> {
    let p = env.planner().await?;
    p.skip(slot, note).await?;
    println!("skipped {slot} (skipped/operator, caller manual)");
    Ok(ExitCode::SUCCESS)
}
