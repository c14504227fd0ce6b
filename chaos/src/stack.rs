//! The system under test as chaos sets it up: testkit's deployment fixture
//! ([`testkit::stack::Stack`], on the topologies of `--redis` and
//! `--postgres`) with what only chaos needs on top — the stand-in CMS, the
//! scenario's config and drafts written for a window of its own, the
//! planner run with retries of the tool's own failures, workers with the
//! scenario's flags (and the `clock-ahead` worker's skewed clock), and the
//! queue's residue read through [`KeySpace`].

use crate::scenario::{
    Scenario, HTTP_ATTEMPTS, HTTP_TIMEOUT_MS, LEASE_TTL, PROBE_HTTP_ATTEMPTS, RECONCILE_EVERY,
    VISIBILITY,
};
use crate::topology::{PgChoice, RedisChoice, CLUSTER_PARTITIONS, CLUSTER_SHAPE};
use anyhow::{bail, Context, Result};
use chrono::{DateTime, Duration as CDuration, SubsecRound, Utc};
use slotgate::queue::KeySpace;
use std::collections::HashSet;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;
use testkit::cms::Cms;
use testkit::process::Proc;
use testkit::redis_conn::RedisConn;
use testkit::stack::Bins;
use testkit::zone::Zone;

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
    /// The deployment: database, prefix, directory, config, binaries,
    /// and the run's own Cluster, Sentinel set-up or Postgres pair.
    pub kit: testkit::stack::Stack,
    /// The database's name (`pg_stat_activity.datname`).
    pub db_name: String,
    pub redis: RedisConn,
    /// Every Redis key name of the run (the default layout on a
    /// standalone Redis, hash-tagged partitions on a Cluster).
    pub keys: KeySpace,
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
}

fn tag() -> String {
    use rand::Rng;
    let mut rng = rand::thread_rng();
    (0..6)
        .map(|_| char::from(b"abcdefghijklmnopqrstuvwxyz0123456789"[rng.gen_range(0..36)]))
        .collect()
}

impl Stack {
    /// Sets the deployment up on the topologies asked for (a fresh
    /// database unless reused, the prefix, the directory), with `envs`
    /// for every process, and starts the CMS. The stack keeps its database
    /// and prefix until [`Stack::finish`] says otherwise, so an
    /// interrupted run leaves its evidence.
    pub async fn create(opts: StackOptions, seed: u64, envs: &[(&str, &str)]) -> Result<Stack> {
        for (what, p) in [("planner", &opts.planner), ("worker", &opts.worker)] {
            if !p.is_file() {
                bail!(
                    "{what} binary not found at {} (build it with `cargo build -p planner -p worker`, or pass --{what} PATH)",
                    p.display()
                );
            }
        }
        if opts.reuse_database && opts.postgres == PgChoice::Pair {
            bail!("--reuse-database does not apply to --postgres pair (the pair is the run's own)");
        }
        let prefix = opts
            .prefix
            .clone()
            .unwrap_or_else(|| format!("chaos-{seed}-{}", tag()));
        let mut b = testkit::stack::Stack::builder(Bins {
            worker: opts.worker.clone(),
            planner: opts.planner.clone(),
        })
        .tag("chaos")
        .prefix(prefix.clone());
        if let Some(dir) = &opts.dir {
            b = b.dir(dir);
        }
        b = match (opts.reuse_database, opts.postgres) {
            (_, PgChoice::Pair) => b.postgres_pair(),
            (true, _) => b.database_url(&opts.database_url),
            (false, _) => b.postgres(&opts.database_url),
        };
        b = match opts.redis {
            RedisChoice::Standalone => b.redis_url(&opts.redis_url),
            RedisChoice::Cluster => b.redis_cluster(CLUSTER_SHAPE.0, CLUSTER_SHAPE.1),
            RedisChoice::Sentinel => b.redis_sentinel(),
        };
        for (k, v) in envs {
            b = b.env(k, v);
        }
        // testkit's set-up panics on failure (a test's); here it is the
        // run's set-up failing.
        let kit = tokio::spawn(b.build(""))
            .await
            .map_err(|e| anyhow::anyhow!("setting the stores up: {e}"))?;
        kit.keep(true);
        let keys = match opts.redis {
            RedisChoice::Cluster => KeySpace::partitioned(prefix, CLUSTER_PARTITIONS, true),
            _ => KeySpace::new(prefix),
        };
        let redis = kit.redis_conn().await.context("connecting to Redis")?;
        let db_name = sqlx::query_scalar("SELECT current_database()::text")
            .fetch_one(&kit.pool)
            .await
            .context("connecting to the chaos database")?;
        Ok(Stack {
            opts,
            kit,
            db_name,
            redis,
            keys,
            pg_sessions: tokio::sync::RwLock::new(()),
            cms: Cms::start().await,
            day: String::new(),
            zone: String::new(),
            base: Utc::now(),
            off: chrono::FixedOffset::east_opt(0).expect("UTC"),
        })
    }

