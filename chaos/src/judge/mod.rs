//! The verdict. Effects are judged against the outside world: the stand-in
//! CMS's timestamped log of every call (what was called, under which key,
//! with which draft, when, answered how) for webhook kinds, the harness's
//! own ledger of committed row changes ([`crate::ledger`]) for record-only
//! ones, and WordPress's posts table and status log for the WordPress
//! scenario's kinds. slotgate's tables are read only for what slotgate
//! *claims* happened (each slot's recorded outcome and draft), which is
//! then compared with those witnesses. Every violation has a class; see the
//! chaos chapter of the docs for what each one means.
//!
//! [`judge`] is a list of named checks, one file per witness:
//!
//! | step | file | classes |
//! |---|---|---|
//! | the CMS's log by key; doubled and replayed calls; publishes applied twice at a CMS that does not dedupe (`--cms probe`); stray effects | [`cms`] | unexpected, doubled, replayed, applied_twice |
//! | slot by slot, then kind by kind | [`slots`] | lost, early, mismatch, phantom, failed_with_effect, wrong_reason, outcome, quota |
//! | the deliveries the harness added; what was left; dead letters | [`deliveries`] | delivery, pending, dead_letter |
//! | the WordPress kinds, by WordPress's posts table and status log (`--cms wordpress`) | [`wordpress`] | doubled, created_twice, withdrawn_published, not_ready_published, lost, phantom, failed |
//! | the tables printed after a run | [`tables`] | — |
//!
//! A slot of a WordPress kind is judged by [`wordpress`] for its effect;
//! the checks every slot gets (an outcome, exactly one, the deliveries,
//! nothing pending, settled, the workers' exits, the ledger's) are the
//! same for it.

mod cms;
mod deliveries;
mod slots;
mod tables;
#[cfg(test)]
mod tests;
pub mod wordpress;

use crate::ledger;
use crate::model::Fault;
use crate::model::{Class, Delivery, FaultRecord, Violation};
use crate::scenario::KindSpec;
use crate::webhook;
use chrono::{DateTime, Utc};
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant, SystemTime};
use testkit::cms::Call;

#[derive(Debug, Clone)]
pub struct Exec {
    pub slot_key: String,
    pub caller: String,
    pub entry_id: Option<String>,
    pub outcome: String,
    pub reason: Option<String>,
    pub detail: Value,
}

impl Exec {
    fn slot_taken(&self) -> bool {
        self.is("skipped", "slot_taken")
    }
    /// A delivery of a slot whose time a schedule edit removed, handled by
    /// a worker that already runs the new config: `failed/unknown_slot`
    /// beside the slot's own `skipped/unscheduled` (DESIGN 4.18, "remove a
    /// time"). Like `slot_taken`, a duplicate turned away, not a second
    /// outcome of the slot.
    fn retired_duplicate(&self, ev: &Evidence<'_>) -> bool {
        self.is("failed", "unknown_slot")
            && ev
                .rows
                .get(&self.slot_key)
                .is_some_and(|r| r.state == "skipped" && r.reason.as_deref() == Some("unscheduled"))
    }
    /// A duplicate delivery turned away, by the gate or by a schedule edit.
    fn duplicate(&self, ev: &Evidence<'_>) -> bool {
        self.slot_taken() || self.retired_duplicate(ev)
    }
    fn is(&self, outcome: &str, reason: &str) -> bool {
        self.outcome == outcome && self.reason.as_deref() == Some(reason)
    }
    fn label(&self) -> String {
        match &self.reason {
            Some(r) => format!("{}/{r}", self.outcome),
            None => self.outcome.clone(),
        }
    }
}

/// A slot's gate row as slotgate left it.
#[derive(Debug, Clone, PartialEq)]
pub struct GateRow {
    pub state: String,
    pub reason: Option<String>,
    pub post_id: Option<i64>,
}

/// Scheduled, injected and verified counts of one fault kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FaultCount {
    pub fault: Fault,
    pub scheduled: usize,
    pub injected: usize,
    pub verified: usize,
}

impl FaultCount {
    /// Its row of a run's `--json` object.
    pub fn json(&self) -> Value {
        json!({
            "kind": self.fault.name(), "scheduled": self.scheduled,
            "injected": self.injected, "verified": self.verified,
        })
    }
}

