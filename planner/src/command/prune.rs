//! `planner prune`: old history deleted in small batches, every pruned day
//! sealed so it can never run again (DESIGN 4.13).

use crate::env::{load_config, numbered, Env};
use anyhow::{Context, Result};
use std::process::ExitCode;
use std::time::Duration;

/// `planner prune`: deletes (or with `dry_run` counts) the history older
/// than `older_than`; an age out of range is exit 2.
pub async fn prune(env: &Env, older_than: Duration, dry_run: bool, json: bool) -> Result<ExitCode> {
    let config = load_config(&env.config)?;
    let pool = env.pool().await?;
    let config = numbered(config, &pool).await?;
    let pruned = match slotgate::retention::prune(
        &pool,
        &config,
        env.clock.now(),
        older_than,
        dry_run,
    )
    .await
    {
        Err(e @ slotgate::retention::RetentionError::OutOfRange { .. }) => {
            eprintln!("planner prune: {e}");
            return Ok(ExitCode::from(2));
        }
        r => r.context("pruning")?,
    };
    if json {
        println!("{}", serde_json::to_string(&pruned)?);
    } else {
        println!(
            "{}executions started before {}: {}; stored answers: {}; planned rows: {}; slots sealed: {}; operators' requests: {}; notices: {}",
            if dry_run { "dry run (nothing changed): " } else { "pruned " },
            pruned.executions_before,
            pruned.executions,
            pruned.responses,
            pruned.planned,
            pruned.sealed,
            pruned.requests,
            pruned.notices
        );
    }
    Ok(ExitCode::SUCCESS)
}
