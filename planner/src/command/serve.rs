//! `planner serve`: starts the operator console (`crate::console`) on its
//! address until a signal; actions only with a long enough token.

use crate::env::Env;
use anyhow::{Context, Result};
use std::net::SocketAddr;
use std::process::ExitCode;
use tokio_util::sync::CancellationToken;

/// `planner serve`: `--allow-actions` without `SLOTGATE_CONSOLE_TOKEN` of
/// [`crate::console::MIN_TOKEN_CHARS`] is exit 2.
pub async fn serve(
    env: &Env,
    http: SocketAddr,
    allow_actions: bool,
    exposure: crate::console::Exposure,
) -> Result<ExitCode> {
    let token = if allow_actions {
        let t = std::env::var("SLOTGATE_CONSOLE_TOKEN").unwrap_or_default();
        if t.chars().count() < crate::console::MIN_TOKEN_CHARS {
            eprintln!(
                "planner serve: --allow-actions needs SLOTGATE_CONSOLE_TOKEN set to at least {} characters",
                crate::console::MIN_TOKEN_CHARS
            );
            return Ok(ExitCode::from(2));
        }
        Some(t)
    } else {
        None
    };
    let p = env.planner().await?;
    let listener = tokio::net::TcpListener::bind(http)
        .await
        .with_context(|| format!("listening on {http}"))?;
    let cancel = CancellationToken::new();
    slotgate_process::shutdown::on_signals(cancel.clone());
    eprintln!(
        "planner serve: console on http://{} (actions {})",
        listener.local_addr()?,
        if token.is_some() { "on" } else { "off" }
    );
    crate::console::serve(
        crate::console::Console::new(p, token),
        listener,
        exposure,
        cancel,
    )
    .await
    .context("serving the console")?;
    eprintln!("planner serve: stopped");
    Ok(ExitCode::SUCCESS)
}