/// Everything the judge looks at.
pub struct Evidence<'a> {
    pub kinds: &'a [KindSpec],
    /// Planned slot key → kind index.
    pub plan: BTreeMap<String, usize>,
    /// Planned slot key → due time.
    pub due: HashMap<String, DateTime<Utc>>,
    pub executions: Vec<Exec>,
    pub rows: HashMap<String, GateRow>,
    pub drafts_publishing: i64,
    /// Kind → drafts still `ready` at the end.
    pub ready_left: HashMap<String, i64>,
    /// The CMS's log, every call with its timestamps.
    pub calls: Vec<Call>,
    /// The kinds' client timeout: an answer later than this was not seen.
    pub http_timeout: Duration,
    /// `--cms probe`: the webhook kinds have a `probe_url` and the CMS
    /// does not dedupe publishes, so each key's publish must be applied at
    /// most once, whatever happened (`applied_twice`); its probes are
    /// calls of the log too.
    pub probe: bool,
    pub webhook_log: Vec<webhook::Injected>,
    /// Every scheduled event's fault (an event still waiting at the
    /// deadline has no record, and counts as not injected).
    pub scheduled: Vec<Fault>,
    pub faults: Vec<FaultRecord>,
    pub deliveries: Vec<Delivery>,
    pub wipes: Vec<Instant>,
    /// (ready, pending, delayed) left in Redis at the end.
    pub residue: (u64, u64, u64),
    pub cms_in_flight: usize,
    /// `P:dead` entries' fields at the end.
    pub dead: Vec<HashMap<String, String>>,
    /// Dead letters seen during the run, right after each malformed
    /// delivery was handled (a wipe may have deleted them since).
    pub dead_seen: Vec<HashMap<String, String>>,
    pub settled: bool,
    /// What the ledger witnessed.
    pub ledger: ledger::Facts,
    /// Violations found outside the judge: the record-only judge's, worker
    /// processes that exited by themselves.
    pub found: Vec<Violation>,
    /// `--cms wordpress`: WordPress's records, the WordPress kinds' witness.
    pub wordpress: Option<wordpress::Witness>,
}

#[derive(Debug, Default)]
pub struct Verdict {
    /// Effects lost (a slot can count once; a kind's shortfall counts each).
    pub lost: usize,
    pub effects: usize,
    pub violations: Vec<Violation>,
    pub faults: Vec<FaultCount>,
    pub report: String,
    /// What the WordPress witness counted (`--cms wordpress`).
    pub wordpress: Option<wordpress::Tally>,
}

impl Verdict {
    /// Records one broken rule.
    fn add(&mut self, class: Class, slot: Option<&str>, detail: String) {
        self.violations
            .push(Violation::new(class, slot.map(str::to_owned), detail))
    }
    pub fn pass(&self) -> bool {
        self.violations.is_empty()
    }
    pub fn count(&self, c: Class) -> usize {
        if c == Class::Lost {
            return self.lost;
        }
        self.violations.iter().filter(|v| v.class == c).count()
    }
    /// Every scheduled fault was injected and verified: otherwise the run
    /// proves nothing either way.
    pub fn all_injected(&self) -> bool {
        (self.faults.iter()).all(|f| f.injected == f.scheduled && f.verified == f.scheduled)
    }
    /// The classes the run's last line counts: effects lost, doubled,
    /// replayed, phantom, early and drafts bound twice, and the WordPress
    /// witness's own when it judged.
    pub fn headline(&self) -> Vec<(&'static str, usize)> {
        use Class::*;
        let classes = [Lost, Doubled, Replayed, Phantom, Early, DraftBoundTwice];
        let wordpress = [CreatedTwice, WithdrawnPublished, NotReadyPublished, Failed];
        let wordpress = wordpress.iter().filter(|_| self.wordpress.is_some());
        classes
            .iter()
            .chain(wordpress)
            .map(|c| (c.name(), self.count(*c)))
            .collect()
    }
    /// The `--json` object.
    pub fn json(&self, seed: u64, duration: Duration, slots: usize) -> Value {
        let mut o = json!({
            "seed": seed,
            "duration_s": duration.as_secs_f64(),
            "faults": self.faults.iter().map(FaultCount::json).collect::<Vec<_>>(),
            "slots": slots,
            "effects": self.effects,
            "violations": self.violations.iter().map(|v| json!({
                "class": v.class.name(), "slot": v.slot, "detail": v.detail,
            })).collect::<Vec<_>>(),
        });
        for c in Class::ALL {
            o[c.name()] = json!(self.count(c));
        }
        if let Some(t) = &self.wordpress {
            o["wordpress"] = json!(t);
        }
        o
    }
}

