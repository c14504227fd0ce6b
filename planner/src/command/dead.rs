//! `planner dead`: the dead letters — deliveries a worker gave up on —
//! listed, replayed or purged.
//!
//! Every field but the time is as received from Redis: printed
//! [`printable`], never as the escapes a stranger wrote.

use crate::cli::DeadCmd;
use crate::env::Env;
use anyhow::Result;
use slotgate::terminal::printable;
use std::process::ExitCode;

/// `planner dead list|replay|purge`.
pub async fn run(cmd: DeadCmd, env: &Env) -> Result<ExitCode> {
    let p = env.planner().await?;
    match cmd {
        DeadCmd::List { limit, json } => {
            let v = p.dead_letters(limit).await?;
            if json {
                println!("{}", serde_json::to_string(&v)?);
            } else {
                println!(
                    "{:<16} {:<16} {:<24} {:<10} {:<16} SLOT",
                    "ID", "ENTRY", "AT (UTC)", "CALLER", "REASON"
                );
                for e in v {
                    let field =
                        |f: &Option<String>| printable(f.as_deref().unwrap_or("-")).into_owned();
                    println!(
                        "{:<16} {:<16} {:<24} {:<10} {:<16} {}",
                        printable(&e.id),
                        field(&e.entry_id),
                        e.at.map(|a| a.format("%Y-%m-%d %H:%M:%S").to_string())
                            .unwrap_or_else(|| "-".to_owned()),
                        field(&e.caller),
                        field(&e.reason),
                        field(&e.slot)
                    );
                }
            }
        }
        DeadCmd::Replay { entry_id } => {
            let (dead, entry) = p.replay_dead(&entry_id).await?;
            println!(
                "replayed dead letter {} as entry {entry} (slot {}, caller manual)",
                printable(&dead.id),
                printable(dead.slot.as_deref().unwrap_or_default())
            );
        }
        DeadCmd::Purge { older_than, json } => {
            let n = p.purge_dead(older_than).await?;
            if json {
                println!("{}", serde_json::json!({ "purged": n }));
            } else {
                println!("purged {n} dead letters");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
