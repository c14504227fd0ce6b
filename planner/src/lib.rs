//! `planner`: slotgate's control plane, as a library so that `main.rs` only
//! parses and dispatches. Parsing and printing live here; every operation is
//! in the `slotgate` library.
//!
//! - [`cli`]: the subcommands and flags.
//! - [`command`]: runs one parsed command to its exit status, a module per
//!   verb family (`command::drafts` is `planner drafts`).
//! - [`env`](mod@env): the clock, stores and config a command reaches for.
//! - [`exit`]: exit statuses and the errors that choose them.
//! - [`history`]: `planner audit --with-history`, the slot history a config is compared with.
//! - [`console`]: `planner serve`, the operator console.
#![warn(missing_docs, unreachable_pub)]

pub mod cli;
pub mod command;
pub mod console;
pub mod env;
pub mod exit;
pub mod history;
