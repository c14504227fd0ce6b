//! `planner report` and `planner status`: read-only views, the day's slots
//! and outcomes from Postgres, and the queue, leader and workers from
//! Redis.

use crate::env::{load_config, Env};
use anyhow::{bail, Context, Result};
use chrono::NaiveDate;
use std::process::ExitCode;

/// `planner report`: the day's slots and outcomes, as a table or JSON.
pub async fn report(
    env: &Env,
    day: Option<NaiveDate>,
    kinds: &[String],
    json: bool,
) -> Result<ExitCode> {
    let config = load_config(&env.config)?;
    for k in kinds {
        if config.kind(k).is_none() {
            bail!("unknown kind {k:?} (not in {})", env.config.display());
        }
    }
    let r = slotgate::report::build(&env.pool().await?, &config, &env.clock, day, kinds).await?;
    if json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        print!("{}", r.render());
    }
    Ok(ExitCode::SUCCESS)
}

/// `planner status`: queue depths, leader and live workers, and — when
/// Postgres is configured and answers — pauses and workers' clocks.
pub async fn status(env: &Env, json: bool) -> Result<ExitCode> {
    // Pauses and workers' clocks live in Postgres: shown when it is
    // configured and answers (status stays a Redis view while it is
    // down).
    let full = async {
        let pool = env.pool().await?;
        let mut s = slotgate::report::full_status(&env.queue()?, &pool, &env.clock)
            .await
            .map_err(anyhow::Error::from)?;
        // Each worker's config against this planner's, numbered as the
        // workers number theirs: a difference means they disagree on slots.
        if env.config.exists() {
            let config = crate::env::numbered(crate::env::load_config(&env.config)?, &pool).await?;
            s.compare_config(config.fingerprint());
        }
        anyhow::Ok(s)
    };
    let s = match env.conn.database_url.is_some() {
        true => match full.await {
            Ok(s) => s,
            Err(e) => {
                eprintln!("planner status: pauses and workers' clocks not shown: {e:#}");
                slotgate::report::status(&env.queue()?, &env.clock)
                    .await
                    .context("reading Redis")?
            }
        },
        false => slotgate::report::status(&env.queue()?, &env.clock)
            .await
            .context("reading Redis")?,
    };
    if json {
        println!("{}", serde_json::to_string(&s)?);
    } else {
        print!("{}", s.render());
    }
    Ok(ExitCode::SUCCESS)
}
