//! `planner forecast`: the runway ahead, as a table per kind or JSON. The
//! rules are `slotgate::forecast::simulate`'s, run on Postgres's snapshot
//! by `slotgate::report::forecast`; this checks the flags, numbers the
//! config's slots from Postgres (as the planner plans them) and prints.
//! It never writes a row.

use crate::env::{load_config, numbered, Env};
use crate::exit::BadInput;
use anyhow::{Context, Result};
use std::process::ExitCode;

/// `planner forecast`: `days` local days of `kinds` (default: all). An
/// unknown kind is exit status 2, naming it.
pub async fn forecast(env: &Env, kinds: &[String], days: u32, json: bool) -> Result<ExitCode> {
    let config = load_config(&env.config)?;
    for k in kinds {
        if config.kind(k).is_none() {
            return Err(BadInput(format!(
                "--kind {k:?}: unknown kind (not in {})",
                env.config.display()
            ))
            .into());
        }
    }
    let pool = env.pool().await?;
    let config = numbered(config, &pool).await?;
    let chosen: Vec<_> = config
        .kinds
        .iter()
        .filter(|k| kinds.is_empty() || kinds.contains(&k.name))
        .collect();
    let f = slotgate::report::forecast(&pool, &config, &chosen, days)
        .await
        .context("reading drafts, gate rows, cap units and pauses")?;
    if json {
        println!("{}", serde_json::to_string(&f)?);
    } else {
        print!("{}", f.render());
    }
    Ok(ExitCode::SUCCESS)
}
