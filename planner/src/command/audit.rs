//! `planner audit`: CronJob manifests, crontabs and slotgate configs
//! reviewed by `slotgate-audit` (DESIGN 4.10), with the slot history from
//! Postgres when asked.

use crate::env::Env;
use anyhow::Result;
use chrono::{DateTime, Utc};
use std::path::PathBuf;
use std::process::ExitCode;

/// `planner audit`: the findings as a table or JSON; exit 0 (nothing high),
/// 1 (something high) or 2 (an input unreadable).
pub async fn audit(
    env: &Env,
    paths: &[PathBuf],
    json: bool,
    now: Option<DateTime<Utc>>,
    zone: Option<chrono_tz::Tz>,
    with_history: bool,
) -> Result<ExitCode> {
    let now = now.unwrap_or_else(|| env.clock.now());
    let history = if with_history {
        Some(crate::history::source(env.pool().await?, now))
    } else {
        None
    };
    let opts = slotgate_audit::AuditOptions {
        now,
        local_zone: zone.unwrap_or_else(slotgate_audit::machine_zone),
        history,
    };
    match slotgate_audit::audit_paths(paths, &opts) {
        Ok(report) => {
            if json {
                println!("{}", report.to_json());
            } else {
                print!("{}", report.render_table());
            }
            Ok(ExitCode::from(report.exit_code() as u8))
        }
        Err(e) => {
            eprintln!("planner audit: {e}");
            Ok(ExitCode::from(2))
        }
    }
}
