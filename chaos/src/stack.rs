//! The system under test: a database and a Redis prefix of the run's own,
//! the stand-in CMS, the config and drafts, and the planner and worker
//! processes.

use crate::scenario::{
    Scenario, HTTP_ATTEMPTS, HTTP_TIMEOUT_MS, LEASE_TTL, PROBE_HTTP_ATTEMPTS, RECONCILE_EVERY,
    VISIBILITY,
};
use crate::topology::{
    FollowedPrimary, PgChoice, Primary, RedisChoice, RedisConn, CLUSTER_PARTITIONS, CLUSTER_SHAPE,
};
use anyhow::{bail, Context, Result};
use chrono::{DateTime, Duration as CDuration, SubsecRound, Utc};
use slotgate::queue::KeySpace;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use testkit::cms::Cms;
use testkit::process::Proc;
use testkit::server::{OwnedCluster, OwnedSentinel, PgPair, Replication, SyncLevel};
use testkit::with_database;

/// The database name of a URL.
fn database_of(url: &str) -> Option<String> {
    let base = url.split('?').next().unwrap_or(url);
    let after_scheme = base.find("://").map(|i| i + 3).unwrap_or(0);
    let rest = &base[after_scheme..];
    let db = &rest[rest.find('/')? + 1..];
    (!db.is_empty()).then(|| db.to_owned())
}

/// Connection settings and paths, from the command line.
#[derive(Debug, Clone)]
pub struct StackOptions {
    pub database_url: String,
    pub redis_url: String,
    /// `--redis`: with `cluster` or `sentinel`, `redis_url` is ignored
    /// (the run starts a set-up of its own).
    pub redis: RedisChoice,
    /// `--postgres`: with `pair`, `database_url` is ignored (the run
    /// starts a primary and a synchronous standby of its own).
    pub postgres: PgChoice,
    pub reuse_database: bool,
    pub prefix: Option<String>,
    pub dir: Option<PathBuf>,
    pub planner: PathBuf,
    pub worker: PathBuf,
    pub concurrency: u32,
    /// `worker --batch`.
    pub batch: u32,
    /// `chaos-worker --sabotage` (the judge's self-test only).
    pub sabotage: Option<String>,
}

/// The `clock-ahead` worker's offset, as libfaketime's `FAKETIME` takes it.
pub const CLOCK_AHEAD: &str = "+40s";

pub struct Stack {
    pub opts: StackOptions,
    pub db_name: String,
    pub db_url: String,
    created_db: bool,
    pub prefix: String,
    pub dir: PathBuf,
    pub config: PathBuf,
    pub pool: PgPool,
    pub redis: RedisConn,
    /// Every Redis key name of the run (the default layout on a
    /// standalone Redis, hash-tagged partitions on a Cluster).
    pub keys: KeySpace,
    /// The run's own Cluster (`--redis cluster`), locked by whoever needs
    /// its shape to hold still: a failover, a wipe of every master.
    pub cluster: Option<Arc<tokio::sync::Mutex<OwnedCluster>>>,
    /// The run's own Sentinel set-up (`--redis sentinel`), locked by a
    /// failover from the kill until the killed node is back.
    pub sentinel: Option<Arc<tokio::sync::Mutex<OwnedSentinel>>>,
    /// The run's own Postgres pair (`--postgres pair`): every process and
    /// the harness reach it through its front proxy.
    pub pg_pair: Option<Arc<tokio::sync::Mutex<PgPair>>>,
    /// Held for reading by the faults that hold a Postgres session of the
    /// harness's own for seconds (`quota-held`, `stall-burst`), for
    /// writing by `pg-failover`: a failover waits for those holds to end,
    /// and a hold waits for the failover, so the harness's own lock dying
    /// with the primary is not counted as a fault not injected. (The
    /// workers' sessions are not held back: they die with the primary.)
    pub pg_sessions: tokio::sync::RwLock<()>,
    pub cms: Cms,
    /// The local day of the run (every kind uses the same zone).
    pub day: String,
    /// The zone the kinds use (`Etc/GMT±h`, where the window is around noon).
    pub zone: String,
    /// Wall-clock start of the window: slot offsets count from here.
    pub base: DateTime<Utc>,
    /// The zone's offset (fixed: `Etc/GMT±h`).
    off: chrono::FixedOffset,
    /// More environment for the planner and the workers (a receiver's
    /// password variable).
    pub extra_env: Vec<(String, String)>,
}

