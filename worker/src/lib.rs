//! The worker binary's own code, as a library so that its parts are
//! testable:
//! - [`cli`]: the flags and the wiring of stores, signals and runtime.
//!
//! Its health listener and signal exit are `slotgate_process`'s, which
//! `planner run` shares.
#![warn(missing_docs, unreachable_pub)]
// clippy (not rustc) overflows the default layout depth (128) on
// `cli::serve`'s future, which nests the Redis Cluster client's futures and
// the pools' connection checks (the Sentinel one asks a Sentinel inside
// deadpool's recycle).
#![recursion_limit = "256"]

pub mod cli;
