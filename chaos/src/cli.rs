//! The command line: [`Cli`] (clap), and what it makes of the flags
//! before a run starts — the fault set of the chosen topology and CMS, the
//! stack's options, the flags that replay a run, and the flags the
//! WordPress scenario refuses.

use crate::model::Fault;
use crate::scenario::{FaultSet, Kinds};
use crate::stack::StackOptions;
use crate::topology::{PgChoice, RedisChoice, Stores};
use anyhow::Result;
use chaos_sabotage::Sabotage;
use clap::Parser;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Parser, Debug)]
#[command(
    name = "chaos",
    version,
    about = "slotgate chaos suite: real planner and workers under seeded faults, judged by an independent CMS ledger"
)]
pub(crate) struct Cli {
    /// Seed of the scenario and the fault schedule (default: random; printed).
    #[arg(long)]
    pub(crate) seed: Option<u64>,
    /// Length of the compressed day (slots are spread over it).
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub(crate) duration: Duration,
    /// Worker processes.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=32))]
    pub(crate) workers: u32,
    /// Deliveries in flight per worker.
    #[arg(long, default_value_t = 4)]
    pub(crate) concurrency: u32,
    /// `worker --batch`: deliveries of a backlog taken through the gate at once.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub(crate) batch: u32,
    /// Fault kinds: `default`, `all`, `none` or names, comma-separated
    /// (`default,poison-entry`). The default is every kind. With
    /// --sabotage: none.
    #[arg(long)]
    pub(crate) faults: Option<FaultSet>,
    /// Print one JSON object with the verdict at the end (after the table).
    #[arg(long)]
    pub(crate) json: bool,
    /// Kinds: a number, or comma-separated names.
    #[arg(long, default_value = "4")]
    pub(crate) kinds: Kinds,
    /// Planned slots in all (default: 5 per second of --duration).
    #[arg(long)]
    pub(crate) slots: Option<u32>,
    /// How long to wait for everything to settle after the window.
    #[arg(long, default_value = "90s", value_parser = parse_duration)]
    pub(crate) settle: Duration,
    /// The planner binary (default: next to this one).
    #[arg(long)]
    pub(crate) planner: Option<PathBuf>,
    /// The worker binary (default: `worker` next to this one; with
    /// --sabotage, `chaos-worker`, which accepts it).
    #[arg(long)]
    pub(crate) worker: Option<PathBuf>,
    /// Postgres server; a fresh database is created on it (and dropped).
    /// Unused with --postgres pair.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true, default_value = testkit::DEFAULT_DATABASE_URL)]
    pub(crate) database_url: String,
    /// Redis server; a fresh key prefix is used on it (and deleted).
    /// Unused with --redis cluster or sentinel.
    #[arg(long, env = "REDIS_URL", hide_env_values = true, default_value = testkit::DEFAULT_REDIS_URL)]
    pub(crate) redis_url: String,
    /// The Redis topology: `standalone` (the server of REDIS_URL),
    /// `cluster` (a 3-master Redis Cluster with a replica each, started
    /// and stopped by the run from Debian's redis-server; the queue in 3
    /// partitions; adds the fault kind redis-master-failover to the
    /// default set) or `sentinel` (a primary, a replica and three
    /// Sentinels started and stopped by the run; slotgate is given the
    /// redis+sentinel:// URL; adds the fault kind sentinel-failover: kill
    /// -9 of the primary, the replica elected, the node restarted as a
    /// replica).
    #[arg(long, value_enum, default_value_t = RedisChoice::Standalone)]
    pub(crate) redis: RedisChoice,
    /// The Postgres topology: `single` (the server of DATABASE_URL) or
    /// `pair` (a primary with a synchronous streaming standby, started and
    /// stopped by the run from Debian's postgresql; every process reaches
    /// it through one proxy address; adds the fault kind pg-failover, once
    /// a run: kill -9 of the primary, the standby promoted, the address
    /// moved to it).
    #[arg(long, value_enum, default_value_t = PgChoice::Single)]
    pub(crate) postgres: PgChoice,
    /// Use the database named in DATABASE_URL as is (dedicated to chaos
    /// runs; migrated, never dropped) instead of creating one.
    #[arg(long)]
    pub(crate) reuse_database: bool,
    /// Redis key prefix (default: `chaos-<seed>-<random>`).
    #[arg(long)]
    pub(crate) prefix: Option<String>,
    /// Where the config, drafts and worker logs go (default: a temp dir).
    #[arg(long)]
    pub(crate) log_dir: Option<PathBuf>,
    /// Keep the database, the prefix and the logs (a Cluster, Sentinel
    /// set-up or Postgres pair of the run's own is stopped and removed
    /// anyway, with its data).
    #[arg(long)]
    pub(crate) keep: bool,
    /// The CMS: `webhook` (the stand-in CMS, honouring idempotency keys;
    /// every fault kind), `probe` (the same scenario with a `probe_url` on
    /// every webhook kind, against the stand-in CMS following the probe
    /// contract and not deduping publishes: a key applied twice is a
    /// violation; adds the fault kind webhook-held-before-apply) or
    /// `wordpress` (a real, throwaway WordPress with drafts in it, judged by
    /// WordPress's own records; needs Debian's wordpress, mariadb-server,
    /// php-cli and php-mysql; --kinds, --slots, --faults, --sabotage,
    /// --reuse-database, --redis and --postgres do not apply).
    #[arg(long, value_enum, default_value_t = CmsChoice::Webhook)]
    pub(crate) cms: CmsChoice,
    /// Self-test of the probe scenario's judge (with --cms probe): the CMS
    /// breaks the probe contract as the CMS of issue 38 did, answering a
    /// probe `404` while the key's publish is received and not yet applied;
    /// the run must then FAIL with applied_twice.
    #[arg(long)]
    pub(crate) cms_breaks_probe_contract: bool,
    /// Self-test of the judge: run the workers with a deliberately broken
    /// path (double-publish, replay, phantom, early, skip-gate); the run
    /// must then FAIL (exit 1) with the matching violation (doubled,
    /// replayed, phantom, early, draft_bound_twice).
    #[arg(long, value_name = "NAME")]
    pub(crate) sabotage: Option<Sabotage>,
}