fn tag() -> String {
    use rand::Rng;
    let mut rng = rand::thread_rng();
    (0..6)
        .map(|_| char::from(b"abcdefghijklmnopqrstuvwxyz0123456789"[rng.gen_range(0..36)]))
        .collect()
}

pub async fn connect(url: &str, max: u32) -> Result<PgPool> {
    let opts = PgConnectOptions::from_str(url)?.application_name("slotgate-chaos");
    Ok(PgPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(Duration::from_secs(10))
        .connect_with(opts)
        .await?)
}

impl Stack {
    /// Creates the database (unless reused), picks the prefix, starts the CMS.
    pub async fn create(mut opts: StackOptions, seed: u64) -> Result<Stack> {
        for (what, p) in [("planner", &opts.planner), ("worker", &opts.worker)] {
            if !p.is_file() {
                bail!(
                    "{what} binary not found at {} (build it with `cargo build -p planner -p worker`, or pass --{what} PATH)",
                    p.display()
                );
            }
        }
        let t = tag();
        let pg_pair = match opts.postgres {
            PgChoice::Single => None,
            PgChoice::Pair => {
                if opts.reuse_database {
                    bail!("--reuse-database does not apply to --postgres pair (the pair is the run's own)");
                }
                // PgPair's set-up panics on failure (a test's); here it is
                // the run's set-up failing.
                let pair = tokio::spawn(PgPair::start(Replication::Sync(SyncLevel::On)))
                    .await
                    .map_err(|e| anyhow::anyhow!("starting a Postgres pair: {e}"))?;
                opts.database_url = pair.url("postgres");
                Some(Arc::new(tokio::sync::Mutex::new(pair)))
            }
        };
        let (db_name, db_url, created_db) = if opts.reuse_database {
            let name = database_of(&opts.database_url)
                .context("--reuse-database needs a database name in DATABASE_URL")?;
            (name, opts.database_url.clone(), false)
        } else {
            let name = format!("chaos_{seed}_{t}");
            let admin = connect(&opts.database_url, 1)
                .await
                .with_context(|| "connecting to Postgres (DATABASE_URL)".to_string())?;
            sqlx::query(&format!("CREATE DATABASE {name}"))
                .execute(&admin)
                .await
                .context("CREATE DATABASE")?;
            admin.close().await;
            let url = with_database(&opts.database_url, &name);
            (name, url, true)
        };
        let prefix = opts
            .prefix
            .clone()
            .unwrap_or_else(|| format!("chaos-{seed}-{t}"));
        let dir = opts
            .dir
            .clone()
            .unwrap_or_else(|| std::env::temp_dir().join(format!("slotgate-{prefix}")));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let mut sentinel = None;
        let (redis, keys, cluster) = match opts.redis {
            RedisChoice::Standalone => {
                let c = redis::Client::open(opts.redis_url.as_str())
                    .context("REDIS_URL")?
                    .get_multiplexed_async_connection()
                    .await
                    .context("connecting to Redis (REDIS_URL)")?;
                (RedisConn::Single(c), KeySpace::new(prefix.clone()), None)
            }
            RedisChoice::Cluster => {
                let (masters, replicas) = CLUSTER_SHAPE;
                let cluster =
                    tokio::task::spawn_blocking(move || OwnedCluster::launch(masters, replicas))
                        .await?
                        .map_err(|e| anyhow::anyhow!("starting a Redis Cluster: {e}"))?;
                opts.redis_url = cluster.url();
                let c = redis::cluster::ClusterClientBuilder::new(opts.redis_url.split(','))
                    .connection_timeout(Duration::from_secs(3))
                    .response_timeout(Duration::from_secs(4))
                    .build()
                    .context("the Cluster's seed URLs")?
                    .get_async_connection()
                    .await
                    .context("connecting to the Redis Cluster")?;
                (
                    RedisConn::Cluster(c),
                    KeySpace::partitioned(prefix.clone(), CLUSTER_PARTITIONS, true),
                    Some(Arc::new(tokio::sync::Mutex::new(cluster))),
                )
            }
            RedisChoice::Sentinel => {
                let set_up = tokio::task::spawn_blocking(|| {
                    OwnedSentinel::launch(testkit::server::SentinelAuth::default())
                })
                .await?
                .map_err(|e| anyhow::anyhow!("starting a Redis Sentinel set-up: {e}"))?;
                opts.redis_url = set_up.url();
                let port = set_up
                    .named_primary()
                    .context("no Sentinel names a primary")?;
                let primary = Primary::connect(port)
                    .await
                    .context("connecting to the Sentinels' primary")?;
                sentinel = Some(Arc::new(tokio::sync::Mutex::new(set_up)));
                (
                    RedisConn::Sentinel(FollowedPrimary(Arc::new(tokio::sync::RwLock::new(
                        primary,
                    )))),
                    KeySpace::new(prefix.clone()),
                    None,
                )
            }
        };
        let pool = connect(&db_url, 6)
            .await
            .context("connecting to the chaos database")?;
        Ok(Stack {
            config: dir.join("slotgate.toml"),
            opts,
            db_name,
            db_url,
            created_db,
            prefix,
            dir,
            pool,
            redis,
            keys,
            cluster,
            sentinel,
            pg_pair,
            pg_sessions: tokio::sync::RwLock::new(()),
            cms: Cms::start().await,
            day: String::new(),
            zone: String::new(),
            base: Utc::now(),
            off: chrono::FixedOffset::east_opt(0).expect("UTC"),
            extra_env: Vec::new(),
        })
    }

