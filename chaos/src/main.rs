//! `chaos`: proves slotgate's exactly-once effects under seeded faults.
//!
//! Runs the real `planner` and several real `worker` processes against
//! Postgres and Redis (a database and a key prefix of the run's own) and a
//! stand-in CMS owned by this process (or, with `--cms wordpress`, a real
//! throwaway WordPress), injects a seeded schedule of faults over a
//! compressed day — each fault verified to have happened — waits until
//! everything settled, and judges the result against the outside world:
//! the CMS's timestamped call log, the harness's own ledger of Postgres
//! changes and WordPress's own records (see `judge` for the violation
//! classes). One run loop (`run`), one judge, one report, whatever the CMS.
//! Exit status: 0 all invariants hold, 1 a violation, 2 the run could not be
//! set up or a scheduled fault could not be injected and verified.

mod judge;
mod ledger;
mod model;
mod run;
mod scenario;
mod stack;
mod topology;
mod webhook;

use anyhow::{Context, Result};
use chaos_sabotage::Sabotage;
use clap::Parser;
use judge::{Evidence, Exec, GateRow};
use model::{Class, Fault, Outcome};
use run::Harness;
use scenario::{FaultSet, Kinds, Scenario};
use stack::{Stack, StackOptions};
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};
use topology::{PgChoice, RedisChoice, Stores};

#[derive(Parser, Debug)]
#[command(
    name = "chaos",
    version,
    about = "slotgate chaos suite: real planner and workers under seeded faults, judged by an independent CMS ledger"
)]
struct Cli {
    /// Seed of the scenario and the fault schedule (default: random; printed).
    #[arg(long)]
    seed: Option<u64>,
    /// Length of the compressed day (slots are spread over it).
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    duration: Duration,
    /// Worker processes.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=32))]
    workers: u32,
    /// Deliveries in flight per worker.
    #[arg(long, default_value_t = 4)]
    concurrency: u32,
    /// `worker --batch`: deliveries of a backlog taken through the gate at once.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=1000))]
    batch: u32,
    /// Fault kinds: `default`, `all`, `none` or names, comma-separated
    /// (`default,poison-entry`). The default is every kind. With
    /// --sabotage: none.
    #[arg(long)]
    faults: Option<FaultSet>,
    /// Print one JSON object with the verdict at the end (after the table).
    #[arg(long)]
    json: bool,
    /// Kinds: a number, or comma-separated names.
    #[arg(long, default_value = "4")]
    kinds: Kinds,
    /// Planned slots in all (default: 5 per second of --duration).
    #[arg(long)]
    slots: Option<u32>,
    /// How long to wait for everything to settle after the window.
    #[arg(long, default_value = "90s", value_parser = parse_duration)]
    settle: Duration,
    /// The planner binary (default: next to this one).
    #[arg(long)]
    planner: Option<PathBuf>,
    /// The worker binary (default: `worker` next to this one; with
    /// --sabotage, `chaos-worker`, which accepts it).
    #[arg(long)]
    worker: Option<PathBuf>,
    /// Postgres server; a fresh database is created on it (and dropped).
    /// Unused with --postgres pair.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true, default_value = testkit::DEFAULT_DATABASE_URL)]
    database_url: String,
    /// Redis server; a fresh key prefix is used on it (and deleted).
    /// Unused with --redis cluster or sentinel.
    #[arg(long, env = "REDIS_URL", hide_env_values = true, default_value = testkit::DEFAULT_REDIS_URL)]
    redis_url: String,
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
    redis: RedisChoice,
    /// The Postgres topology: `single` (the server of DATABASE_URL) or
    /// `pair` (a primary with a synchronous streaming standby, started and
    /// stopped by the run from Debian's postgresql; every process reaches
    /// it through one proxy address; adds the fault kind pg-failover, once
    /// a run: kill -9 of the primary, the standby promoted, the address
    /// moved to it).
    #[arg(long, value_enum, default_value_t = PgChoice::Single)]
    postgres: PgChoice,
    /// Use the database named in DATABASE_URL as is (dedicated to chaos
    /// runs; migrated, never dropped) instead of creating one.
    #[arg(long)]
    reuse_database: bool,
    /// Redis key prefix (default: `chaos-<seed>-<random>`).
    #[arg(long)]
    prefix: Option<String>,
    /// Where the config, drafts and worker logs go (default: a temp dir).
    #[arg(long)]
    log_dir: Option<PathBuf>,
    /// Keep the database, the prefix and the logs (a Cluster, Sentinel
    /// set-up or Postgres pair of the run's own is stopped and removed
    /// anyway, with its data).
    #[arg(long)]
    keep: bool,
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
    cms: CmsChoice,
    /// Self-test of the probe scenario's judge (with --cms probe): the CMS
    /// breaks the probe contract as the CMS of issue 38 did, answering a
    /// probe `404` while the key's publish is received and not yet applied;
    /// the run must then FAIL with applied_twice.
    #[arg(long)]
    cms_breaks_probe_contract: bool,
    /// Self-test of the judge: run the workers with a deliberately broken
    /// path (double-publish, replay, phantom, early, skip-gate); the run
    /// must then FAIL (exit 1) with the matching violation (doubled,
    /// replayed, phantom, early, draft_bound_twice).
    #[arg(long, value_name = "NAME")]
    sabotage: Option<Sabotage>,
}

