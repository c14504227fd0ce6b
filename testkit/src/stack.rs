//! One test's slotgate deployment: a database, a Redis prefix, a config
//! file and the environment that points the real `planner` and `worker`
//! binaries at them. The integration suites of the worker and the planner
//! each needed this; it is here once so that the environment a process
//! gets (and the short lease and visibility its workers run with) is the
//! same in every suite.
//!
//! The defaults are the shared servers of [`TestDb`] and [`TestRedis`];
//! a suite with a server of its own names it with the [`StackBuilder`],
//! which also starts the topologies a deployment can have (a Redis
//! Cluster, a Sentinel set-up, a Postgres pair behind one address) and
//! keeps them with the stack, with their fail-overs: the chaos suite, the
//! bench and the tests all deploy through here.

use crate::process::{self, Proc};
use crate::redis_conn::{FollowedPrimary, Primary, RedisConn};
use crate::server::{
    Failover, OwnedCluster, OwnedSentinel, PgPair, Replication, ServerError, SyncLevel,
};
use crate::{TestDb, TestRedis};
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Mutex;

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
    prefix: Option<String>,
    dir: Option<PathBuf>,
    redis_cluster: Option<(usize, usize)>,
    redis_sentinel: bool,
    postgres_pair: bool,
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

    /// A Redis Cluster of the stack's own: `masters` masters with
    /// `replicas` replicas each ([`OwnedCluster`]), instead of the shared
    /// Redis.
    pub fn redis_cluster(mut self, masters: usize, replicas: usize) -> Self {
        self.redis_cluster = Some((masters, replicas));
        self
    }

    /// A primary, a replica and three Sentinels of the stack's own
    /// ([`OwnedSentinel`]), slotgate given the `redis+sentinel://` URL.
    pub fn redis_sentinel(mut self) -> Self {
        self.redis_sentinel = true;
        self
    }

    /// A Postgres primary with a synchronous standby of the stack's own
    /// ([`PgPair`]), reached through its front address; the stack's fresh
    /// database is made there.
    pub fn postgres_pair(mut self) -> Self {
        self.postgres_pair = true;
        self
    }

    /// The key prefix, instead of a fresh unique one.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = Some(prefix.into());
        self
    }

    /// The directory for logs and the config, instead of a temp one.
    pub fn dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.dir = Some(dir.into());
        self
    }

    /// An environment variable every process of the stack gets.
    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.envs.push((key.to_owned(), value.to_owned()));
        self
    }

    /// Starts the topologies asked for, makes the database (unless
    /// given), the prefix and the directory, and writes `config` as the
    /// stack's `slotgate.toml`. Panics if a step fails (a test's set-up).
    pub async fn build(self, config: &str) -> Stack {
        let pg_pair = match self.postgres_pair {
            true => Some(PgPair::start(Replication::Sync(SyncLevel::On)).await),
            false => None,
        };
        let server = pg_pair
            .as_ref()
            .map(|p| p.url("postgres"))
            .or(self.postgres);
        let (db, database_url) = match (self.database_url, server) {
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
        let pool = match &db {
            Some(db) => db.pool.clone(),
            None => sqlx::PgPool::connect(&database_url)
                .await
                .unwrap_or_else(|e| panic!("the stack's database at {database_url}: {e}")),
        };
        let cluster = match self.redis_cluster {
            Some((m, r)) => Some(blocking(move || OwnedCluster::start(m, r)).await),
            None => None,
        };
        let sentinel = match self.redis_sentinel {
            true => Some(blocking(OwnedSentinel::start).await),
            false => None,
        };
        let followed = match &sentinel {
            Some(s) => {
                let port = s.named_primary().expect("a Sentinel names a primary");
                let primary = Primary::connect(port)
                    .await
                    .expect("connecting to the Sentinels' primary");
                Some(FollowedPrimary(Arc::new(tokio::sync::RwLock::new(primary))))
            }
            None => None,
        };
        let url = match (&cluster, &sentinel, self.redis_url) {
            (Some(c), _, _) => c.url(),
            (_, Some(s), _) => s.url(),
            (_, _, Some(url)) => url,
            _ => std::env::var("REDIS_URL").unwrap_or_else(|_| crate::DEFAULT_REDIS_URL.into()),
        };
        let redis = match self.prefix {
            Some(prefix) => TestRedis { url, prefix },
            None => TestRedis::on(url),
        };
        let dir = self.dir.unwrap_or_else(|| {
            std::env::temp_dir().join(format!("slotgate-{}-{}", self.tag, redis.prefix))
        });
        std::fs::create_dir_all(&dir).expect("stack dir");
        let config_path = dir.join("slotgate.toml");
        std::fs::write(&config_path, config).expect("stack config");
        Stack {
            db,
            database_url,
            pool,
            redis,
            dir,
            config: config_path,
            bins: self.bins,
            envs: self.envs,
            cluster: cluster.map(|c| Arc::new(Mutex::new(c))),
            sentinel: sentinel.map(|s| Arc::new(Mutex::new(s))),
            followed,
            kept: Default::default(),
            pg_pair: pg_pair.map(|p| Arc::new(Mutex::new(p))),
        }
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        if *self.kept.get_mut() {
            std::mem::forget(self.db.take());
            self.redis.prefix.clear();
        }
    }
}