    /// The stream harness deliveries go to: partition 0's (any
    /// partition's stream is read and delivered alike).
    pub fn ready(&self) -> String {
        self.keys.part(0).ready()
    }

    /// How `redis-cli` reaches the run's Redis: its URL, or on a Cluster a
    /// live node with `-c` (it follows `MOVED` to the key's master).
    pub async fn redis_cli_target(&self) -> Vec<String> {
        if let RedisConn::Sentinel(p) = &self.redis {
            let port = p.0.read().await.port;
            return vec![
                "-h".into(),
                "127.0.0.1".into(),
                "-p".into(),
                port.to_string(),
            ];
        }
        match &self.cluster {
            None => vec!["-u".into(), self.opts.redis_url.clone()],
            Some(c) => {
                let port = c.lock().await.live_ports().first().copied().unwrap_or(0);
                vec![
                    "-c".into(),
                    "-h".into(),
                    "127.0.0.1".into(),
                    "-p".into(),
                    port.to_string(),
                ]
            }
        }
    }

    /// `redis-master-failover`: `kill -9` of the master serving
    /// `partition`'s keys, verified by a replica of it having taken over
    /// (the cluster healthy, the partition's master another node), then the
    /// node started again on its port, where it rejoins as a replica, so
    /// the fault can recur. What happened, and whether it was verified.
    pub async fn fail_over(&self, partition: u16) -> Result<(String, bool)> {
        let cluster = self
            .cluster
            .clone()
            .context("redis-master-failover needs --redis cluster")?;
        let key = self.keys.part(partition % self.keys.partitions()).ready();
        let mut c = cluster.lock_owned().await;
        tokio::task::spawn_blocking(move || -> Result<(String, bool)> {
            let old = c
                .master_of(&key)
                .with_context(|| format!("no master serves {key}"))?;
            let started = Instant::now();
            c.kill_9(old);
            let healthy = c.wait_healthy();
            let took = started.elapsed();
            let new = c.master_of(&key);
            let back = c.restart(old);
            let verified = healthy.is_ok() && new.is_some_and(|n| n != old) && back.is_ok();
            Ok((
                format!(
                    "kill -9 master {old} of partition {partition} ({key}); {} after {took:.1?}; node {old} restarted: {}",
                    match (&healthy, new) {
                        (Ok(()), Some(n)) if n != old => format!("replica {n} took over"),
                        (Ok(()), n) => format!("healthy but the master is {n:?}"),
                        (Err(e), _) => format!("not healthy: {e}"),
                    },
                    match &back {
                        Ok(()) => "back as a replica".to_owned(),
                        Err(e) => format!("not back: {e}"),
                    }
                ),
                verified,
            ))
        })
        .await?
    }

