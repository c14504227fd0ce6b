//! `slotgate-bench`: how slotgate performs, next to the ceiling of the
//! machine it runs on, measured in the same run. Not part of the test suite.
//!
//! Every benchmark prints a table for people and one JSON line (prefixed
//! `BENCH `) for tools. Run against release binaries:
//!
//! ```text
//! cargo build --release -p planner -p worker -p bench
//! scripts/with-services target/release/slotgate-bench all
//! ```

use anyhow::Result;
use chrono::Utc;
use clap::Parser;

mod backoff;
mod breakdown;
mod burst;
mod ceiling;
mod cluster;
mod command;
mod crowd;
mod failover;
mod figures;
mod footprint;
mod forecast;
mod herd;
mod import;
mod lag;
mod migration;
mod plan;
mod procstat;
mod reconcile;
mod stack;
mod wordpress;

#[derive(Parser)]
#[command(
    name = "slotgate-bench",
    about = "slotgate benchmarks, each with its baseline measured in the same run"
)]
struct Cli {
    #[command(subcommand)]
    cmd: command::Cmd,
}

#[tokio::main]
async fn main() -> Result<()> {
    let cli = Cli::parse();
    println!(
        "# slotgate benchmarks — {} — {} cores",
        Utc::now().format("%Y-%m-%d %H:%M UTC"),
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0)
    );
    cli.cmd.run().await
}
