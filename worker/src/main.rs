//! `worker`: consumes slot deliveries until SIGTERM/SIGINT. This file only
//! parses the flags; [`worker::cli`] wires them up and the runtime is
//! `slotgate::worker`.

use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    slotgate::telemetry::init();
    worker::cli::run(worker::cli::Cli::parse())
}
