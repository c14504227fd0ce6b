//! `planner pause` and `planner resume`: a kind's due slots recorded
//! `skipped/paused` until the pause ends.

use crate::env::Env;
use anyhow::Result;
use chrono::{DateTime, Utc};
use std::process::ExitCode;

/// `planner pause`: until `until`, or until `planner resume`.
pub async fn pause(
    env: &Env,
    kind: &str,
    until: Option<DateTime<Utc>>,
    note: &str,
) -> Result<ExitCode> {
    let p = env.planner().await?;
    p.pause(kind, until, note).await?;
    match until {
        Some(u) => println!("paused {kind} until {}", u.to_rfc3339()),
        None => println!("paused {kind} until `planner resume --kind {kind}`"),
    }
    Ok(ExitCode::SUCCESS)
}

/// `planner resume`: ends a kind's pause, saying whether there was one.
pub async fn resume(env: &Env, kind: &str) -> Result<ExitCode> {
    let p = env.planner().await?;
    if p.resume(kind).await? {
        println!("resumed {kind}");
    } else {
        println!("{kind} was not paused");
    }
    Ok(ExitCode::SUCCESS)
}
