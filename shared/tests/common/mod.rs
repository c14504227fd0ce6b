//! Shared set-up of the library's integration tests: a database and a Redis
//! prefix per test (from `testkit`), the config under test, and in-process
//! workers.
#![allow(dead_code)]

use slotgate::clock::{SharedClock, SystemClock};
use slotgate::config::Config;
use slotgate::plan::Planner;
use slotgate::queue::{KeySpace, Queue};
use slotgate::retry::RetryPolicy;
use slotgate::worker::{Stopped, Worker, WorkerOptions};
use std::sync::Arc;
use std::time::Duration;
use testkit::{TestDb, TestRedis};
use tokio_util::sync::CancellationToken;

pub struct Env {
    pub db: TestDb,
    pub redis: TestRedis,
    pub config: Arc<Config>,
    pub queue: Queue,
    pub clock: SharedClock,
}

/// Today in UTC ([`testkit::zone::process_start`]'s day): tests use UTC
/// kinds and a long starting deadline, so slots "of today" are due and
/// never late.
pub fn today() -> chrono::NaiveDate {
    testkit::zone::process_start().date_naive()
}

/// Yesterday in UTC: its slots are due at any hour, by the servers' clocks
/// too (today's 00:00:0x are not in the day's first seconds).
pub fn yesterday() -> chrono::NaiveDate {
    today().pred_opt().expect("a day before today")
}

impl Env {
    pub async fn new(config_toml: &str) -> Env {
        let db = TestDb::new().await;
        let redis = TestRedis::new();
        let config = Arc::new(
            Config::parse(std::path::Path::new("test.toml"), config_toml).expect("test config"),
        );
        let queue = new_queue(&redis);
        Env {
            db,
            redis,
            config,
            queue,
            clock: Arc::new(SystemClock),
        }
    }

    /// Loads `config_toml` as the config under test with its slots
    /// numbered from this test's database, as the binaries do at start (a
    /// schedule edit is a second call).
    pub async fn load_numbered(&mut self, config_toml: &str) {
        let mut c =
            Config::parse(std::path::Path::new("test.toml"), config_toml).expect("test config");
        slotgate::store::number_kinds(&self.db.pool, &mut c.kinds)
            .await
            .expect("numbering the slots");
        self.config = Arc::new(c);
    }

    /// A planner with its own connections, like a separate process.
    pub fn planner(&self) -> Planner {
        Planner {
            config: self.config.clone(),
            pool: slotgate::store::connect_lazy(&self.db.url, 4, &Default::default()).unwrap(),
            queue: new_queue(&self.redis),
            clock: self.clock.clone(),
        }
    }

    pub fn worker(&self, id: &str, tune: impl FnOnce(&mut WorkerOptions)) -> Worker {
        let mut opts = WorkerOptions::new(id);
        opts.concurrency = 4;
        opts.lease_ttl = Duration::from_secs(3);
        opts.visibility = Duration::from_secs(5);
        opts.shutdown_grace = Duration::from_secs(10);
        opts.reconcile_every = Duration::from_secs(1);
        opts.retry_override = Some(RetryPolicy {
            max_attempts: 4,
            base: Duration::from_millis(10),
            cap: Duration::from_millis(50),
        });
        tune(&mut opts);
        Worker {
            opts,
            config: self.config.clone(),
            pool: slotgate::store::connect_lazy(&self.db.url, 10, &Default::default()).unwrap(),
            queue: new_queue(&self.redis),
            clock: self.clock.clone(),
            entropy: Arc::new(slotgate::retry::SeededEntropy::new(1)),
        }
    }

    /// An executor named `id`, to drive deliveries by hand.
    pub fn executor(&self, id: &str) -> slotgate::executor::Executor {
        slotgate::executor::Executor {
            config: self.config.clone(),
            pool: self.db.pool.clone(),
            queue: self.queue.clone(),
            receivers: slotgate::receiver::Receivers::for_config(&self.config, self.clock.clone()),
            clock: self.clock.clone(),
            entropy: Arc::new(slotgate::retry::SeededEntropy::new(1)),
            worker_id: id.into(),
            visibility: Duration::from_secs(5),
            epoch_seen: Default::default(),
            retry_override: None,
            tx_deadline: Duration::from_secs(15),
            in_flight: Default::default(),
            gate_turn: Default::default(),
            hooks: Default::default(),
        }
    }