/// `--cms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum CmsChoice {
    Webhook,
    Probe,
    Wordpress,
}

impl Cli {
    /// The flags that replay a run's schedule, for its last lines (the
    /// webhook scenario's full command line is printed at its start).
    pub(crate) fn replay_flags(&self, seed: u64) -> String {
        match self.cms {
            CmsChoice::Wordpress => format!(
                "--cms wordpress --seed {seed} --duration {} --workers {}",
                humantime::format_duration(self.duration),
                self.workers
            ),
            _ => format!("--seed {seed}"),
        }
    }

    /// The WordPress scenario is fixed, so the flags that shape the webhook
    /// scenario are refused.
    pub(crate) fn refuse_wordpress_flags(&self) -> Result<()> {
        for (flag, given) in [
            ("--kinds", !matches!(self.kinds, Kinds::Count(4))),
            ("--slots", self.slots.is_some()),
            ("--faults", self.faults.is_some()),
            ("--sabotage", self.sabotage.is_some()),
            (
                "--cms-breaks-probe-contract",
                self.cms_breaks_probe_contract,
            ),
            ("--reuse-database", self.reuse_database),
            ("--redis", self.redis != RedisChoice::Standalone),
            ("--postgres", self.postgres != PgChoice::Single),
        ] {
            if given {
                anyhow::bail!("{flag} does not apply to --cms wordpress (its scenario is fixed; see chaos --help)");
            }
        }
        Ok(())
    }

