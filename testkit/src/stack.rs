//! One test's slotgate deployment: a database, a Redis prefix, a config
//! file and the environment that points the real `planner` and `worker`
//! binaries at them. The integration suites of the worker and the planner
//! each needed this; it is here once so that the environment a process
//! gets (and the short lease and visibility its workers run with) is the
//! same in every suite.
//!
//! The defaults are the shared servers of [`TestDb`] and [`TestRedis`];
//! a suite with a server of its own (a Sentinel deployment, a Cluster, a
//! Postgres pair behind a proxy) names it with the [`StackBuilder`].

use crate::process::{self, Proc};
use crate::{TestDb, TestRedis};
use std::path::{Path, PathBuf};
use std::process::Output;

/// The workspace's binaries, as Cargo builds them for a test.
#[derive(Debug, Clone)]
pub struct Bins {
    /// The `worker` binary.
    pub worker: PathBuf,
    /// The `planner` binary.
    pub planner: PathBuf,
}

impl Bins {
    /// Both binaries, found beside `one` of them
    /// (`env!("CARGO_BIN_EXE_worker")` in the worker's tests).
    pub fn beside(one: impl AsRef<Path>) -> Bins {
        let one = one.as_ref();
        Bins {
            worker: process::sibling(one, "worker"),
            planner: process::sibling(one, "planner"),
        }
    }
}

/// Builds a [`Stack`]; see [`Stack::builder`].
#[must_use]
pub struct StackBuilder {
    bins: Bins,
    tag: String,
    database_url: Option<String>,
    postgres: Option<String>,
    redis_url: Option<String>,
    envs: Vec<(String, String)>,
}

impl StackBuilder {
    /// Names the stack's temp directory (`slotgate-<tag>-<prefix>`), so a
    /// failing suite's logs are found by its name.
    pub fn tag(mut self, tag: &str) -> Self {
        self.tag = tag.to_owned();
        self
    }

    /// A database already made and migrated (on a server of the test's
    /// own), instead of a fresh [`TestDb`] on the shared server.
    pub fn database_url(mut self, url: impl Into<String>) -> Self {
        self.database_url = Some(url.into());
        self
    }

    /// A fresh database of the stack's own on the Postgres at `url` (any
    /// database's URL on a server the caller started), instead of on the
    /// shared server; dropped with the stack as a [`TestDb`] is.
    pub fn postgres(mut self, url: impl Into<String>) -> Self {
        self.postgres = Some(url.into());
        self
    }

    /// A Redis of the test's own (any URL form slotgate takes), instead of
    /// the shared one.
    pub fn redis_url(mut self, url: impl Into<String>) -> Self {
        self.redis_url = Some(url.into());
        self
    }

    /// An environment variable every process of the stack gets.
    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.envs.push((key.to_owned(), value.to_owned()));
        self
    }

    /// Makes the database (unless given), the prefix and the directory,
    /// and writes `config` as the stack's `slotgate.toml`.
    pub async fn build(self, config: &str) -> Stack {
        let (db, database_url) = match (self.database_url, self.postgres) {
            (Some(url), _) => (None, url),
            (None, server) => {
                let db = match server {
                    Some(url) => TestDb::on(url).await,
                    None => TestDb::new().await,
                };
                let url = db.url.clone();
                (Some(db), url)
            }
        };
        let redis = match self.redis_url {
            Some(url) => TestRedis::on(url),
            None => TestRedis::new(),
        };
        let dir = std::env::temp_dir().join(format!("slotgate-{}-{}", self.tag, redis.prefix));
        std::fs::create_dir_all(&dir).expect("stack dir");
        let config_path = dir.join("slotgate.toml");
        std::fs::write(&config_path, config).expect("stack config");
        Stack {
            db,
            database_url,
            redis,
            dir,
            config: config_path,
            bins: self.bins,
            envs: self.envs,
        }
    }
}