    /// The stream harness deliveries go to: partition 0's (any
    /// partition's stream is read and delivered alike).
    pub fn ready(&self) -> String {
        self.keys.part(0).ready()
    }

    /// XADD of `fields` under `id` (`*`: Redis picks) to the stream
    /// harness deliveries go to ([`Self::ready`]); the entry's id.
    pub async fn xadd(&self, id: &str, fields: &[(&str, &[u8])]) -> Result<String> {
        let mut c = self.redis.clone();
        let mut cmd = redis::cmd("XADD");
        cmd.arg(self.ready()).arg(id);
        for (k, v) in fields {
            cmd.arg(*k).arg(*v);
        }
        Ok(cmd.query_async(&mut c).await?)
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

    /// Opens the run's window `lead` from now, for `duration`: every kind
    /// in one zone where the window is centred on local noon, so no run
    /// comes near a local midnight whatever the time of day. Sets the
    /// window's start, zone and day; the zone, to write times in.
    pub fn open_window(&mut self, lead: Duration, duration: Duration) -> Result<Zone> {
        let base =
            (Utc::now() + CDuration::from_std(lead)?).trunc_subsecs(0) + CDuration::seconds(1);
        let zone = testkit::zone::around_noon(base, duration);
        let end = base + CDuration::from_std(duration)? + CDuration::seconds(30);
        if zone.day(base) != zone.day(end) {
            bail!("a window of {duration:?} does not fit in one local day");
        }
        self.zone = zone.name();
        self.day = zone.day(base).to_string();
        self.base = base;
        self.off = zone.offset();
        Ok(zone)
    }

    /// Writes the scenario's config for a window starting `lead` from now
    /// ([`Self::open_window`]).
    pub fn write_config(&mut self, sc: &Scenario, lead: Duration) -> Result<()> {
        self.open_window(lead, sc.duration)?;
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
        // Written aside and renamed into place: a planner started while
        // `schedule-edit` rewrites the config reads the old one or the
        // new one, never a truncated file.
        let config = &self.kit.config;
        let aside = config.with_extension("toml.new");
        std::fs::write(&aside, toml).with_context(|| format!("writing {}", aside.display()))?;
        std::fs::rename(&aside, config)
            .with_context(|| format!("replacing {}", config.display()))?;
        Ok(())
    }

    /// Writes `drafts` (a JSON object each: kind, title, body) to the
    /// run's drafts file and imports them through the real planner.
    pub async fn import_drafts(
        &self,
        drafts: impl IntoIterator<Item = serde_json::Value>,
    ) -> Result<()> {
        let path = self.kit.dir.join("drafts.jsonl");
        let mut text = String::new();
        for line in drafts {
            let _ = writeln!(text, "{line}");
        }
        std::fs::write(&path, text)?;
        let path = path.to_str().context("the drafts file's path")?;
        self.planner_ok(&["drafts", "import", path]).await?;
        Ok(())
    }

    /// Runs the planner with `args`; (success, stdout, stderr).
    ///
    /// A run that failed before it did anything (see the conditions
    /// below) is run again, a few times: it is the harness's tool
    /// failing, not an injection.
    pub async fn planner(&self, args: &[&str]) -> Result<(bool, String, String)> {
        let started = std::time::Instant::now();
        loop {
            let out = self.kit.planner_output(args, &[]).await;
            let err = String::from_utf8_lossy(&out.stderr).into_owned();
            // Failures before the command did anything, which a retry
            // does not repeat: a connection a `pg-terminate` ended, the
            // pool's wait for one, no Postgres to connect to (on
            // `--postgres pair`, the address leads to a killed primary
            // until the failover moves it: up to several seconds), or (on
            // `--redis sentinel`) a first Redis connection for which no
            // Sentinel named a primary in time (seen once in CI with every
            // core busy, long before that run's failover).
            if !out.status.success()
                && started.elapsed() < Duration::from_secs(30)
                && (err.contains("terminating connection due to administrator command")
                    || err.contains("pool timed out")
                    || err.contains("error: connecting to Postgres at")
                    || err.contains("MasterNameNotFoundBySentinel"))
            {
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
            return Ok((
                out.status.success(),
                String::from_utf8_lossy(&out.stdout).into_owned(),
                err,
            ));
        }
    }

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

    /// `planner trigger --json` of slot `key` (a finished one: a
    /// duplicate from the operator's command); the entry id it printed.
    pub async fn trigger(&self, key: &str) -> Result<String> {
        let k: slotgate::slot::SlotKey = key.parse().context("a slot key")?;
        let (day, no) = (k.day.to_string(), k.slot_no.to_string());
        let args = ["trigger", "--kind", &k.kind, "--day", &day, "--slot", &no];
        let out = self.planner_ok(&[&args[..], &["--json"]].concat()).await?;
        let v: serde_json::Value = serde_json::from_str(out.trim()).context("trigger --json")?;
        Ok(v["entry_id"]
            .as_str()
            .context("trigger --json: entry_id")?
            .to_owned())
    }

    /// `planner backfill` of `kind` on the run's day: the slots it
    /// delivered (those due and without an outcome).
    pub async fn backfill(&self, kind: &str) -> Result<Vec<String>> {
        #[derive(serde::Deserialize)]
        struct Backfill {
            delivered: Vec<String>,
        }
        let day = self.day.as_str();
        let out = self
            .planner_ok(&["backfill", "--kind", kind, "--from", day, "--to", day])
            .await?;
        let b: Backfill = serde_json::from_str(out.trim()).context("backfill output")?;
        Ok(b.delivered)
    }

    /// Like [`Self::planner`], failing on a non-zero exit.
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
        let skew = testkit::process::libfaketime()
            .filter(|_| clock_ahead)
            .map(|lib| testkit::process::clock_offset_envs(&lib.to_string_lossy(), CLOCK_AHEAD));
        let skew: Vec<(&str, &str)> = skew
            .iter()
            .flatten()
            .map(|(k, v)| (*k, v.as_str()))
            .collect();
        self.kit.worker_logged(log_name, id, &args, &skew)
    }

    /// The slots of `kinds` with an outcome (published, skipped or
    /// failed), as slot keys: what a run waits for.
    pub async fn outcomes(&self, kinds: &[&str]) -> Result<HashSet<String>> {
        let rows: Vec<(String, String, i32)> = sqlx::query_as(
            "SELECT kind, day::text, slot FROM publish_slot WHERE state IN ('published', 'skipped', 'failed') AND kind = ANY($1)",
        )
        .bind(kinds)
        .fetch_all(&self.kit.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|(k, d, s)| format!("{k}:{d}:{s}"))
            .collect())
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

    /// The end of a run: unless it `passed`, its logs are kept and how
    /// to replay it (`replay`, its flags) printed; the database and the
    /// prefix go with the stack unless `keep`.
    pub fn finish(&self, passed: bool, keep: bool, replay: &str) {
        let dir = &self.kit.dir;
        if keep {
            println!(
                "chaos: kept database {} and Redis prefix {} (--keep)",
                self.db_name, self.kit.redis.prefix
            );
        } else if !passed {
            println!(
                "chaos: replay with {replay}; logs kept in {}",
                dir.display()
            );
        } else {
            let _ = std::fs::remove_dir_all(dir);
        }
        self.kit.keep(keep);
    }
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
    fn a_draft_token_names_its_kind() {
        assert_eq!(token_kind(&draft_token("news", 3)), Some("news"));
    }
}