    /// The faults of the run: `--faults`, else the default set of its store
    /// topology (none with `--sabotage`; with `--cms probe` plus the faults
    /// only a `probe_url` CMS can take), less those the topology or the CMS
    /// cannot take (printed).
    pub(crate) fn fault_set(&self) -> FaultSet {
        let probe = self.cms == CmsChoice::Probe;
        let stores = Stores {
            redis: self.redis,
            postgres: self.postgres,
        };
        let mut faults = self.faults.clone().unwrap_or_else(|| {
            if self.sabotage.is_some() {
                FaultSet(Default::default())
            } else {
                let mut set = FaultSet::default_for(stores);
                if probe {
                    set.0
                        .extend(Fault::ALL.into_iter().filter(|f| f.needs_probe_cms()));
                }
                set
            }
        });
        let elsewhere = |f: &Fault| f.needs_wordpress() || f.needs_probe_cms() && !probe;
        let not_here: Vec<&str> = faults
            .0
            .iter()
            .filter(|f| elsewhere(f))
            .map(|f| f.name())
            .collect();
        if !not_here.is_empty() {
            println!(
                "chaos: --cms {}: left out {} (another --cms's)",
                if probe { "probe" } else { "webhook" },
                not_here.join(",")
            );
            faults.0.retain(|f| !elsewhere(f));
        }
        let left_out: Vec<&str> = faults
            .0
            .iter()
            .filter(|f| !stores.applies(**f))
            .map(|f| f.name())
            .collect();
        if !left_out.is_empty() {
            println!(
                "chaos: --redis {} --postgres {}: left out {} (needs another topology)",
                self.redis.name(),
                self.postgres.name(),
                left_out.join(",")
            );
            faults.0.retain(|f| stores.applies(*f));
        }
        faults
    }

    /// The stores, binaries and worker flags of the run's stack.
    pub(crate) fn stack_options(&self) -> StackOptions {
        StackOptions {
            database_url: self.database_url.clone(),
            redis_url: self.redis_url.clone(),
            redis: self.redis,
            postgres: self.postgres,
            reuse_database: self.reuse_database,
            prefix: self.prefix.clone(),
            dir: self.log_dir.clone(),
            planner: self.planner.clone().unwrap_or_else(|| sibling("planner")),
            // A sabotage needs the worker that can break a rule; the shipped
            // `worker` has no such flag.
            worker: self.worker.clone().unwrap_or_else(|| {
                sibling(if self.sabotage.is_some() {
                    "chaos-worker"
                } else {
                    "worker"
                })
            }),
            concurrency: self.concurrency,
            // A sabotaged worker breaks its rule on the one-delivery path.
            batch: if self.sabotage.is_some() {
                1
            } else {
                self.batch
            },
            sabotage: self.sabotage.map(|s| s.name().to_owned()),
        }
    }

    /// The command line that replays this run.
    pub(crate) fn print_replay(&self, seed: u64, slots: u32, faults: &FaultSet) {
        println!(
            "chaos: seed {seed} (replay: chaos --seed {seed} --duration {} --workers {} --kinds {} --slots {slots} --faults {}{}{}{}{})",
            humantime::format_duration(self.duration),
            self.workers,
            match &self.kinds {
                Kinds::Count(n) => n.to_string(),
                Kinds::Names(v) => v.join(","),
            },
            faults.names(),
            match self.redis {
                RedisChoice::Standalone => String::new(),
                r => format!(" --redis {}", r.name()),
            },
            match self.postgres {
                PgChoice::Single => String::new(),
                p => format!(" --postgres {}", p.name()),
            },
            self.sabotage.map_or(String::new(), |s| format!(" --sabotage {}", s.name())),
            match (self.cms == CmsChoice::Probe, self.cms_breaks_probe_contract) {
                (true, false) => " --cms probe",
                (true, true) => " --cms probe --cms-breaks-probe-contract",
                _ => "",
            }
        );
    }
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("bad duration {s:?}: {e}"))
}

/// A binary beside this one (or on the PATH).
fn sibling(name: &str) -> PathBuf {
    std::env::current_exe()
        .map(|p| testkit::process::sibling(&p, name))
        .unwrap_or_else(|_| PathBuf::from(name))
}