fn draft_token(body: &Value) -> String {
    match body.pointer("/draft/body").and_then(Value::as_str) {
        Some(t) => t.to_owned(),
        None => format!(
            "draft-id {}",
            body.pointer("/draft/id").unwrap_or(&Value::Null)
        ),
    }
}

fn draft_id(body: &Value) -> Option<i64> {
    body.pointer("/draft/id").and_then(Value::as_i64)
}

fn kind_of_key(key: &str) -> &str {
    key.split(':').next().unwrap_or("")
}

/// How long after arriving a call was answered (`None`: never answered).
fn answer_time(c: &Call) -> Option<Duration> {
    c.answered_at?.duration_since(c.at).ok()
}

fn utc(t: SystemTime) -> DateTime<Utc> {
    DateTime::<Utc>::from(t)
}

/// Faults whose reach explains a second applied call under a slot's key:
/// the caller died, stalled, or could not record what it saw.
fn explains_replay(f: Fault) -> bool {
    matches!(
        f,
        Fault::Kill9 | Fault::Kill9MidWebhook | Fault::LeaderStop | Fault::PgTerminate
    )
}

/// Per fault kind: scheduled, injected, verified. The CMS's random answers
/// are injected and verified by the CMS itself (its log is the proof).
pub fn fault_counts(
    scheduled: &[Fault],
    faults: &[FaultRecord],
    webhook_log: &[webhook::Injected],
) -> Vec<FaultCount> {
    Fault::ALL
        .into_iter()
        .filter_map(|fault| {
            let (s, i, v) = if fault.is_random_webhook() {
                let n = webhook_log.iter().filter(|x| x.fault == fault).count();
                (n, n, n)
            } else {
                let rs: Vec<&FaultRecord> = faults.iter().filter(|r| r.fault == fault).collect();
                (
                    scheduled.iter().filter(|f| **f == fault).count(),
                    rs.iter().filter(|r| r.injected).count(),
                    rs.iter().filter(|r| r.verified).count(),
                )
            };
            (s > 0).then_some(FaultCount {
                fault,
                scheduled: s,
                injected: i,
                verified: v,
            })
        })
        .collect()
}

/// The executions of each slot, in the order slotgate recorded them.
fn executions_by_slot<'a>(ev: &'a Evidence<'_>) -> HashMap<&'a str, Vec<&'a Exec>> {
    let mut by_slot: HashMap<&str, Vec<&Exec>> = HashMap::new();
    for e in &ev.executions {
        by_slot.entry(e.slot_key.as_str()).or_default().push(e);
    }
    by_slot
}

/// The execution of each stream entry that carries an id.
fn executions_by_entry<'a>(ev: &'a Evidence<'_>) -> HashMap<&'a str, &'a Exec> {
    ev.executions
        .iter()
        .filter_map(|e| e.entry_id.as_deref().map(|id| (id, e)))
        .collect()
}

/// Every check, in the order its violations are listed.
pub fn judge(ev: &Evidence<'_>) -> Verdict {
    let mut v = Verdict {
        faults: fault_counts(&ev.scheduled, &ev.faults, &ev.webhook_log),
        ..Verdict::default()
    };
    let by_slot = executions_by_slot(ev);
    let by_entry = executions_by_entry(ev);

    let cms = cms::CmsLog::read(ev, &mut v);
    cms.doubled(&mut v);
    cms.applied_twice(ev, &mut v);
    let replays = cms.replayed(ev, &mut v);
    let tally = slots::each_slot(ev, &cms, &by_slot, &mut v);
    cms.stray_effects(ev, &mut v);
    let kind_lost = slots::each_kind(ev, &tally, &mut v);
    v.lost = kind_lost.max(tally.lost_slots) + tally.index_lost;
    v.effects = tally.effects_by_kind.values().map(|n| *n as usize).sum();

    let dropped_by_wipe = deliveries::injected(ev, &by_slot, &by_entry, &mut v);
    deliveries::nothing_pending(ev, &mut v);
    deliveries::dead_letters(ev, &by_entry, &mut v);
    if !ev.settled {
        v.add(
            Class::Unsettled,
            None,
            "the run did not settle before its deadline".into(),
        );
    }
    v.violations.extend(ev.found.iter().cloned());
    if let Some(w) = &ev.wordpress {
        let t = wordpress::judge(w, ev.settled, &mut v);
        v.effects += t.published_in_place + t.created;
        v.wordpress = Some(t);
    }

    v.report = tables::report(
        ev,
        &v,
        &cms,
        &tally,
        &by_entry,
        tables::Notes {
            replays,
            dropped_by_wipe,
        },
    );
    v
}