    /// `sentinel-failover`: `kill -9` of the primary the Sentinels name,
    /// verified by the replica elected (a Sentinel names it, it answers
    /// `ROLE` master) and written to by slotgate (its client write calls
    /// grew after the election; the harness's own commands wait meanwhile,
    /// so they are not counted), then the node started again on its port,
    /// where the Sentinels make it a replica, so the fault can recur. What
    /// happened, and whether it was verified.
    pub async fn sentinel_fail_over(&self) -> Result<(String, bool)> {
        let set_up = self
            .sentinel
            .clone()
            .context("sentinel-failover needs --redis sentinel")?;
        let RedisConn::Sentinel(followed) = &self.redis else {
            bail!("sentinel-failover needs --redis sentinel");
        };
        let s = set_up.lock_owned().await;
        // The harness's commands wait from the kill until they can go to
        // the new primary.
        let mut primary = followed.0.write().await;
        let started = Instant::now();
        let (s, old, elected, wrote) = tokio::task::spawn_blocking(move || {
            let mut s = s;
            let old = s.kill_9_primary();
            let elected = s.wait_failed_over(old);
            let wrote = elected.as_ref().ok().and_then(|new| {
                let base = s.write_calls(*new)?;
                let deadline = Instant::now() + Duration::from_secs(30);
                loop {
                    let now = s.write_calls(*new).unwrap_or(base);
                    if now > base {
                        return Some(now - base);
                    }
                    if Instant::now() > deadline {
                        return None;
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
            });
            (s, old, elected, wrote)
        })
        .await?;
        let took = started.elapsed();
        if let Ok(new) = &elected {
            *primary = Primary::connect(*new)
                .await
                .with_context(|| format!("connecting to the new primary {new}"))?;
        }
        drop(primary);
        let (_s, back) = tokio::task::spawn_blocking(move || {
            let mut s = s;
            let back = s.restart(old);
            (s, back)
        })
        .await?;
        let what = format!(
            "kill -9 primary {old}; {} after {took:.1?}; {}; node {old} restarted: {}",
            match &elected {
                Ok(new) => format!("the Sentinels elected {new}"),
                Err(e) => format!("no new primary: {e}"),
            },
            match wrote {
                Some(n) => format!("slotgate wrote to it (+{n} write call(s))"),
                None => "slotgate did not write to it within 30 s".to_owned(),
            },
            match &back {
                Ok(()) => "back as a replica".to_owned(),
                Err(e) => format!("not back: {e}"),
            }
        );
        let verified = elected.is_ok() && wrote.is_some() && back.is_ok();
        Ok((what, verified))
    }

    /// `pg-failover`: `kill -9` of the Postgres primary (verified: the
    /// postmaster gone, its port refusing), the synchronous standby
    /// promoted (verified: out of recovery) and the front proxy moved to
    /// it. What happened, and how long the promotion took. The caller
    /// verifies that slotgate carried on there.
    pub async fn pg_fail_over(&self) -> Result<String> {
        let pair = self
            .pg_pair
            .clone()
            .context("pg-failover needs --postgres pair")?;
        let pair = pair.lock_owned().await;
        let (old, new) = (pair.primary.port, pair.replica.port);
        let started = Instant::now();
        // PgPair's steps panic when they fail (a test's); a failed step
        // here is a fault not injected.
        let pair = tokio::spawn(async move {
            pair.kill_primary();
            pair.promote().await;
            pair.repoint_front_to_replica();
            pair
        })
        .await
        .map_err(|e| anyhow::anyhow!("the failover: {e}"))?;
        Ok(format!(
            "kill -9 primary {old}; standby {new} promoted and the address {} moved to it after {:.1?}",
            pair.front.addr,
            started.elapsed()
        ))
    }

    /// Every entry of every partition's dead letters, partition by
    /// partition.
    pub async fn dead_letters(&self) -> Result<Vec<redis::streams::StreamId>> {
        let mut c = self.redis.clone();
        let mut all = Vec::new();
        for (_, p) in self.keys.parts() {
            let page: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
                .arg(p.dead())
                .arg("-")
                .arg("+")
                .query_async(&mut c)
                .await?;
            all.extend(page.ids);
        }
        Ok(all)
    }

    pub fn envs(&self) -> Vec<(&str, &str)> {
        let mut v = vec![
            ("DATABASE_URL", self.db_url.as_str()),
            ("REDIS_URL", self.opts.redis_url.as_str()),
            ("SLOTGATE_PREFIX", self.prefix.as_str()),
            (
                "SLOTGATE_CONFIG",
                self.config.to_str().unwrap_or("slotgate.toml"),
            ),
        ];
        v.extend(self.extra_env.iter().map(|(k, x)| (k.as_str(), x.as_str())));
        v
    }

    /// Writes the config for a window starting `lead` from now: every kind in
    /// one zone where the window is centred on local noon, so no run comes
    /// near a local midnight whatever the time of day.
    pub fn write_config(&mut self, sc: &Scenario, lead: Duration) -> Result<()> {
        let base =
            (Utc::now() + CDuration::from_std(lead)?).trunc_subsecs(0) + CDuration::seconds(1);
        let zone = testkit::zone::around_noon(base, sc.duration);
        let off = zone.offset();
        let end = base + CDuration::from_std(sc.duration)? + CDuration::seconds(30);
        if zone.day(base) != zone.day(end) {
            bail!(
                "a window of {:?} does not fit in one local day",
                sc.duration
            );
        }
        self.zone = zone.name();
        self.day = base.with_timezone(&off).date_naive().to_string();
        self.base = base;
        self.off = off;
        self.write_toml(sc, None)
    }

    /// Rewrites the config in place with `kind`'s schedule edited: the
    /// time `added_s` after the window's start inserted in front of its
    /// `slots`, slot `removed` (its position in the scenario) taken out.
    /// Processes started from now on read it (`schedule-edit`).
    pub fn write_edited_config(
        &self,
        sc: &Scenario,
        kind: usize,
        removed: u32,
        added_s: u64,
    ) -> Result<()> {
        self.write_toml(sc, Some((kind, removed, added_s)))
    }

    fn write_toml(&self, sc: &Scenario, edit: Option<(usize, u32, u64)>) -> Result<()> {
        let (base, off) = (self.base, self.off);
        let mut toml = format!("jitter_seed = \"chaos-{}\"\n", sc.seed);
        if self.keys.tagged() {
            let _ = writeln!(toml, "redis_partitions = {}", self.keys.partitions());
        }
        for (i, k) in sc.kinds.iter().enumerate() {
            let mut offsets = k.offsets.clone();
            if let Some((_, removed, added_s)) = edit.filter(|e| e.0 == i) {
                offsets.remove(removed as usize - 1);
                offsets.insert(0, added_s);
            }
            let slots: Vec<String> = offsets
                .iter()
                .map(|s| {
                    format!(
                        "\"{}\"",
                        (base + CDuration::seconds(*s as i64))
                            .with_timezone(&off)
                            .format("%H:%M:%S")
                    )
                })
                .collect();
            let _ = writeln!(toml, "\n[[kinds]]");
            let _ = writeln!(toml, "name = \"{}\"", k.name);
            let _ = writeln!(toml, "timezone = \"{}\"", self.zone);
            let _ = writeln!(toml, "slots = [{}]", slots.join(", "));
            let _ = writeln!(toml, "jitter = \"2s\"");
            let _ = writeln!(toml, "daily_cap = {}", k.daily_cap);
            let _ = writeln!(toml, "starting_deadline = \"1h\"");
            if !k.record_only {
                let _ = writeln!(toml, "publish_url = \"{}\"", self.cms.url("/publish"));
                if sc.probe {
                    let _ = writeln!(toml, "probe_url = \"{}\"", self.cms.url("/probe"));
                }
            }
            if k.index {
                let _ = writeln!(toml, "index_url = \"{}\"", self.cms.url("/index"));
            }
            let _ = writeln!(toml, "http_timeout = \"{HTTP_TIMEOUT_MS}ms\"");
            let attempts = if sc.probe && !k.record_only {
                PROBE_HTTP_ATTEMPTS
            } else {
                HTTP_ATTEMPTS
            };
            let _ = writeln!(toml, "http_attempts = {attempts}");
            let _ = writeln!(toml, "retry_base = \"50ms\"");
            let _ = writeln!(toml, "retry_cap = \"1s\"");
        }
        std::fs::write(&self.config, toml)
            .with_context(|| format!("writing {}", self.config.display()))?;
        Ok(())
    }

    /// Writes the drafts file (each draft's body is a token of the harness's
    /// own, so the ledger knows drafts without reading slotgate's tables).
    pub fn write_drafts(&self, sc: &Scenario) -> Result<PathBuf> {
        let path = self.dir.join("drafts.jsonl");
        let mut text = String::new();
        for k in &sc.kinds {
            for i in 0..k.drafts {
                let line = serde_json::json!({
                    "kind": k.name,
                    "title": format!("{} #{i}", k.name),
                    "body": draft_token(&k.name, i),
                });
                let _ = writeln!(text, "{line}");
            }
        }
        std::fs::write(&path, text)?;
        Ok(path)
    }

    /// Runs the planner with `args`; (success, stdout, stderr).
    ///
    /// A run that failed before it did anything (see the conditions
    /// below) is run again, a few times: it is the harness's tool
    /// failing, not an injection.
    pub async fn planner(&self, args: &[&str]) -> Result<(bool, String, String)> {
        let mut tries = 0;
        loop {
            tries += 1;
            let out = testkit::process::run(&self.opts.planner, args, &self.envs())
                .await
                .with_context(|| format!("running {}", self.opts.planner.display()))?;
            let err = String::from_utf8_lossy(&out.stderr).into_owned();
            // Failures before the command did anything, which a retry
            // does not repeat: a connection a `pg-terminate` ended, the
            // pool's wait for one, or (on `--redis sentinel`) a first
            // Redis connection for which no Sentinel named a primary in
            // time (seen once in CI with every core busy, long before
            // that run's failover).
            if !out.status.success()
                && tries < 10
                && (err.contains("terminating connection due to administrator command")
                    || err.contains("pool timed out")
                    || err.contains("MasterNameNotFoundBySentinel"))
            {
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                continue;
            }
            return Ok((
                out.status.success(),
                String::from_utf8_lossy(&out.stdout).into_owned(),
                err,
            ));
        }
    }

    /// Like [`Self::planner`], failing on a non-zero exit.
    /// Plans the run's day with `planner plan --json` and checks it holds
    /// the `expected` number of slots the scenario laid out.
    pub async fn plan_day(&self, expected: usize) -> Result<Vec<crate::model::PlanSlot>> {
        #[derive(serde::Deserialize)]
        struct Planned {
            slots: Vec<crate::model::PlanSlot>,
        }
        let out = self
            .planner_ok(&["plan", "--day", &self.day, "--json"])
            .await?;
        let planned: Planned = serde_json::from_str(out.trim()).context("plan --json output")?;
        if planned.slots.len() != expected {
            bail!(
                "planned {} slots, the scenario has {expected}",
                planned.slots.len()
            );
        }
        Ok(planned.slots)
    }

    pub async fn planner_ok(&self, args: &[&str]) -> Result<String> {
        let (ok, out, err) = self.planner(args).await?;
        if !ok {
            bail!("planner {}: {}", args.join(" "), err.trim());
        }
        Ok(out)
    }

    /// Starts a worker; with `clock_ahead`, with libfaketime preloaded and
    /// its wall clock 40 s ahead. (Preloaded rather than through the
    /// `faketime` wrapper, which would stand between the harness's signals
    /// and the worker.)
    pub fn spawn_worker(&self, log_name: &str, id: &str, clock_ahead: bool) -> Proc {
        let c = self.opts.concurrency.to_string();
        let b = self.opts.batch.to_string();
        let mut args = vec![
            "--batch",
            b.as_str(),
            "--id",
            id,
            "--concurrency",
            c.as_str(),
            "--lease-ttl",
            LEASE_TTL,
            "--visibility",
            VISIBILITY,
            "--reconcile-every",
            RECONCILE_EVERY,
            "--shutdown-grace",
            "5s",
        ];
        if let Some(s) = &self.opts.sabotage {
            args.extend(["--sabotage", s.as_str()]);
        }
        let mut envs = self.envs();
        let skew = testkit::process::libfaketime()
            .filter(|_| clock_ahead)
            .map(|lib| testkit::process::clock_offset_envs(&lib.to_string_lossy(), CLOCK_AHEAD));
        if let Some(skew) = &skew {
            envs.extend(skew.iter().map(|(k, v)| (*k, v.as_str())));
        }
        Proc::spawn(log_name, &self.opts.worker, &args, &envs, &self.dir)
    }

    /// What is still queued, summed over the partitions: (stream length,
    /// entries pending in the workers' group, delayed entries).
    pub async fn residue(&self) -> Result<(u64, u64, u64)> {
        let mut c = self.redis.clone();
        let (mut len, mut pending, mut delayed) = (0, 0, 0);
        for (_, p) in self.keys.parts() {
            len += redis::cmd("XLEN")
                .arg(p.ready())
                .query_async::<u64>(&mut c)
                .await?;
            delayed += redis::cmd("ZCARD")
                .arg(p.delayed())
                .query_async::<u64>(&mut c)
                .await?;
            pending += match redis::cmd("XPENDING")
                .arg(p.ready())
                .arg(slotgate::queue::GROUP)
                .query_async::<redis::Value>(&mut c)
                .await
            {
                Ok(redis::Value::Array(v)) => v
                    .first()
                    .and_then(|x| redis::from_redis_value::<u64>(x).ok())
                    .unwrap_or(0),
                _ => 0,
            };
        }
        Ok((len, pending, delayed))
    }

    /// Every key of the prefix on one server (SCAN, not KEYS: this may be
    /// a shared server). On a Cluster node: the keys of the run's hash
    /// tags (`{P}:…`, `{P:p…}:…`) it holds.
    async fn scan_prefix(&self, c: &mut RedisConn) -> Result<Vec<String>> {
        let pattern = match self.cluster {
            None => format!("{}:*", glob_escape(&self.prefix)),
            Some(_) => format!("{{{}[:}}]*", glob_escape(&self.prefix)),
        };
        let mut cursor: u64 = 0;
        let mut keys = Vec::new();
        loop {
            let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(1000)
                .query_async(c)
                .await?;
            keys.extend(batch);
            if next == 0 {
                return Ok(keys);
            }
            cursor = next;
        }
    }

    /// Deletes every key of the prefix ("Redis lost everything", for this
    /// run only). On a Cluster: every master scanned (the Cluster locked,
    /// so no failover moves keys meanwhile), each key deleted by itself (a
    /// DEL of keys in different hash slots is refused with CROSSSLOT).
    pub async fn wipe_prefix(&self) -> Result<usize> {
        let Some(cluster) = &self.cluster else {
            let mut c = self.redis.clone();
            let keys = self.scan_prefix(&mut c).await?;
            if keys.is_empty() {
                return Ok(0);
            }
            let n: usize = redis::cmd("DEL").arg(&keys).query_async(&mut c).await?;
            return Ok(n);
        };
        let held = cluster.clone().lock_owned().await;
        let (held, masters) = tokio::task::spawn_blocking(move || {
            let m = held.master_ports();
            (held, m)
        })
        .await?;
        let mut n = 0;
        for port in masters {
            let mut node = RedisConn::Single(
                redis::Client::open(format!("redis://127.0.0.1:{port}/"))?
                    .get_multiplexed_async_connection()
                    .await
                    .with_context(|| format!("connecting to master {port}"))?,
            );
            for key in self.scan_prefix(&mut node).await? {
                let mut c = self.redis.clone();
                n += redis::cmd("DEL")
                    .arg(&key)
                    .query_async::<usize>(&mut c)
                    .await?;
            }
        }
        drop(held);
        Ok(n)
    }

    /// Drops the database (when this run created it) and the prefix.
    pub async fn teardown(&self, keep: bool) {
        if keep {
            println!(
                "chaos: kept database {} and Redis prefix {} (--keep)",
                self.db_name, self.prefix
            );
            return;
        }
        // A Cluster or Sentinel set-up of the run's own goes with it
        // (dropped with the stack).
        if self.opts.redis == RedisChoice::Standalone {
            if let Err(e) = self.wipe_prefix().await {
                eprintln!("chaos: could not delete Redis prefix {}: {e}", self.prefix);
            }
        }
        self.pool.close().await;
        if self.created_db {
            match connect(&self.opts.database_url, 1).await {
                Ok(admin) => {
                    if let Err(e) = sqlx::query(&format!(
                        "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                        self.db_name
                    ))
                    .execute(&admin)
                    .await
                    {
                        eprintln!("chaos: could not drop database {}: {e}", self.db_name);
                    }
                    admin.close().await;
                }
                Err(e) => eprintln!("chaos: could not drop database {}: {e}", self.db_name),
            }
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for ch in s.chars() {
        if matches!(ch, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(ch);
    }
    out
}

/// The body of draft `i` of `kind`: the ledger identifies drafts by it.
pub fn draft_token(kind: &str, i: u32) -> String {
    format!("chaos-draft {kind} {i}")
}

/// The kind a draft token belongs to.
pub fn token_kind(token: &str) -> Option<&str> {
    let rest = token.strip_prefix("chaos-draft ")?;
    Some(rest.rsplit_once(' ')?.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_tokens() {
        assert_eq!(
            with_database("postgres://u@h:5432/postgres?sslmode=disable", "x"),
            "postgres://u@h:5432/x?sslmode=disable"
        );
        assert_eq!(with_database("postgres://u@h", "x"), "postgres://u@h/x");
        assert_eq!(database_of("postgres://u@h/db?a=b").as_deref(), Some("db"));
        assert_eq!(database_of("postgres://u@h/"), None);
        assert_eq!(token_kind(&draft_token("news", 3)), Some("news"));
        assert_eq!(glob_escape("{a}[b]"), "{a}\\[b\\]");
    }
}
