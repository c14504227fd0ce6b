//! Slot by slot, then kind by kind: each planned slot's gate row and
//! executions against its witness (the CMS's log for webhook kinds, the
//! ledger for record-only ones), then each kind's effects against its cap,
//! its drafts and its quota row. A WordPress kind's effects are the
//! WordPress witness's ([`super::wordpress`]); here its slots get only the
//! checks every slot gets: an outcome, and exactly one.

use super::cms::CmsLog;
use super::{answer_time, draft_id, kind_of_key, utc, Evidence, Exec, GateRow, Verdict};
use crate::model::Class;
use crate::scenario::KindSpec;
use serde_json::Value;
use std::collections::{BTreeSet, HashMap};
use std::time::Duration;
use testkit::cms::Call;

/// What the slot-by-slot pass counted, for the kind checks and the report.
#[derive(Default)]
pub(super) struct Tally<'a> {
    /// Per kind: units of the cap in use (published + failed).
    pub(super) used: HashMap<&'a str, i64>,
    /// Slots that never reached an outcome.
    pub(super) lost_slots: usize,
    /// Published slots without an index push or a recorded `index_error`.
    pub(super) index_lost: usize,
    /// Published slots that recorded `index_error`.
    pub(super) index_errors: usize,
    /// Slots that ended failed, described for the report.
    pub(super) failed_slots: Vec<String>,
    /// Per kind: slots that ended failed because the CMS refused them (a
    /// non-2xx answer under the key and no effect): each used a slot, a
    /// unit of the cap and a draft, so one effect fewer is due.
    pub(super) refused_by_kind: HashMap<&'a str, u32>,
    /// Per kind: effects witnessed.
    pub(super) effects_by_kind: HashMap<&'a str, u32>,
}

/// Units of the cap each kind used (published + failed gate rows).
fn cap_used<'a>(ev: &'a Evidence<'_>) -> HashMap<&'a str, i64> {
    let mut used: HashMap<&str, i64> = HashMap::new();
    for key in ev.plan.keys() {
        if let Some(r) = ev.rows.get(key) {
            if r.state == "published" || r.state == "failed" {
                *used.entry(kind_of_key(key)).or_default() += 1;
            }
        }
    }
    used
}

/// One planned slot as the checks see it.
struct Slot<'a> {
    key: &'a str,
    kind: &'a KindSpec,
    /// Its gate row, if slotgate wrote one.
    row: Option<&'a GateRow>,
    /// The CMS's applied publish calls under its key, in arrival order.
    publishes: Vec<&'a Call>,
}

impl Slot<'_> {
    fn state(&self) -> Option<&str> {
        self.row.map(|r| r.state.as_str())
    }
}

/// Every planned slot: its effect, when it happened, which draft it
/// carried, its recorded state and reason, and its one outcome.
pub(super) fn each_slot<'a>(
    ev: &'a Evidence<'_>,
    cms: &CmsLog<'a>,
    by_slot: &HashMap<&str, Vec<&Exec>>,
    v: &mut Verdict,
) -> Tally<'a> {
    let mut t = Tally {
        used: cap_used(ev),
        ..Tally::default()
    };
    for (key, ki) in &ev.plan {
        let s = Slot {
            key,
            kind: &ev.kinds[*ki],
            row: ev.rows.get(key),
            publishes: cms.applied("/publish", key),
        };
        if s.kind.wordpress.is_some() {
            if !matches!(s.state(), Some("published" | "skipped" | "failed")) {
                no_outcome(&s, &mut t, v);
            }
        } else {
            effect_and_timing(ev, &s, &mut t, v);
            same_draft(cms, &s, v);
            recorded_state(ev, cms, &s, by_slot, &mut t, v);
            skip_reason(ev, &s, &t, v);
        }
        one_outcome(ev, &s, by_slot, v);
    }
    t
}

/// Counts the slot's effect by its kind's witness; `unexpected` for a
/// record-only slot sent to the CMS; `early` for an effect more than 1 s
/// before the slot was due.
fn effect_and_timing<'a>(ev: &Evidence<'_>, s: &Slot<'a>, t: &mut Tally<'a>, v: &mut Verdict) {
    let (key, kind, publishes, state) = (s.key, s.kind, &s.publishes, s.state());
    if kind.record_only {
        if state == Some("published") {
            *t.effects_by_kind.entry(kind.name.as_str()).or_default() += 1;
        }
        if let Some(c) = publishes.first() {
            v.add(
                Class::Unexpected,
                Some(key),
                format!("record-only {key} was sent to the CMS at {}", utc(c.at)),
            );
        }
    } else if !publishes.is_empty() {
        *t.effects_by_kind.entry(kind.name.as_str()).or_default() += 1;
    }
    // When the effect happened, by the witness of its kind.
    let effect_at = if kind.record_only {
        ev.ledger.published_at.get(key).copied()
    } else {
        publishes.first().map(|c| utc(c.at))
    };
    if let (Some(at), Some(due)) = (effect_at, ev.due.get(key).copied()) {
        if at + chrono::Duration::seconds(1) < due {
            v.add(
                Class::Early,
                Some(key),
                format!(
                    "{key} took effect at {} , {:.1} s before it was due ({})",
                    at.format("%H:%M:%S%.3f"),
                    (due - at).num_milliseconds() as f64 / 1000.0,
                    due.format("%H:%M:%S%.3f")
                ),
            );
        }
    }
}

