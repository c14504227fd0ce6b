//! `planner dead`: the dead letters — deliveries a worker gave up on —
//! listed, replayed or purged.
//!
//! Every field but the times is as received from Redis: printed
//! [`printable`], never as the escapes a stranger wrote. The due time,
//! deadline and "planned" come from the config and Postgres: a replay
//! past the deadline or of an unplanned slot needs `--force`.

use crate::cli::DeadCmd;
use crate::env::Env;
use anyhow::Result;
use slotgate::operator::DeadEntry;
use slotgate::terminal::printable;
use std::process::ExitCode;

/// `planner dead list|replay|purge`. Each verb's future is boxed: with
/// the Postgres look-ups of the dead letters' slots, the nested futures
/// passed the compiler's layout depth limit in a clean build.
pub async fn run(cmd: DeadCmd, env: &Env) -> Result<ExitCode> {
    let p = env.planner().await?;
    match cmd {
        DeadCmd::List { limit, json } => {
            let v = Box::pin(p.dead_letters(limit)).await?;
            if json {
                println!("{}", serde_json::to_string(&v)?);
            } else {
                print_table(v);
            }
        }
        DeadCmd::Replay { entry_id, force } => {
            let (dead, entry) = Box::pin(p.replay_dead(&entry_id, force)).await?;
            println!(
                "replayed dead letter {} as entry {entry} (slot {}, caller manual{})",
                printable(&dead.id),
                printable(dead.slot.as_deref().unwrap_or_default()),
                if force { ", forced" } else { "" }
            );
        }
        DeadCmd::Purge { older_than, json } => {
            let n = Box::pin(p.purge_dead(older_than)).await?;
            if json {
                println!("{}", serde_json::json!({ "purged": n }));
            } else {
                println!("purged {n} dead letters");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `dead list` as a table: the dead letter's fields as received, then its
/// slot's due time and deadline (marked `(past)` once passed) and whether
/// Postgres has its plan (`-` for a slot field that is not a configured
/// slot).
fn print_table(v: Vec<DeadEntry>) {
    println!(
        "{:<16} {:<16} {:<20} {:<10} {:<16} {:<20} {:<27} {:<7} SLOT",
        "ID", "ENTRY", "AT (UTC)", "CALLER", "REASON", "DUE (UTC)", "DEADLINE (UTC)", "PLANNED"
    );
    let time = |t: Option<chrono::DateTime<chrono::Utc>>| {
        t.map(|a| a.format("%Y-%m-%d %H:%M:%S").to_string())
            .unwrap_or_else(|| "-".to_owned())
    };
    for e in v {
        let field = |f: &Option<String>| printable(f.as_deref().unwrap_or("-")).into_owned();
        let configured = e.deadline.is_some();
        let deadline = if e.past_deadline {
            format!("{} (past)", time(e.deadline))
        } else {
            time(e.deadline)
        };
        let planned = match (configured, e.planned) {
            (false, _) => "-",
            (true, true) => "yes",
            (true, false) => "no",
        };
        println!(
            "{:<16} {:<16} {:<20} {:<10} {:<16} {:<20} {:<27} {:<7} {}",
            printable(&e.id),
            field(&e.entry_id),
            time(e.at),
            field(&e.caller),
            field(&e.reason),
            time(e.due_at),
            deadline,
            planned,
            field(&e.slot)
        );
    }
}
