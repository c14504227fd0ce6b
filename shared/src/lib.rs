//! slotgate: exactly-once *effects* for scheduled slots on at-least-once
//! delivery.
//!
//! The planned slot `(kind, day, slot_no)` is the idempotency key; a Postgres
//! unique row on it (`publish_slot`) is the final guard. Redis carries the
//! deliveries and may lose them at any time; Postgres remembers what was
//! planned and what happened.
//!
//! Module map (one responsibility each):
//! - [`config`]: the `slotgate.toml` file, validated up front.
//! - [`cron`]: cron expressions, one parser for `planner audit` and a
//!   kind's `cron` calendar.
//! - [`clock`]: the injected clock, so deadlines and DST are testable.
//! - [`slot`]: slot keys and the daily schedule (time zones, DST, jitter).
//! - [`plan`]: planning days, triggering and backfilling slots.
//! - [`forecast`]: `planner forecast`, the runway: the real pick simulated
//!   over the days ahead, without I/O.
//! - [`import`]: `planner drafts import`, validated in memory, then one `COPY`.
//! - [`job_name`]: Kubernetes CronJob Job names as slot addresses.
//! - [`watch`]: following a triggered delivery until its slot has an outcome.
//! - [`queue`]: the Redis key space, delayed set, ready stream, dead letters.
//! - [`lease`]: the leader lease with fencing epochs.
//! - [`store`]: every Postgres statement, one function each.
//! - [`migrations`]: the embedded schema migrations and their checksum history.
//! - [`session`]: Postgres session timeouts and keepalives, the transaction deadline.
//! - [`executor`]: gate → quota → pick → publish → record for one delivery.
//! - [`outcome`]: the recorded outcomes, a gate row's state, and the one
//!   place stored reasons are read back.
//! - [`receiver`]: where a slot's effect lands, behind one trait: webhook
//!   (with `probe_url`), WordPress, record-only; IndexNow for the index push.
//! - [`retry`]: capped exponential backoff with full jitter.
//! - [`worker`]: the worker runtime: intake, reclaim, leader chores, shutdown.
//! - [`reconcile`]: the leader's repair pass of Redis against Postgres, the truth.
//! - [`report`]: the per-day report and queue status.
//! - [`notice`]: what an operator is told (failed, missed, dead-lettered,
//!   running dry), as signed Standard Webhooks events from an outbox.
//! - [`operator`]: operator verbs: pause, resume, skip, dead-letter replay and purge.
//! - [`retention`]: `planner prune`, old history deleted with the guard kept.
//! - [`telemetry`]: logging setup and metric recording (serving them is the
//!   binaries' job).
//! - [`secret`]: values that never reach a log, an error, a row or a metric.
//! - [`untrusted`]: bounds on copies of untrusted strings.
//! - [`terminal`]: untrusted strings made safe to print on a terminal.

// Guard rails for the one library crate (issue 12). Its public items are the
// contract both binaries and the test suites build on, so each says what it
// means to a caller, and nothing is `pub` that no other crate can reach (a
// stray `pub` reads as API and hides dead code). Set here rather than in
// `[workspace.lints]`: the binaries and test crates would need hundreds of
// edits for no reader's benefit. `deny` so that `cargo build` fails too, not
// only clippy's `-D warnings`. The rustdoc lints make `cargo doc` fail on a
// link that leads nowhere in the rendered docs (a private item among them).
#![deny(missing_docs, unreachable_pub)]
#![deny(rustdoc::broken_intra_doc_links, rustdoc::private_intra_doc_links)]

pub mod clock;
pub mod config;
pub mod cron;
pub mod executor;
pub mod forecast;
pub mod import;
pub mod job_name;
pub mod lease;
#[path = "../../migrations/checksums.rs"]
pub mod migrations;
pub mod notice;
pub mod operator;
pub mod outcome;
pub mod plan;
pub mod queue;
pub mod receiver;
pub mod reconcile;
pub mod report;
pub mod retention;
pub mod retry;
pub mod secret;
pub mod session;
pub mod slot;
pub mod store;
pub mod telemetry;
pub mod terminal;
pub mod untrusted;
pub mod watch;
pub mod worker;

/// Migrations embedded at build time; `planner migrate` and the tests apply
/// them (see [`migrations`] for the checksums they keep).
pub static MIGRATOR: std::sync::LazyLock<sqlx::migrate::Migrator> =
    std::sync::LazyLock::new(migrations::migrator);
