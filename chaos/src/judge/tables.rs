//! The tables printed after a run: per fault kind (scheduled, injected,
//! verified, the deliveries it caused, the duplicates the gate blocked,
//! effects and violations among the slots it touched), per kind (expected
//! against witnessed effects and the recorded outcomes; a WordPress kind's
//! outcomes and WordPress's counts in the WordPress witness's lines), and
//! per violation class, with notes on what was explained rather than
//! broken.

use super::cms::CmsLog;
use super::slots::Tally;
use super::{Evidence, Exec, Verdict};
use crate::model::Class;
use crate::model::Fault;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::fmt::Write as _;

/// Counts the checks saw that the tables explain.
pub(super) struct Notes {
    /// Second applied calls under one key, and how many a fault in reach
    /// or a late answer explained.
    pub(super) replays: (usize, usize),
    /// Injected deliveries a wipe of the Redis prefix dropped.
    pub(super) dropped_by_wipe: usize,
}

/// The report text of a judged run.
pub(super) fn report(
    ev: &Evidence<'_>,
    v: &Verdict,
    cms: &CmsLog<'_>,
    tally: &Tally<'_>,
    by_entry: &HashMap<&str, &Exec>,
    notes: Notes,
) -> String {
    let mut out = String::new();
    faults(&mut out, ev, v, cms, by_entry);
    kinds(&mut out, ev, cms, tally);
    if let Some(w) = &v.wordpress {
        w.report(&mut out);
    }
    classes(&mut out, ev, v, cms, tally, notes);
    out
}

/// One row per fault kind, and the total.
fn faults(
    out: &mut String,
    ev: &Evidence<'_>,
    v: &Verdict,
    cms: &CmsLog<'_>,
    by_entry: &HashMap<&str, &Exec>,
) {
    let _ = writeln!(
        out,
        "\n{:<25} {:>9} {:>8} {:>8} {:>10} {:>11} {:>8} {:>10}",
        "fault",
        "scheduled",
        "injected",
        "verified",
        "deliveries",
        "dup-blocked",
        "effects",
        "violations"
    );
    let violating: BTreeSet<&str> = v
        .violations
        .iter()
        .filter_map(|x| x.slot.as_deref())
        .collect();
    for fc in &v.faults {
        let affected: HashSet<String> = if fc.fault.is_random_webhook() {
            ev.webhook_log
                .iter()
                .filter(|i| i.fault == fc.fault)
                .map(|i| i.key.trim_end_matches(":index").to_owned())
                .collect()
        } else {
            ev.faults
                .iter()
                .filter(|r| r.fault == fc.fault)
                .flat_map(|r| r.affected.iter().cloned())
                .collect()
        };
        let by_delivery = ev
            .deliveries
            .iter()
            .any(|d| d.fault == fc.fault && d.entry.is_some());
        let execs: Vec<&Exec> = if fc.fault == Fault::BackfillDup {
            ev.executions
                .iter()
                .filter(|e| e.caller == "backfill")
                .collect()
        } else if by_delivery {
            ev.deliveries
                .iter()
                .filter(|d| d.fault == fc.fault)
                .filter_map(|d| d.entry.as_deref().and_then(|id| by_entry.get(id).copied()))
                .collect()
        } else {
            ev.executions
                .iter()
                .filter(|e| affected.contains(&e.slot_key))
                .collect()
        };
        let _ = writeln!(
            out,
            "{:<25} {:>9} {:>8} {:>8} {:>10} {:>11} {:>8} {:>10}",
            fc.fault.name(),
            fc.scheduled,
            fc.injected,
            fc.verified,
            execs.len(),
            execs.iter().filter(|e| e.slot_taken()).count(),
            affected
                .iter()
                .filter(|k| cms.effects.contains_key(k.as_str())
                    || ev.ledger.published_at.contains_key(*k))
                .count(),
            affected
                .iter()
                .filter(|k| violating.contains(k.as_str()))
                .count(),
        );
    }
    let _ = writeln!(
        out,
        "{:<25} {:>9} {:>8} {:>8} {:>10} {:>11} {:>8} {:>10}",
        "all",
        v.faults.iter().map(|f| f.scheduled).sum::<usize>(),
        v.faults.iter().map(|f| f.injected).sum::<usize>(),
        v.faults.iter().map(|f| f.verified).sum::<usize>(),
        ev.executions.len(),
        ev.executions.iter().filter(|e| e.slot_taken()).count(),
        v.effects,
        v.violations.len()
    );
}

