//! `chaos-worker`: the production worker, plus `--sabotage NAME`. TEST ONLY.
//!
//! The chaos judge's self-test needs workers that break one exactly-once
//! rule on purpose. Those workers are this binary: the `worker` crate's
//! own command line and wiring (`worker::cli`), with a
//! [`chaos_sabotage::Saboteur`] installed as the executor's hooks when
//! `--sabotage` is given. Keeping it here, in the chaos crate, means the
//! `worker` that ships has no such flag and links no sabotage.

use chaos_sabotage::{Sabotage, Saboteur};
use clap::Parser;
use std::process::ExitCode;

// No doc comment: clap would print it as the long help.
#[derive(Parser)]
#[command(
    name = "chaos-worker",
    about = "TEST ONLY: the slotgate worker with one exactly-once rule broken on purpose (the chaos judge's self-test)",
    long_about = None
)]
struct Args {
    /// The rule to break, once per process: double-publish, replay,
    /// phantom, early or skip-gate. Without it this is the plain worker.
    #[arg(long)]
    sabotage: Option<Sabotage>,
    #[command(flatten)]
    worker: worker::cli::Cli,
}

fn main() -> ExitCode {
    slotgate::telemetry::init();
    let args = Args::parse();
    let hooks = args.sabotage.map(Saboteur::arm).unwrap_or_default();
    worker::cli::run_with_hooks(args.worker, hooks)
}