    /// Reads every delivery waiting in the stream, as consumer `id`.
    pub async fn read_all(&self, id: &str) -> Vec<slotgate::queue::Delivery> {
        self.queue.ensure_group().await.unwrap();
        self.queue
            .read(id, 10_000, Duration::from_millis(100))
            .await
            .unwrap()
    }

    /// Starts `n` in-process workers.
    pub fn start_workers(&self, n: usize, tune: impl Fn(&mut WorkerOptions)) -> Workers {
        let cancel = CancellationToken::new();
        let handles = (0..n)
            .map(|i| {
                let w = self.worker(&format!("w{i}"), &tune);
                tokio::spawn(w.run(cancel.clone()))
            })
            .collect();
        Workers { cancel, handles }
    }

    pub async fn add_drafts(&self, kind: &str, n: usize) -> Vec<i64> {
        let mut ids = Vec::new();
        let now = chrono::Utc::now();
        let mut conn = self.db.pool.acquire().await.unwrap();
        for i in 0..n {
            // Distinct ready_at so "oldest" is well defined.
            let ready = now - chrono::Duration::seconds((n - i) as i64);
            ids.push(
                slotgate::store::insert_draft(
                    &mut conn,
                    &slotgate::store::NewDraft {
                        kind,
                        title: &format!("{kind} draft {i}"),
                        body: "body",
                        ready_at: ready,
                        priority: 0,
                        category: None,
                    },
                    now,
                )
                .await
                .unwrap(),
            );
        }
        ids
    }

    /// XADDs a raw delivery, as `redis-cli` would.
    pub async fn xadd(&self, fields: &[(&str, &str)]) -> String {
        let mut c = self.redis.conn().await;
        let mut cmd = redis::cmd("XADD");
        cmd.arg(
            slotgate::queue::KeySpace::new(self.redis.prefix.as_str())
                .part(0)
                .ready(),
        )
        .arg("*");
        for (k, v) in fields {
            cmd.arg(*k).arg(*v);
        }
        cmd.query_async(&mut c).await.unwrap()
    }

    pub async fn executions(&self) -> i64 {
        testkit::count(&self.db.pool, "SELECT count(*) FROM execution").await
    }

    /// Waits until at least `n` execution rows exist.
    pub async fn wait_executions(&self, n: i64, timeout: Duration) {
        testkit::wait_for(&format!("{n} executions"), timeout, || async {
            (self.executions().await >= n).then_some(())
        })
        .await
    }

    /// Outcome counts: (outcome, reason) → n.
    pub async fn outcomes(&self) -> std::collections::BTreeMap<String, i64> {
        let rows: Vec<(String, Option<String>, i64)> =
            sqlx::query_as("SELECT outcome, reason, count(*) FROM execution GROUP BY 1, 2")
                .fetch_all(&self.db.pool)
                .await
                .unwrap();
        rows.into_iter()
            .map(|(o, r, n)| (r.map(|r| format!("{o}/{r}")).unwrap_or(o), n))
            .collect()
    }
}

pub fn new_queue(redis: &TestRedis) -> Queue {
    Queue::new(
        slotgate::queue::pool(&redis.url, 8).unwrap(),
        KeySpace::new(redis.prefix.clone()),
    )
}

pub struct Workers {
    pub cancel: CancellationToken,
    pub handles: Vec<tokio::task::JoinHandle<Stopped>>,
}

impl Workers {
    pub async fn stop(self) -> Vec<Stopped> {
        self.cancel.cancel();
        let mut out = Vec::new();
        for h in self.handles {
            out.push(h.await.expect("worker task"));
        }
        out
    }
}

/// How long a test waits for outcomes before it fails.
pub const T: Duration = Duration::from_secs(30);

/// The config line that sends a kind's publishes to the stand-in CMS.
pub fn publish_to(cms: &testkit::cms::Cms) -> String {
    format!("publish_url = \"{}\"", cms.url("/publish"))
}

/// A UTC kind with `slots` slot times, never late, record-only unless urls given.
pub fn kind_toml(name: &str, slots: &[&str], cap: u32, extra: &str) -> String {
    let slots: Vec<String> = slots.iter().map(|s| format!("\"{s}\"")).collect();
    format!(
        "[[kinds]]\nname = \"{name}\"\ntimezone = \"UTC\"\nslots = [{}]\njitter = \"0\"\ndaily_cap = {cap}\nstarting_deadline = \"48h\"\n{extra}\n",
        slots.join(", ")
    )
}
