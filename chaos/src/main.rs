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

//!
//! This file is the process: the runtime, the interrupt and the order of a
//! run. [`cli`] reads the flags, [`stack`] sets the system up, [`mod@run`]
//! drives the schedule and gathers the evidence, [`judge`] weighs it and
//! [`report`] prints it.

mod cli;
mod judge;
mod ledger;
mod model;
mod report;
mod run;
mod scenario;
mod stack;
mod topology;
mod webhook;

use anyhow::{Context, Result};
use clap::Parser;
use cli::{Cli, CmsChoice};
use model::Outcome;
use run::Harness;
use scenario::Scenario;
use stack::Stack;
use std::process::ExitCode;
use std::time::Duration;

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

async fn run(cli: Cli) -> Result<Outcome> {
    let seed = cli.seed.unwrap_or_else(|| {
        use rand::{Rng, SeedableRng};
        rand::rngs::StdRng::from_entropy().gen_range(1..1_000_000_000)
    });
    if cli.duration < Duration::from_secs(10) || cli.duration > Duration::from_secs(12 * 3600) {
        anyhow::bail!("--duration must be between 10s and 12h");
    }
    let (mut sc, site) = if cli.cms == CmsChoice::Wordpress {
        cli.refuse_wordpress_flags()?;
        let (sc, days) = scenario::wordpress::generate(seed, cli.duration);
        println!(
            "chaos: seed {seed} (replay: chaos {})",
            cli.replay_flags(seed)
        );
        (sc, Some(run::wordpress::Site::launch(seed, &days).await?))
    } else {
        let slots = cli
            .slots
            .unwrap_or((cli.duration.as_secs() * 5).max(20) as u32);
        let faults = cli.fault_set();
        let mut sc = Scenario::generate(seed, cli.duration, &cli.kinds, slots, &faults);
        sc.probe = cli.cms == CmsChoice::Probe;
        if cli.cms_breaks_probe_contract && !sc.probe {
            anyhow::bail!("--cms-breaks-probe-contract needs --cms probe");
        }
        sc.probe_contract_broken = cli.cms_breaks_probe_contract;
        cli.print_replay(seed, slots, &faults);
        (sc, None)
    };
    let envs: Vec<(&str, &str)> = site.iter().flat_map(|s| s.envs()).collect();
    let stack = Stack::create(cli.stack_options(), seed, &envs).await?;
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
    report::set_up(&cli, &sc, &stack);
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
    let settled = h.drive(cli.settle, cli.sabotage).await;
    let verdict = run::evidence::judge(&h, settled).await?;
    let (outcome, caught) = report::verdict(&h, &verdict, &cli);
    let passed = matches!(outcome, Outcome::Pass) || caught;
    h.stack
        .finish(passed, cli.keep, &cli.replay_flags(h.sc.seed));
    Ok(outcome)
}
