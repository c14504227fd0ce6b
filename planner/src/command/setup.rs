//! `planner migrate` and `planner check`: readying an installation, the
//! schema first, then whether the config's CMSes and Postgres can carry it.

use crate::env::{load_config, Env};
use anyhow::{Context, Result};
use std::process::ExitCode;

/// `planner migrate`: applies the database migrations.
pub async fn migrate(env: &Env) -> Result<ExitCode> {
    let pool = env.pool().await?;
    slotgate::MIGRATOR
        .run(&pool)
        .await
        .context("applying migrations")?;
    eprintln!("migrations applied");
    Ok(ExitCode::SUCCESS)
}

/// `planner check`: every kind's CMS, then Postgres; exit 1 naming what is
/// not well.
pub async fn check(env: &Env) -> Result<ExitCode> {
    let config = load_config(&env.config)?;
    let problems = slotgate::receiver::Receivers::for_config(&config, env.clock.clone())
        .check()
        .await;
    for (kind, p) in &problems {
        eprintln!("planner: kind {kind:?}: {p}");
    }
    let postgres = check_postgres(env).await?;
    if !problems.is_empty() || postgres == Some(false) {
        return Ok(ExitCode::from(1));
    }
    println!(
        "{}: {} kinds, every CMS answered",
        env.config.display(),
        config.kinds.len()
    );
    Ok(ExitCode::SUCCESS)
}

/// `planner check`'s look at Postgres, when `DATABASE_URL` is set: a
/// server that takes no writes (a standby) is a problem (`Some(false)`);
/// a primary whose commits do not wait for a synchronous standby is a
/// warning, since its failover can lose committed gate rows (docs/production.md,
/// "Postgres high availability"), but it is how most installations run
/// (`Some(true)`). `None`: no `DATABASE_URL`, nothing checked.
async fn check_postgres(env: &Env) -> Result<Option<bool>> {
    if env.conn.database_url.is_none() {
        eprintln!("planner check: DATABASE_URL is not set; Postgres not checked");
        return Ok(None);
    }
    let pool = env.pool().await?;
    let role = slotgate::store::server_role(&pool)
        .await
        .context("asking Postgres whether it takes writes and waits for a standby")?;
    let durability = role.durability();
    match durability.warning() {
        Some(w) if !durability.writable() => eprintln!("planner check: postgres: {w}"),
        Some(w) => eprintln!("planner check: warning: postgres: {w}"),
        None => eprintln!(
            "planner check: postgres: commits wait for a synchronous standby (synchronous_commit = {})",
            role.synchronous_commit
        ),
    }
    Ok(Some(durability.writable()))
}
