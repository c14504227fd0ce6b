//! What more than one of the planner's test modules needs: a worker run
//! in the test's own process on a testkit [`Stack`], so a test can run a
//! day's slots end to end and stop the worker when it is done.

use slotgate::clock::SystemClock;
use slotgate::config::Config;
use slotgate::queue::{KeySpace, Queue};
use slotgate::worker::{Worker, WorkerOptions};
use std::sync::Arc;
use std::time::Duration;
use testkit::stack::Stack;
use tokio_util::sync::CancellationToken;

/// An in-process worker on `stack` (short lease, visibility and reconcile
/// period, a seeded RNG), stopped when `cancel` fires.
pub fn start_worker(stack: &Stack, cancel: &CancellationToken) -> tokio::task::JoinHandle<()> {
    let config = Arc::new(Config::load(&stack.config).expect("test config"));
    let mut opts = WorkerOptions::new("w1");
    opts.lease_ttl = Duration::from_secs(3);
    opts.visibility = Duration::from_secs(5);
    opts.reconcile_every = Duration::from_secs(1);
    opts.shutdown_grace = Duration::from_secs(5);
    let w = Worker {
        opts,
        config,
        pool: slotgate::store::connect_lazy(&stack.db().url, 4, &Default::default()).unwrap(),
        queue: Queue::new(
            slotgate::queue::pool(&stack.redis.url, 4).unwrap(),
            KeySpace::new(stack.redis.prefix.clone()),
        ),
        clock: Arc::new(SystemClock),
        entropy: Arc::new(slotgate::retry::SeededEntropy::new(1)),
    };
    let cancel = cancel.clone();
    tokio::spawn(async move {
        w.run(cancel).await;
    })
}