/// `f` on a blocking thread (a server's start waits on processes).
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    match tokio::task::spawn_blocking(f).await {
        Ok(v) => v,
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    }
}

/// Why a fail-over could not be carried out on a stack.
fn no_topology(what: &str) -> ServerError {
    ServerError::Step {
        step: format!("a fail-over of {what}"),
        detail: format!("this stack has no {what} of its own"),
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
    /// A pool on the stack's database, for the test's own queries.
    pub pool: sqlx::PgPool,
    /// The stack's own Redis Cluster ([`StackBuilder::redis_cluster`]),
    /// locked by whoever needs its shape to hold still.
    pub cluster: Option<Arc<Mutex<OwnedCluster>>>,
    /// The stack's own Sentinel set-up ([`StackBuilder::redis_sentinel`]),
    /// locked by a fail-over from the kill until the node is back.
    pub sentinel: Option<Arc<Mutex<OwnedSentinel>>>,
    followed: Option<FollowedPrimary>,
    kept: std::sync::atomic::AtomicBool,
    /// The stack's own Postgres pair ([`StackBuilder::postgres_pair`]).
    /// Last: the database on it goes before it.
    pub pg_pair: Option<Arc<Mutex<PgPair>>>,
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
            prefix: None,
            dir: None,
            redis_cluster: None,
            redis_sentinel: false,
            postgres_pair: false,
        }
    }

    /// Whether dropping the stack keeps its database and its prefix's
    /// keys (a failed or interrupted run's evidence); the servers of its
    /// own go all the same.
    pub fn keep(&self, keep: bool) {
        self.kept.store(keep, std::sync::atomic::Ordering::SeqCst);
    }

    /// The harness's own Redis connection, to wherever the stack's Redis
    /// is (see [`RedisConn`]).
    pub async fn redis_conn(&self) -> redis::RedisResult<RedisConn> {
        if let Some(f) = &self.followed {
            return Ok(RedisConn::Sentinel(f.clone()));
        }
        if self.cluster.is_some() {
            let c = redis::cluster::ClusterClientBuilder::new(self.redis.url.split(','))
                .connection_timeout(Duration::from_secs(3))
                .response_timeout(Duration::from_secs(4))
                .build()?
                .get_async_connection()
                .await?;
            return Ok(RedisConn::Cluster(c));
        }
        Ok(RedisConn::Single(self.redis.conn().await))
    }

    /// How `redis-cli` reaches the stack's Redis: its URL, the Sentinels'
    /// primary, or on a Cluster a live node with `-c` (it follows `MOVED`
    /// to the key's master).
    pub async fn redis_cli_target(&self) -> Vec<String> {
        let port = match (&self.followed, &self.cluster) {
            (Some(p), _) => p.0.read().await.port,
            (None, Some(c)) => c.lock().await.live_ports().first().copied().unwrap_or(0),
            (None, None) => return vec!["-u".into(), self.redis.url.clone()],
        };
        let mut args: Vec<String> = vec!["-h".into(), "127.0.0.1".into(), "-p".into()];
        args.push(port.to_string());
        if self.cluster.is_some() {
            args.insert(0, "-c".into());
        }
        args
    }

    /// Deletes every key of the prefix ("Redis lost everything", for this
    /// stack only); how many. On a Cluster every master is scanned for the
    /// prefix's hash tags (`{P}:…`, `{P:p…}:…`), the Cluster locked so that
    /// no failover moves keys meanwhile, and each key deleted by itself (a
    /// DEL of keys in different hash slots is refused with CROSSSLOT).
    pub async fn wipe_prefix(&self) -> redis::RedisResult<usize> {
        let mut conn = self.redis_conn().await?;
        let Some(cluster) = &self.cluster else {
            let pattern = format!("{}:*", crate::glob_escape(&self.redis.prefix));
            let keys = crate::scan(&mut conn, &pattern).await?;
            if keys.is_empty() {
                return Ok(0);
            }
            return redis::cmd("DEL").arg(&keys).query_async(&mut conn).await;
        };
        let held = cluster.lock().await;
        let pattern = format!("{{{}[:}}]*", crate::glob_escape(&self.redis.prefix));
        let mut n = 0;
        for port in held.master_ports() {
            let mut node = redis::Client::open(format!("redis://127.0.0.1:{port}/"))?
                .get_multiplexed_async_connection()
                .await?;
            for key in crate::scan(&mut node, &pattern).await? {
                n += redis::cmd("DEL")
                    .arg(&key)
                    .query_async::<usize>(&mut conn)
                    .await?;
            }
        }
        Ok(n)
    }

    /// `kill -9` of the Cluster master serving `key`, its replica's
    /// takeover and the node's return ([`OwnedCluster::fail_over`]).
    pub async fn cluster_fail_over(&self, key: String) -> Result<Failover, ServerError> {
        let cluster = self
            .cluster
            .clone()
            .ok_or_else(|| no_topology("Redis Cluster"))?;
        let mut c = cluster.lock_owned().await;
        blocking(move || c.fail_over(&key)).await
    }

    /// `kill -9` of the Sentinels' primary, the replica elected and
    /// written to by slotgate, then the node started again as a replica
    /// ([`OwnedSentinel::kill_and_elect`]). The harness's own commands
    /// ([`Stack::redis_conn`]) wait from the kill until they can go to the
    /// new primary, so their writes are not counted as slotgate's.
    pub async fn sentinel_fail_over(&self) -> Result<Failover, ServerError> {
        let (Some(set_up), Some(followed)) = (self.sentinel.clone(), &self.followed) else {
            return Err(no_topology("Sentinel set-up"));
        };
        let mut s = set_up.lock_owned().await;
        let mut primary = followed.0.write().await;
        let (mut s, election) = blocking(move || {
            let e = s.kill_and_elect();
            (s, e)
        })
        .await;
        if let Ok(new) = &election.elected {
            *primary = Primary::connect(*new)
                .await
                .map_err(|e| ServerError::Step {
                    step: format!("connecting to the new primary {new}"),
                    detail: e.to_string(),
                })?;
        }
        drop(primary);
        let old = election.old;
        let back = blocking(move || s.restart(old)).await;
        Ok(election.failover(&back))
    }

    /// `kill -9` of the Postgres primary, the standby promoted and the
    /// front moved to it ([`PgPair::fail_over`]); what happened.
    pub async fn pg_fail_over(&self) -> Result<String, ServerError> {
        let pair = self
            .pg_pair
            .clone()
            .ok_or_else(|| no_topology("Postgres pair"))?;
        let pair = pair.lock_owned().await;
        Ok(pair.fail_over().await)
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
        self.worker_logged(id, id, args, envs)
    }

    /// [`Stack::shipped_worker`] logging under `log` instead of its id (a
    /// worker restarted under its id keeps the earlier run's log beside
    /// the new one): the one place a stack starts a worker process.
    pub fn worker_logged(&self, log: &str, id: &str, args: &[&str], envs: &[(&str, &str)]) -> Proc {
        let mut all = vec!["--id", id];
        all.extend_from_slice(args);
        Proc::spawn(log, &self.bins.worker, &all, &self.envs(envs), &self.dir)
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
