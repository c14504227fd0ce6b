//! The planner's integration tests, as one test binary: each file beside
//! this one is a module of it. One binary links the crate and its
//! dependencies once, where a binary per file linked them once per file;
//! nextest still runs every test in a process of its own, so a test sees
//! no other test's state. Filter by module: `-E 'test(/^gate::/)'`.

mod cli;
mod common;
mod console;
mod cronjob;
mod deadlines;
mod forecast;
