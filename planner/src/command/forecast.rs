//! `planner forecast`: the runway ahead, as a table per kind or JSON. The
//! rules are `slotgate::forecast::simulate`'s; this reads the config (its
//! slots numbered from Postgres, as the planner plans them) and Postgres's
//! snapshot (`store::forecast_read`, Postgres's clock included), and
//! prints. It never writes a row.

use crate::env::{load_config, numbered, Env};
use crate::exit::BadInput;
use anyhow::{Context, Result};
use slotgate::forecast::{simulate, Inputs, KindInputs};
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
    let names: Vec<String> = chosen.iter().map(|k| k.name.clone()).collect();
    let rotating: Vec<String> = chosen
        .iter()
        .filter(|k| k.rotate_by_category)
        .map(|k| k.name.clone())
        .collect();
    let mut read = slotgate::store::forecast_read(&pool, &names, &rotating, days)
        .await
        .context("reading drafts, gate rows, cap units and pauses")?;
    let f = simulate(&Inputs {
        now: read.now,
        days,
        seed: &config.jitter_seed,
        kinds: chosen
            .into_iter()
            .map(|k| KindInputs {
                config: k,
                state: read.kinds.remove(&k.name).unwrap_or_default(),
            })
            .collect(),
    });
    if json {
        println!("{}", serde_json::to_string(&f)?);
    } else {
        print!("{}", f.render());
    }
    Ok(ExitCode::SUCCESS)
}