/// `--cms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum CmsChoice {
    Webhook,
    Probe,
    Wordpress,
}

/// The violation class a sabotage must produce.
fn sabotage_class(s: Sabotage) -> Class {
    match s {
        Sabotage::DoublePublish => Class::Doubled,
        Sabotage::Replay => Class::Replayed,
        Sabotage::Phantom => Class::Phantom,
        Sabotage::Early => Class::Early,
        Sabotage::SkipGate => Class::DraftBoundTwice,
    }
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("bad duration {s:?}: {e}"))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let ended = rt.block_on(async {
        tokio::select! {
            r = run(cli) => Some(r),
            _ = interrupted() => None,
        }
    });
    // Dropping the runtime drops every task, and with them the worker and
    // planner processes (each is killed when its handle drops): an
    // interrupted harness leaves no workers behind.
    drop(rt);
    let Some(ended) = ended else {
        eprintln!("chaos: interrupted; workers stopped, database and prefix kept, verdict none");
        return ExitCode::from(130);
    };
    match ended {
        Ok(Outcome::Pass) => ExitCode::SUCCESS,
        Ok(Outcome::Fail) => ExitCode::from(1),
        Ok(Outcome::NotInjected) => ExitCode::from(2),
        Err(e) => {
            eprintln!("chaos: error: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// SIGINT or SIGTERM.
async fn interrupted() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

fn sibling(name: &str) -> PathBuf {
    std::env::current_exe()
        .map(|p| testkit::process::sibling(&p, name))
        .unwrap_or_else(|_| PathBuf::from(name))
}

async fn run(cli: Cli) -> Result<Outcome> {
    let seed = cli.seed.unwrap_or_else(|| {
        use rand::{Rng, SeedableRng};
        rand::rngs::StdRng::from_entropy().gen_range(1..1_000_000_000)
    });
    if cli.duration < Duration::from_secs(10) || cli.duration > Duration::from_secs(12 * 3600) {
        anyhow::bail!("--duration must be between 10s and 12h");
    }
    let (mut sc, site) = if cli.cms == CmsChoice::Wordpress {
        refuse_wordpress_flags(&cli)?;
        let (sc, days) = scenario::wordpress::generate(seed, cli.duration);
        println!(
            "chaos: seed {seed} (replay: chaos {})",
            replay_flags(&cli, seed)
        );
        (sc, Some(run::wordpress::Site::launch(seed, &days).await?))
    } else {
        let slots = cli
            .slots
            .unwrap_or((cli.duration.as_secs() * 5).max(20) as u32);
        let faults = fault_set(&cli);
        let mut sc = Scenario::generate(seed, cli.duration, &cli.kinds, slots, &faults);
        sc.probe = cli.cms == CmsChoice::Probe;
        if cli.cms_breaks_probe_contract && !sc.probe {
            anyhow::bail!("--cms-breaks-probe-contract needs --cms probe");
        }
        sc.probe_contract_broken = cli.cms_breaks_probe_contract;
        print_replay(&cli, seed, slots, &faults);
        (sc, None)
    };
    let envs: Vec<(&str, &str)> = site.iter().flat_map(|s| s.envs()).collect();
    let stack = Stack::create(stack_options(&cli), seed, &envs).await?;
    if cli.reuse_database {
        // Slots are unique per kind and day: a reused database needs kind
        // names of this run's own.
        let tag = stack
            .kit
            .redis
            .prefix
            .rsplit('-')
            .next()
            .unwrap_or("r")
            .to_owned();
        for k in &mut sc.kinds {
            k.name = format!("c{tag}-{}", k.name);
        }
    }
    print_set_up(&cli, &sc, &stack);
    let h = match Harness::start(sc, stack, cli.workers as usize, site).await {
        Ok(h) => h,
        Err(e) => return Err(e).context("setting the run up"),
    };
    h.log(format!(
        "planned {} slots for {} (zone {}); {} workers started",
        h.plan.len(),
        h.stack.day,
        h.stack.zone,
        cli.workers
    ));
    let settled = drive(&h, &cli).await;
    let verdict = judge_run(&h, settled).await?;
    let (outcome, caught) = report(&h, &verdict, &cli);
    let passed = matches!(outcome, Outcome::Pass) || caught;
    h.stack
        .finish(passed, cli.keep, &replay_flags(&cli, h.sc.seed));
    Ok(outcome)
}

/// The flags that replay a run's schedule, for its last lines (the
/// webhook scenario's full command line is printed at its start).
fn replay_flags(cli: &Cli, seed: u64) -> String {
    match cli.cms {
        CmsChoice::Wordpress => format!(
            "--cms wordpress --seed {seed} --duration {} --workers {}",
            humantime::format_duration(cli.duration),
            cli.workers
        ),
        _ => format!("--seed {seed}"),
    }
}

/// The WordPress scenario is fixed, so the flags that shape the webhook
/// scenario are refused.
fn refuse_wordpress_flags(cli: &Cli) -> Result<()> {
    for (flag, given) in [
        ("--kinds", !matches!(cli.kinds, Kinds::Count(4))),
        ("--slots", cli.slots.is_some()),
        ("--faults", cli.faults.is_some()),
        ("--sabotage", cli.sabotage.is_some()),
        ("--cms-breaks-probe-contract", cli.cms_breaks_probe_contract),
        ("--reuse-database", cli.reuse_database),
        ("--redis", cli.redis != RedisChoice::Standalone),
        ("--postgres", cli.postgres != PgChoice::Single),
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
fn fault_set(cli: &Cli) -> FaultSet {
    let probe = cli.cms == CmsChoice::Probe;
    let stores = Stores {
        redis: cli.redis,
        postgres: cli.postgres,
    };
    let mut faults = cli.faults.clone().unwrap_or_else(|| {
        if cli.sabotage.is_some() {
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
            cli.redis.name(),
            cli.postgres.name(),
            left_out.join(",")
        );
        faults.0.retain(|f| stores.applies(*f));
    }
    faults
}

/// The stores, binaries and worker flags of the run's stack.
fn stack_options(cli: &Cli) -> StackOptions {
    StackOptions {
        database_url: cli.database_url.clone(),
        redis_url: cli.redis_url.clone(),
        redis: cli.redis,
        postgres: cli.postgres,
        reuse_database: cli.reuse_database,
        prefix: cli.prefix.clone(),
        dir: cli.log_dir.clone(),
        planner: cli.planner.clone().unwrap_or_else(|| sibling("planner")),
        // A sabotage needs the worker that can break a rule; the shipped
        // `worker` has no such flag.
        worker: cli.worker.clone().unwrap_or_else(|| {
            sibling(if cli.sabotage.is_some() {
                "chaos-worker"
            } else {
                "worker"
            })
        }),
        concurrency: cli.concurrency,
        // A sabotaged worker breaks its rule on the one-delivery path.
        batch: if cli.sabotage.is_some() { 1 } else { cli.batch },
        sabotage: cli.sabotage.map(|s| s.name().to_owned()),
    }
}

/// The command line that replays this run.
fn print_replay(cli: &Cli, seed: u64, slots: u32, faults: &FaultSet) {
    println!(
        "chaos: seed {seed} (replay: chaos --seed {seed} --duration {} --workers {} --kinds {} --slots {slots} --faults {}{}{}{}{})",
        humantime::format_duration(cli.duration),
        cli.workers,
        match &cli.kinds {
            Kinds::Count(n) => n.to_string(),
            Kinds::Names(v) => v.join(","),
        },
        faults.names(),
        match cli.redis {
            RedisChoice::Standalone => String::new(),
            r => format!(" --redis {}", r.name()),
        },
        match cli.postgres {
            PgChoice::Single => String::new(),
            p => format!(" --postgres {}", p.name()),
        },
        cli.sabotage.map_or(String::new(), |s| format!(" --sabotage {}", s.name())),
        match (cli.cms == CmsChoice::Probe, cli.cms_breaks_probe_contract) {
            (true, false) => " --cms probe",
            (true, true) => " --cms probe --cms-breaks-probe-contract",
            _ => "",
        }
    );
}

/// The stores, the kinds and the fault schedule, before the run starts.
fn print_set_up(cli: &Cli, sc: &Scenario, stack: &Stack) {
    println!(
        "chaos: {} slots in {} kinds over {}, {} workers; database {} (Postgres {}), Redis prefix {} ({}, {} partition(s)), logs in {}",
        sc.slots(),
        sc.kinds.len(),
        humantime::format_duration(cli.duration),
        cli.workers,
        stack.db_name,
        cli.postgres.name(),
        stack.kit.redis.prefix,
        cli.redis.name(),
        stack.keys.partitions(),
        stack.kit.dir.display()
    );
    for k in &sc.kinds {
        let burst = k.offsets.iter().filter(|o| **o == k.burst_at).count();
        let burst = match k.wordpress {
            None => format!("; {burst} due at once at +{} s", k.burst_at),
            Some(_) => String::new(),
        };
        println!(
            "  kind {:<12} {:>4} slots, daily_cap {:>4}, drafts {:>4} ({}{}{burst})",
            k.name,
            k.offsets.len(),
            k.daily_cap,
            k.drafts,
            k.profile,
            if k.record_only {
                ", record-only"
            } else if k.index {
                ""
            } else {
                ", no index push"
            },
        );
    }
    if sc.probe_contract_broken {
        println!(
            "  CMS: the stand-in BREAKING the probe contract (--cms-breaks-probe-contract): a probe_url on every webhook kind (http_attempts {}), a probe answered 404 until the key's publish is applied; publishes not deduplicated. The run must fail with applied_twice",
            scenario::PROBE_HTTP_ATTEMPTS
        );
    } else if sc.probe {
        println!(
            "  CMS: the stand-in following the probe contract: a probe_url on every webhook kind (http_attempts {}), each publish recorded on receipt and applied {} ms later, probes answered 409 meanwhile; publishes not deduplicated (a key applied twice is a violation)",
            scenario::PROBE_HTTP_ATTEMPTS,
            scenario::PROBE_APPLY_AFTER_MS
        );
    }
    println!("schedule (seconds after the first slot time; ~ = relative to a slot's time):");
    print!("{}", sc.render_schedule());
}

/// Runs the schedule, lets the system settle, stops the workers and
/// waits for calls still at the CMS; whether it settled.
async fn drive(h: &std::sync::Arc<Harness>, cli: &Cli) -> bool {
    let window_end = h.t0 + h.sc.duration;
    let deadline = window_end + cli.settle;
    if cli.sabotage == Some(Sabotage::SkipGate) {
        let s = h.clone();
        tokio::spawn(async move {
            if let Err(e) = run::duplicate::sabotage(&s).await {
                s.log(format!("sabotage duplicates failed: {e:#}"));
            }
        });
    }
    h.run_schedule(deadline).await;
    h.log("schedule done; waiting for the system to settle");
    let settled = h
        .settle(deadline.max(Instant::now() + Duration::from_secs(5)))
        .await;
    h.log(if settled {
        "settled; stopping workers"
    } else {
        "stopping workers"
    });
    h.stop_workers().await;
    // Calls answered late (held or slow) land before the ledger is read.
    let t = Instant::now();
    while h.stack.cms.in_flight() > 0 && t.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    settled
}

/// Prints the judge's report, the notes, the violations, the run's last
/// line and (with `--json`) its summary; how the run ended, and whether a
/// sabotage was caught as it must be (the expected failure, whose logs
/// need not be kept).
fn report(h: &Harness, verdict: &judge::Verdict, cli: &Cli) -> (Outcome, bool) {
    print!("{}", verdict.report);
    {
        let notes = &h.records.lock().unwrap().notes;
        if !notes.is_empty() {
            println!("\nnotes:");
            for n in notes {
                println!("  {n}");
            }
        }
    }
    if !verdict.violations.is_empty() {
        println!("\nviolations:");
        for v in &verdict.violations {
            println!("  {v}");
        }
    }
    let injected = verdict.all_injected();
    let outcome = Outcome::of(injected, verdict.pass());
    outcome.print_line(h.sc.seed, &verdict.headline(), verdict.violations.len());
    if !injected {
        for f in verdict
            .faults
            .iter()
            .filter(|f| f.injected < f.scheduled || f.verified < f.scheduled)
        {
            println!(
                "chaos: could not inject {}: {} scheduled, {} injected, {} verified (see the notes)",
                f.fault.name(),
                f.scheduled,
                f.injected,
                f.verified
            );
        }
    }
    let mut caught = false;
    if let Some(s) = cli.sabotage {
        let class = sabotage_class(s);
        caught = verdict.count(class) > 0;
        println!(
            "chaos: sabotage {} must show {}: {} found",
            s.name(),
            class.name(),
            verdict.count(class)
        );
    }
    if cli.json {
        let mut j = verdict.json(h.sc.seed, h.sc.duration, h.plan.len());
        j["cms"] = match cli.cms {
            CmsChoice::Webhook => "webhook",
            CmsChoice::Probe => "probe",
            CmsChoice::Wordpress => "wordpress",
        }
        .into();
        println!("{j}");
    }
    (outcome, caught)
}

async fn judge_run(h: &Harness, settled: bool) -> Result<judge::Verdict> {
    if let Some(site) = &h.site {
        run::wordpress::verify(h, site).await?;
    }
    let pool = &h.stack.kit.pool;
    let executions: Vec<Exec> = sqlx::query_as::<
        _,
        (
            String,
            String,
            Option<String>,
            String,
            Option<String>,
            serde_json::Value,
        ),
    >(
        "SELECT slot_key, caller, entry_id, outcome, reason, detail FROM execution WHERE id > $1 ORDER BY id",
    )
    .bind(h.exec_floor)
    .fetch_all(pool)
    .await
    .context("reading executions")?
    .into_iter()
    .map(
        |(slot_key, caller, entry_id, outcome, reason, detail)| Exec {
            slot_key,
            caller,
            entry_id,
            outcome,
            reason,
            detail,
        },
    )
    .collect();
    let rows: HashMap<String, GateRow> =
        sqlx::query_as::<_, (String, String, i32, String, Option<String>, Option<i64>)>(
            "SELECT kind, day::text, slot, state, reason, post_id FROM publish_slot WHERE kind = ANY($1)",
        )
        .bind(&h.kind_names)
        .fetch_all(pool)
        .await
        .context("reading gate rows")?
        .into_iter()
        .map(|(k, d, s, state, reason, post_id)| {
            (
                format!("{k}:{d}:{s}"),
                GateRow {
                    state,
                    reason,
                    post_id,
                },
            )
        })
        .collect();
    let ready_left: HashMap<String, i64> = sqlx::query_as::<_, (String, i64)>(
        "SELECT kind, count(*) FROM draft WHERE status = 'ready' AND kind = ANY($1) GROUP BY kind",
    )
    .bind(&h.kind_names)
    .fetch_all(pool)
    .await?
    .into_iter()
    .collect();
    let events = ledger::read(pool, h.ledger_floor).await?;
    let names: HashSet<&str> = h.kind_names.iter().map(String::as_str).collect();
    let (facts, mut found) = ledger::judge(&events, &names);
    let drafts_publishing: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM draft WHERE status = 'publishing' AND kind = ANY($1)",
    )
    .bind(&h.kind_names)
    .fetch_one(pool)
    .await?;
    let residue = h.stack.residue().await?;
    let dead: Vec<HashMap<String, String>> = h
        .stack
        .dead_letters()
        .await?
        .iter()
        .map(|id| run::stream_fields(&id.map))
        .collect();
    let kind_index: HashMap<&str, usize> =
        h.sc.kinds
            .iter()
            .enumerate()
            .map(|(i, k)| (k.name.as_str(), i))
            .collect();
    let planned = h.planned();
    let plan = planned
        .iter()
        .map(|p| (p.slot.clone(), kind_index[p.kind.as_str()]))
        .collect();
    let (faults, deliveries, wipes, dead_seen) = {
        let r = h.records.lock().unwrap();
        found.extend(r.found.iter().cloned());
        (
            r.faults.clone(),
            r.deliveries.clone(),
            r.wipes.clone(),
            r.dead_seen.clone(),
        )
    };
    let ev = Evidence {
        kinds: &h.sc.kinds,
        plan,
        due: planned.iter().map(|p| (p.slot.clone(), p.due_at)).collect(),
        executions,
        rows,
        drafts_publishing,
        ready_left,
        calls: h.stack.cms.calls(),
        http_timeout: Duration::from_millis(scenario::HTTP_TIMEOUT_MS),
        probe: h.sc.probe,
        webhook_log: h.webhook.log(),
        scheduled: h.sc.events.iter().map(|e| e.fault()).collect(),
        faults,
        deliveries,
        wipes,
        residue,
        cms_in_flight: h.stack.cms.in_flight(),
        dead,
        dead_seen,
        settled,
        ledger: facts,
        found,
        wordpress: match &h.site {
            Some(site) => Some(site.witness(h).await?),
            None => None,
        },
    };
    Ok(judge::judge(&ev))
}
