//! The worker binary's own code, as a library so that its parts are
//! testable and the planner can share the process-level pieces:
//! - [`cli`]: the flags and the wiring of stores, signals and runtime.
//! - [`health`]: the `/metrics`, `/healthz` and `/readyz` listener (also
//!   behind `planner run --metrics-addr`).
//! - [`shutdown`]: what a second signal does (exit at once, 130).

#![warn(missing_docs, unreachable_pub)]
// The worker's `serve` future nests the Redis Cluster client's futures deep
// enough that clippy's layout query needs more than the default 128.
#![recursion_limit = "256"]

pub mod cli;
pub mod health;
pub mod shutdown;