/// `mismatch`: slotgate's draft for the slot against the draft the CMS
/// received (publish and index push).
fn same_draft(cms: &CmsLog<'_>, s: &Slot<'_>, v: &mut Verdict) {
    let (key, publishes) = (s.key, &s.publishes);
    let Some(post) = s.row.and_then(|r| r.post_id) else {
        return;
    };
    let sent: BTreeSet<i64> = publishes
        .iter()
        .filter_map(|c| draft_id(&c.body))
        .chain(
            cms.applied("/index", &format!("{key}:index"))
                .iter()
                .filter_map(|c| c.body.get("draft_id").and_then(Value::as_i64)),
        )
        .collect();
    if sent.iter().any(|d| *d != post) {
        v.add(
            Class::Mismatch,
            Some(key),
            format!("slotgate bound draft {post} to {key}; the CMS received draft(s) {sent:?}"),
        );
    }
}

/// The recorded state against the witness: `phantom` (published, never
/// applied), a lost index push, `unexpected` (skipped, yet applied),
/// `failed_with_effect`, and `lost` (no outcome at all).
fn recorded_state<'a>(
    ev: &Evidence<'_>,
    cms: &CmsLog<'_>,
    s: &Slot<'a>,
    by_slot: &HashMap<&str, Vec<&Exec>>,
    t: &mut Tally<'a>,
    v: &mut Verdict,
) {
    let (key, kind, row, publishes) = (s.key, s.kind, s.row, &s.publishes);
    match s.state() {
        Some("published") if !kind.record_only => {
            if publishes.is_empty() {
                v.add(
                    Class::Phantom,
                    Some(key),
                    format!("slotgate recorded {key} published; the CMS never applied a call under its key"),
                );
            }
            if kind.index
                && !cms
                    .index_effects
                    .contains_key(format!("{key}:index").as_str())
            {
                let recorded = by_slot.get(key).is_some_and(|es| {
                    es.iter()
                        .any(|e| e.outcome == "published" && e.detail.get("index_error").is_some())
                });
                if recorded {
                    t.index_errors += 1;
                } else {
                    t.index_lost += 1;
                    v.add(
                        Class::Lost,
                        Some(key),
                        format!("{key} published without an index push and without a recorded index_error"),
                    );
                }
            }
        }
        Some("published") | Some("skipped") if kind.record_only => {}
        Some("skipped") => {
            if let Some(c) = publishes.first() {
                v.add(
                    Class::Unexpected,
                    Some(key),
                    format!(
                        "the CMS applied {key} at {} but slotgate recorded skipped/{}",
                        utc(c.at).format("%H:%M:%S%.3f"),
                        row.and_then(|r| r.reason.as_deref()).unwrap_or("-")
                    ),
                );
            }
        }
        Some("failed") => {
            // With `--cms probe` a late answer excuses nothing: the probe
            // tells slotgate what the CMS applied, and the kinds have the
            // attempts to outlast the slowest held write.
            let timely = publishes.iter().find(|c| {
                ev.probe
                    || answer_time(c)
                        .is_some_and(|d| d + Duration::from_millis(100) < ev.http_timeout)
            });
            // The answer slotgate went by is the key's last one: when
            // that was non-2xx or late (a redirect after a killed
            // worker's call applied, say), slotgate could not know.
            let last_refused = !ev.probe
                && cms
                    .calls("/publish", key)
                    .and_then(|cs| cs.iter().max_by_key(|c| c.at))
                    .is_some_and(|c| {
                        !c.status.is_some_and(|s| (200..300).contains(&s))
                            || answer_time(c)
                                .is_none_or(|d| d + Duration::from_millis(100) >= ev.http_timeout)
                    });
            if let Some(c) = timely.filter(|_| !last_refused) {
                v.add(
                    Class::FailedWithEffect,
                    Some(key),
                    format!(
                        "slotgate recorded {key} failed; the CMS applied it at {} and answered {:?} in {:?}",
                        utc(c.at).format("%H:%M:%S%.3f"),
                        c.status,
                        answer_time(c).unwrap_or_default()
                    ),
                );
            }
            let refused = cms.calls("/publish", key).is_some_and(|cs| {
                cs.iter()
                    .any(|c| c.status.is_some_and(|s| !(200..300).contains(&s)))
            });
            if refused && publishes.is_empty() {
                *t.refused_by_kind.entry(kind.name.as_str()).or_default() += 1;
            }
            t.failed_slots.push(format!(
                "{key} ({}, CMS applied: {})",
                row.and_then(|r| r.reason.clone()).unwrap_or_default(),
                !publishes.is_empty()
            ));
        }
        _ => no_outcome(s, t, v),
    }
}

