//! The process-level pieces both binaries (`worker` and `planner run`)
//! need and the `slotgate` library must not own, since a library neither
//! listens on a socket for its metrics nor ends the process:
//! - [`health`]: the `/metrics`, `/healthz` and `/readyz` listener, which
//!   installs the Prometheus recorder.
//! - [`listener`]: the connection cap and socket deadlines of every HTTP
//!   listener (this one and the planner's console).
//! - [`shutdown`]: what a second signal does (exit at once, 130).
//!
//! A crate of its own so that the planner shares them without linking the
//! worker binary's code.
#![warn(missing_docs, unreachable_pub)]

pub mod health;
pub mod listener;
pub mod shutdown;
