//! The deliveries the harness added (duplicates, malformed entries,
//! deliveries for a day that has not come), what the run left behind, and
//! the dead letters: each injected delivery handled as its [`Expect`]
//! says, nothing pending at the end, a dead letter only for a malformed
//! delivery.

use super::{Evidence, Exec, Verdict};
use crate::model::{Class, Delivery, Expect};
use std::collections::{HashMap, HashSet};
use std::time::Instant;

/// `delivery`: duplicates recorded `slot_taken`, each injected delivery
/// handled as expected, no execution for a slot nobody planned or
/// injected. Returns the injected deliveries a wipe dropped before they
/// were handled, for the report.
pub(super) fn injected(
    ev: &Evidence<'_>,
    by_slot: &HashMap<&str, Vec<&Exec>>,
    by_entry: &HashMap<&str, &Exec>,
    v: &mut Verdict,
) -> usize {
    let planned_execs: Vec<&Exec> = ev
        .executions
        .iter()
        .filter(|e| ev.plan.contains_key(&e.slot_key))
        .collect();
    let handled_dups = planned_execs.len().saturating_sub(
        ev.plan
            .keys()
            .filter(|k| by_slot.contains_key(k.as_str()))
            .count(),
    );
    let slot_taken = planned_execs.iter().filter(|e| e.duplicate(ev)).count();
    if handled_dups != slot_taken {
        v.add(
            Class::Delivery,
            None,
            format!("{handled_dups} handled duplicate deliveries, but {slot_taken} recorded skipped/slot_taken"),
        );
    }
    let mut dropped_by_wipe = 0;
    for d in &ev.deliveries {
        let Some(id) = d.entry.as_deref() else {
            continue;
        };
        let what = format!(
            "{} {id} ({})",
            d.fault.name(),
            d.slot.as_deref().unwrap_or("-")
        );
        match (by_entry.get(id), d.expect) {
            (_, Expect::Unjudged) => {}
            (None, _) if wiped_after(ev, d.at) => dropped_by_wipe += 1,
            (None, _) => v.add(
                Class::Delivery,
                d.slot.as_deref(),
                format!("{what} was never handled"),
            ),
            (Some(e), Expect::Taken) if !e.duplicate(ev) => v.add(
                Class::Delivery,
                d.slot.as_deref(),
                format!(
                    "{what}, a duplicate of a finished slot, recorded {}",
                    e.label()
                ),
            ),
            (Some(e), Expect::Dead(r)) if !e.is("failed", r) => v.add(
                Class::Delivery,
                d.slot.as_deref(),
                format!("{what} recorded {}, expected failed/{r}", e.label()),
            ),
            (Some(e), Expect::NotDue) if !e.is("skipped", "not_due") => v.add(
                Class::Delivery,
                d.slot.as_deref(),
                format!(
                    "{what}, a delivery for a day that has not come, recorded {}",
                    e.label()
                ),
            ),
            _ => {}
        }
    }
    let injected_entry = |e: &Exec| {
        ev.deliveries.iter().any(|d| {
            d.entry.is_some()
                && d.entry == e.entry_id
                && d.expect != Expect::Taken
                && d.expect != Expect::Any
        })
    };
    for e in ev
        .executions
        .iter()
        .filter(|e| !ev.plan.contains_key(&e.slot_key))
    {
        if !injected_entry(e) {
            v.add(
                Class::Delivery,
                None,
                format!(
                    "an execution for a slot that was never planned: {:?} {} ({})",
                    e.slot_key,
                    e.label(),
                    e.caller
                ),
            );
        }
    }
    dropped_by_wipe
}

/// Whether the Redis prefix was wiped at or after `at` (an entry added
/// before a wipe may be gone with it: Redis is transport).
fn wiped_after(ev: &Evidence<'_>, at: Instant) -> bool {
    ev.wipes.iter().any(|w| *w >= at)
}

/// `pending`: nothing left in Redis, no open claim, no draft left
/// `publishing`, no CMS call in flight.
pub(super) fn nothing_pending(ev: &Evidence<'_>, v: &mut Verdict) {
    let (ready, pending, delayed) = ev.residue;
    let open_rows = ev
        .rows
        .values()
        .filter(|r| !matches!(r.state.as_str(), "published" | "skipped" | "failed"))
        .count();
    let pending_ok = ready == 0
        && pending == 0
        && delayed == 0
        && open_rows == 0
        && ev.drafts_publishing == 0
        && ev.cms_in_flight == 0;
    if !pending_ok {
        v.add(
            Class::Pending,
            None,
            format!("left pending: stream {ready} ({pending} unacknowledged), delayed {delayed}, open gate rows {open_rows}, drafts publishing {}, CMS calls in flight {}", ev.drafts_publishing, ev.cms_in_flight),
        );
    }
}

/// `dead_letter`: every dead letter explained by a malformed delivery the
/// harness injected (with its reason) or by a delivery of a slot a schedule
/// edit removed, every injected malformed delivery dead-lettered unless a
/// wipe took it, and no dead-lettering outcome nobody injected.
pub(super) fn dead_letters(ev: &Evidence<'_>, by_entry: &HashMap<&str, &Exec>, v: &mut Verdict) {
    let expect_dead: HashMap<&str, (&Delivery, &'static str)> = ev
        .deliveries
        .iter()
        .filter_map(|d| match d.expect {
            Expect::Dead(r) => d.entry.as_deref().map(|id| (id, (d, r))),
            _ => None,
        })
        .collect();
    let mut dead_seen = HashSet::new();
    for f in ev.dead.iter().chain(ev.dead_seen.iter()) {
        let id = f.get("entry_id").map(String::as_str).unwrap_or("");
        let reason = f.get("reason").map(String::as_str).unwrap_or("");
        match expect_dead.get(id) {
            Some((_, r)) if *r == reason => {
                dead_seen.insert(id.to_owned());
            }
            _ if by_entry.get(id).is_some_and(|e| e.retired_duplicate(ev)) => {}
            _ => v.add(
                Class::DeadLetter,
                None,
                format!("a dead letter no injected delivery explains: {f:?}"),
            ),
        }
    }
    for (id, (d, _)) in &expect_dead {
        if !dead_seen.contains(*id) && !wiped_after(ev, d.at) {
            v.add(
                Class::DeadLetter,
                d.slot.as_deref(),
                format!(
                    "{} delivery {id} ({}) is not in the dead letters",
                    d.fault.name(),
                    d.slot.as_deref().unwrap_or("no slot")
                ),
            );
        }
    }
    for e in ev.executions.iter().filter(|e| {
        !e.retired_duplicate(ev)
            && e.outcome == "failed"
            && matches!(
                e.reason.as_deref(),
                Some("bad_message" | "unknown_kind" | "unknown_slot" | "max_deliveries")
            )
            && !e
                .entry_id
                .as_deref()
                .is_some_and(|id| expect_dead.contains_key(id))
    }) {
        v.add(
            Class::DeadLetter,
            Some(&e.slot_key),
            format!(
                "a dead-lettered delivery nobody injected as malformed: {} {} ({})",
                e.slot_key,
                e.label(),
                e.caller
            ),
        );
    }
}