/// A database, a Redis prefix and a config file, and the binaries to run
/// on them. Dropping it drops the database (when it made it) and the
/// prefix's keys.
pub struct Stack {
    db: Option<TestDb>,
    /// Where the processes reach Postgres.
    pub database_url: String,
    /// The Redis URL and the key prefix the processes get.
    pub redis: TestRedis,
    /// Logs and the config file.
    pub dir: PathBuf,
    /// The deployment's `slotgate.toml`.
    pub config: PathBuf,
    /// The binaries it runs.
    pub bins: Bins,
    envs: Vec<(String, String)>,
}

impl Stack {
    /// A stack on the shared servers by default; see [`StackBuilder`].
    pub fn builder(bins: Bins) -> StackBuilder {
        StackBuilder {
            bins,
            tag: "stack".into(),
            database_url: None,
            postgres: None,
            redis_url: None,
            envs: Vec::new(),
        }
    }

    /// The stack's own database; panics for a stack built on a database
    /// of the test's own ([`StackBuilder::database_url`]), which the test
    /// holds itself.
    pub fn db(&self) -> &TestDb {
        self.db
            .as_ref()
            .expect("this stack runs on a database of the test's own")
    }

    /// The environment of the stack's processes, `extra` last (a key in
    /// `extra` overrides the stack's).
    pub fn envs<'a>(&'a self, extra: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
        let mut v = vec![
            ("DATABASE_URL", self.database_url.as_str()),
            ("REDIS_URL", self.redis.url.as_str()),
            ("SLOTGATE_PREFIX", self.redis.prefix.as_str()),
            ("SLOTGATE_CONFIG", self.config.to_str().expect("utf-8 path")),
        ];
        v.extend(self.envs.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        v.extend_from_slice(extra);
        v
    }

    /// A `worker` process with a short lease (3 s), visibility (3 s) and
    /// reconcile period (1 s), so that faults resolve within a test's
    /// patience; `args` and `envs` add to it.
    pub fn worker(&self, id: &str, args: &[&str], envs: &[(&str, &str)]) -> Proc {
        let mut all = vec![
            "--lease-ttl",
            "3s",
            "--visibility",
            "3s",
            "--reconcile-every",
            "1s",
        ];
        all.extend_from_slice(args);
        self.shipped_worker(id, &all, envs)
    }

    /// A `worker` process with the binary's own defaults, as an operator
    /// runs it (only `--id` is set; `args` and `envs` add to it): what the
    /// benchmarks measure, where [`Stack::worker`]'s short periods would
    /// change the figures.
    pub fn shipped_worker(&self, id: &str, args: &[&str], envs: &[(&str, &str)]) -> Proc {
        let mut all = vec!["--id", id];
        all.extend_from_slice(args);
        Proc::spawn(id, &self.bins.worker, &all, &self.envs(envs), &self.dir)
    }

    /// A long-running `planner args` process (`planner run`).
    pub fn planner_proc(&self, name: &str, args: &[&str], envs: &[(&str, &str)]) -> Proc {
        Proc::spawn(name, &self.bins.planner, args, &self.envs(envs), &self.dir)
    }

    /// `planner args` to completion: its stdout; panics unless it exits 0.
    pub fn planner(&self, args: &[&str]) -> String {
        process::run_ok(&self.bins.planner, args, &self.envs(&[]))
    }

    /// `planner args` to completion without blocking the runtime, whatever
    /// its status. `SLOTGATE_JOB_NAME` is removed from what the test
    /// inherits: a planner started by a test is no Kubernetes Job's.
    pub async fn planner_output(&self, args: &[&str], envs: &[(&str, &str)]) -> Output {
        tokio::process::Command::new(&self.bins.planner)
            .args(args)
            .env_remove("SLOTGATE_JOB_NAME")
            .envs(self.envs(envs))
            .stdin(std::process::Stdio::null())
            .output()
            .await
            .expect("run planner")
    }
}
