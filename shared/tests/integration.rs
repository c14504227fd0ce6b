//! The slotgate library's integration tests, as one test binary: each file beside
//! this one is a module of it. One binary links the crate and its
//! dependencies once, where a binary per file linked them once per file;
//! nextest still runs every test in a process of its own, so a test sees
//! no other test's state. Filter by module: `-E 'test(/^gate::/)'`.

mod bad_input;
mod batch;
mod common;
mod compose;
mod config_bounds;
mod config_fingerprint;
mod doc_links;
mod gate;
mod hostile_queue;
mod import;
mod layers;
mod lease;
mod migrations;
mod not_due;
mod operator;
mod planning;
mod promotion_clock;
mod receivers;
mod reconcile_window;
mod retention;
mod schedule_edit;
mod session;
mod store;
mod verbs;
mod webhook;
mod wordpress;