/// `lost`: a slot that never reached an outcome.
fn no_outcome(s: &Slot<'_>, t: &mut Tally<'_>, v: &mut Verdict) {
    t.lost_slots += 1;
    v.add(
        Class::Lost,
        Some(s.key),
        format!(
            "{} never reached an outcome ({})",
            s.key,
            s.state().unwrap_or("no gate row")
        ),
    );
}

/// `wrong_reason`: a skip reason the facts contradict (`quota_full` with
/// the cap not reached, `no_ready_draft` with drafts still ready).
fn skip_reason(ev: &Evidence<'_>, s: &Slot<'_>, t: &Tally<'_>, v: &mut Verdict) {
    let (key, kind, row, state) = (s.key, s.kind, s.row, s.state());
    let kind_used = t.used.get(kind.name.as_str()).copied().unwrap_or(0);
    let cap_bound = kind_used >= i64::from(kind.daily_cap);
    match row.and_then(|r| r.reason.as_deref()) {
        Some("quota_full") if state == Some("skipped") && !cap_bound => v.add(
            Class::WrongReason,
            Some(key),
            format!(
                "{key} skipped quota_full, but {kind_used} of daily_cap {} were used",
                kind.daily_cap
            ),
        ),
        Some("no_ready_draft") if state == Some("skipped") && !cap_bound => {
            let left = ev.ready_left.get(&kind.name).copied().unwrap_or(0);
            if left > 0 {
                v.add(
                    Class::WrongReason,
                    Some(key),
                    format!("{key} skipped no_ready_draft, but {left} draft(s) of {} were still ready at the end", kind.name),
                );
            }
        }
        _ => {}
    }
}

/// `outcome`: a finished slot has exactly one terminal execution, and it
/// matches the gate row.
fn one_outcome(
    ev: &Evidence<'_>,
    s: &Slot<'_>,
    by_slot: &HashMap<&str, Vec<&Exec>>,
    v: &mut Verdict,
) {
    let (key, row, state) = (s.key, s.row, s.state());
    let es = by_slot.get(key).cloned().unwrap_or_default();
    let terminal: Vec<&&Exec> = es.iter().filter(|e| !e.duplicate(ev)).collect();
    let state_ok = match (terminal.as_slice(), row) {
        ([e], Some(r)) => e.outcome == r.state && e.reason == r.reason,
        _ => false,
    };
    if state.is_some_and(|s| matches!(s, "published" | "skipped" | "failed")) && !state_ok {
        v.add(
            Class::Outcome,
            Some(key),
            format!(
                "{key}: gate row {:?}, executions {:?}",
                row.map(|r| &r.state),
                es.iter().map(|e| e.label()).collect::<Vec<_>>()
            ),
        );
    }
}

/// Per kind: within the cap, exactly min(slots, cap, drafts) effects less
/// the slots the CMS refused, and the quota row agreeing with the
/// outcomes (the ledger's witness). Returns the effects a kind fell short.
pub(super) fn each_kind(ev: &Evidence<'_>, t: &Tally<'_>, v: &mut Verdict) -> usize {
    let mut kind_lost = 0usize;
    for k in ev.kinds.iter().filter(|k| k.wordpress.is_none()) {
        let got = *t.effects_by_kind.get(k.name.as_str()).unwrap_or(&0);
        if got > k.daily_cap {
            v.add(
                Class::Unexpected,
                None,
                format!(
                    "kind {} has {got} effects, daily_cap {}",
                    k.name, k.daily_cap
                ),
            );
        }
        let expected = k
            .expected_effects()
            .saturating_sub(*t.refused_by_kind.get(k.name.as_str()).unwrap_or(&0));
        if got < expected {
            kind_lost += (expected - got) as usize;
            v.add(
                Class::Lost,
                None,
                format!("kind {} has {got} effects; every draft was ready, so min(slots, cap, drafts) less the slots the CMS refused = {expected} were due", k.name),
            );
        }
        let used_rows = t.used.get(k.name.as_str()).copied().unwrap_or(0);
        let q = ev
            .ledger
            .quota
            .iter()
            .find(|((kind, _), _)| kind == &k.name)
            .map(|(_, q)| *q);
        let (max, last) = q.unwrap_or((0, 0));
        if last != used_rows || max > i64::from(k.daily_cap) {
            v.add(
                Class::Quota,
                None,
                format!(
                    "kind {}: daily_quota used {last} (at most {max}), but {used_rows} slot(s) published or failed; daily_cap {}",
                    k.name, k.daily_cap
                ),
            );
        }
    }
    kind_lost
}