/// One row per kind: its plan, expected and witnessed effects, and the
/// outcomes slotgate recorded.
fn kinds(out: &mut String, ev: &Evidence<'_>, cms: &CmsLog<'_>, tally: &Tally<'_>) {
    if ev.kinds.iter().all(|k| k.wordpress.is_some()) {
        return;
    }
    let _ = writeln!(
        out,
        "\n{:<12} {:<16} {:>5} {:>4} {:>6} {:>8} {:>7} {:>6} | {:>9} {:>10} {:>14} {:>6}",
        "kind",
        "profile",
        "slots",
        "cap",
        "drafts",
        "expected",
        "effects",
        "calls",
        "published",
        "quota_full",
        "no_ready_draft",
        "failed"
    );
    for (i, k) in ev.kinds.iter().enumerate() {
        if k.wordpress.is_some() {
            continue;
        }
        let keys: Vec<&String> = ev
            .plan
            .iter()
            .filter(|(_, ki)| **ki == i)
            .map(|(k, _)| k)
            .collect();
        let count_state = |state: &str, reason: Option<&str>| {
            keys.iter()
                .filter(|key| {
                    ev.rows.get(key.as_str()).is_some_and(|r| {
                        r.state == state && (reason.is_none() || r.reason.as_deref() == reason)
                    })
                })
                .count()
        };
        let calls: usize = keys
            .iter()
            .map(|key| cms.calls("/publish", key).map_or(0, <[_]>::len))
            .sum();
        let profile = format!("{}{}", k.profile, if k.record_only { " (r-o)" } else { "" });
        let _ = writeln!(
            out,
            "{:<12} {:<16} {:>5} {:>4} {:>6} {:>8} {:>7} {:>6} | {:>9} {:>10} {:>14} {:>6}",
            k.name,
            profile,
            k.offsets.len(),
            k.daily_cap,
            k.drafts,
            k.expected_effects(),
            tally.effects_by_kind.get(k.name.as_str()).unwrap_or(&0),
            calls,
            count_state("published", None),
            count_state("skipped", Some("quota_full")),
            count_state("skipped", Some("no_ready_draft")),
            count_state("failed", None),
        );
    }
}

/// Violations by class, and the notes on what was explained.
fn classes(
    out: &mut String,
    ev: &Evidence<'_>,
    v: &Verdict,
    cms: &CmsLog<'_>,
    tally: &Tally<'_>,
    notes: Notes,
) {
    let _ = writeln!(
        out,
        "\nviolation classes (effects judged from the CMS log, the ledger{}):",
        if v.wordpress.is_some() {
            " and WordPress's records"
        } else {
            ""
        }
    );
    for c in Class::ALL {
        let n = v.count(c);
        let _ = writeln!(
            out,
            "  {:<4} {:<19} {n}",
            if n == 0 { "ok" } else { "FAIL" },
            c.name()
        );
    }
    let (replays, explained) = notes.replays;
    let _ = writeln!(
        out,
        "  note: {} raw CMS calls, {} publish + {} index keys, {replays} second applied calls ({explained} explained by a fault in reach or a late answer)",
        ev.calls.len(),
        cms.effects.len(),
        cms.index_effects.len()
    );
    if ev.probe {
        let applied: usize = cms
            .calls_by
            .iter()
            .filter(|((p, _), _)| *p == "/publish")
            .map(|(_, cs)| cs.iter().filter(|c| c.applied()).count())
            .sum();
        let slot_probes: Vec<&testkit::cms::Call> = cms
            .probes
            .iter()
            .filter(|(k, _)| ev.plan.contains_key(**k))
            .flat_map(|(_, ps)| ps.iter().copied())
            .collect();
        let answered = |s: u16| slot_probes.iter().filter(|c| c.status == Some(s)).count();
        let found = ev
            .executions
            .iter()
            .filter(|e| e.detail.get("found_applied") == Some(&serde_json::Value::Bool(true)))
            .count();
        let _ = writeln!(
            out,
            "  note: probe CMS: {applied} publish POSTs applied under {} keys; {} probes of slot keys answered 409 ×{}, 200 ×{}, 404 ×{}; {found} execution(s) found the publish applied by a probe and sent nothing",
            cms.effects.len(),
            slot_probes.len(),
            answered(409),
            answered(200),
            answered(404)
        );
    }
    if notes.dropped_by_wipe > 0 {
        let _ = writeln!(out, "  note: {} injected deliveries were still queued when the Redis prefix was wiped (Redis is transport; their slots were finished by the planned path)", notes.dropped_by_wipe);
    }
    if tally.index_errors > 0 {
        let _ = writeln!(
            out,
            "  note: {} published slot(s) recorded index_error",
            tally.index_errors
        );
    }
    if !tally.failed_slots.is_empty() {
        let _ = writeln!(
            out,
            "  note: {} slot(s) ended failed: {}",
            tally.failed_slots.len(),
            sample(&tally.failed_slots)
        );
    }
}

/// The first five of a list, and how many more.
fn sample(v: &[String]) -> String {
    let mut s = v.iter().take(5).cloned().collect::<Vec<_>>().join("; ");
    if v.len() > 5 {
        let _ = write!(s, "; … {} more", v.len() - 5);
    }
    s
}
