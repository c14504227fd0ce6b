//! The worker binary's own code, as a library so that its parts are
//! testable and the planner can share the process-level pieces:
//! - [`cli`]: the flags and the wiring of stores, signals and runtime.
//! - [`health`]: the `/metrics`, `/healthz` and `/readyz` listener (also
//!   behind `planner run --metrics-addr`).
//! - [`shutdown`]: what a second signal does (exit at once, 130).
#![warn(missing_docs, unreachable_pub)]
// clippy (not rustc) overflows the default layout depth (128) on
// `cli::serve`'s future, which nests the Redis Cluster client's futures and
// the pools' connection checks (the Sentinel one asks a Sentinel inside
// deadpool's recycle).
#![recursion_limit = "256"]

pub mod cli;
pub mod health;
pub mod shutdown;
