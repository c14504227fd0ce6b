//! `planner`: slotgate's control plane. This file only parses the command
//! line; [`planner::command`] runs it.

use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    slotgate::telemetry::init();
    planner::command::run(planner::cli::Cli::parse())
}
