//! What a run prints around its work: the set-up (stores, kinds, the fault
//! schedule) before it starts, and at its end the judge's report, the
//! notes, the violations, the last line and (`--json`) the summary.

use crate::cli::{Cli, CmsChoice};
use crate::judge;
use crate::model::{Class, Outcome};
use crate::run::Harness;
use crate::scenario::{self, Scenario};
use crate::stack::Stack;
use chaos_sabotage::Sabotage;

/// The stores, the kinds and the fault schedule, before the run starts.
pub(crate) fn set_up(cli: &Cli, sc: &Scenario, stack: &Stack) {
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

/// Prints the judge's report, the notes, the violations, the run's last
/// line and (with `--json`) its summary; how the run ended, and whether a
/// sabotage was caught as it must be (the expected failure, whose logs
/// need not be kept).
pub(crate) fn verdict(h: &Harness, verdict: &judge::Verdict, cli: &Cli) -> (Outcome, bool) {
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
