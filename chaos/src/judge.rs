//! The verdict. Effects are judged against the outside world: the stand-in
//! CMS's timestamped log of every call (what was called, under which key,
//! with which draft, when, answered how) for webhook kinds, and the
//! harness's own ledger of committed row changes ([`crate::ledger`]) for
//! record-only ones. slotgate's tables are read only for what slotgate
//! *claims* happened (each slot's recorded outcome and draft), which is
//! then compared with those witnesses. Every violation has a class; see the
//! README's chaos section for what each one means.

use crate::ledger;
use crate::run::{Delivery, Expect, FaultRecord};
use crate::scenario::{Fault, KindSpec};
use crate::stack::token_kind;
use crate::webhook;
use chrono::{DateTime, Utc};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt::Write as _;
use std::time::{Duration, Instant, SystemTime};
use testkit::cms::Call;

/// What went wrong, one class per rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Class {
    /// A due effect that never happened.
    Lost,
    /// A draft published under two keys, or one key carrying two drafts.
    Doubled,
    /// A second applied call under one key that no injected fault explains.
    Replayed,
    /// slotgate recorded a webhook slot published; the CMS never applied it.
    Phantom,
    /// A slot recorded failed whose call the CMS applied and answered in time.
    FailedWithEffect,
    /// An effect more than 1 s before its slot was due.
    Early,
    /// slotgate's draft for a slot differs from the draft the CMS received.
    Mismatch,
    /// A skip reason the facts contradict.
    WrongReason,
    /// An effect nobody planned, of the wrong kind, over the cap, or for a
    /// slot recorded skipped; a call to an unknown path.
    Unexpected,
    /// Record-only judge: a draft bound to two slots, or a slot rebound.
    DraftBoundTwice,
    /// Record-only judge: a committed gate row was deleted.
    GateDeleted,
    /// Record-only judge: the daily quota disagrees with the outcomes.
    Quota,
    /// A planned slot without exactly one outcome matching its gate row.
    Outcome,
    /// An injected delivery not handled as it must be (a duplicate of a
    /// finished slot not `slot_taken`, one never handled, a wrong reason).
    Delivery,
    /// Work left in Redis, open claims, drafts left `publishing`.
    Pending,
    /// A dead letter nothing explains, or a missing one.
    DeadLetter,
    /// The run did not settle by its deadline.
    Unsettled,
    /// A worker exited by itself (or not cleanly on SIGTERM).
    WorkerExit,
}

impl Class {
    pub const ALL: [Class; 18] = [
        Class::Lost,
        Class::Doubled,
        Class::Replayed,
        Class::Phantom,
        Class::FailedWithEffect,
        Class::Early,
        Class::Mismatch,
        Class::WrongReason,
        Class::Unexpected,
        Class::DraftBoundTwice,
        Class::GateDeleted,
        Class::Quota,
        Class::Outcome,
        Class::Delivery,
        Class::Pending,
        Class::DeadLetter,
        Class::Unsettled,
        Class::WorkerExit,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Class::Lost => "lost",
            Class::Doubled => "doubled",
            Class::Replayed => "replayed",
            Class::Phantom => "phantom",
            Class::FailedWithEffect => "failed_with_effect",
            Class::Early => "early",
            Class::Mismatch => "mismatch",
            Class::WrongReason => "wrong_reason",
            Class::Unexpected => "unexpected",
            Class::DraftBoundTwice => "draft_bound_twice",
            Class::GateDeleted => "gate_deleted",
            Class::Quota => "quota",
            Class::Outcome => "outcome",
            Class::Delivery => "delivery",
            Class::Pending => "pending",
            Class::DeadLetter => "dead_letter",
            Class::Unsettled => "unsettled",
            Class::WorkerExit => "worker_exit",
        }
    }
}

/// One broken rule.
#[derive(Debug, Clone, PartialEq)]
pub struct Violation {
    pub class: Class,
    pub slot: Option<String>,
    pub detail: String,
}

impl Violation {
    pub fn new(class: Class, slot: Option<String>, detail: String) -> Violation {
        Violation {
            class,
            slot,
            detail,
        }
    }
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.class.name().to_uppercase(), self.detail)
    }
}

/// One handled delivery, from slotgate's `execution` table.
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
}

#[derive(Debug, Default)]
pub struct Verdict {
    /// Effects lost (a slot can count once; a kind's shortfall counts each).
    pub lost: usize,
    pub effects: usize,
    pub violations: Vec<Violation>,
    pub faults: Vec<FaultCount>,
    pub report: String,
}

impl Verdict {
    pub fn pass(&self) -> bool {
        self.violations.is_empty()
    }
    pub fn count(&self, c: Class) -> usize {
        if c == Class::Lost {
            return self.lost;
        }
        self.violations.iter().filter(|v| v.class == c).count()
    }
    /// Every scheduled fault was injected and verified.
    pub fn all_injected(&self) -> bool {
        self.faults
            .iter()
            .all(|f| f.injected == f.scheduled && f.verified == f.scheduled)
    }
    /// The `--json` object.
    pub fn json(&self, seed: u64, duration: Duration, slots: usize) -> Value {
        let mut o = json!({
            "seed": seed,
            "duration_s": duration.as_secs_f64(),
            "faults": self.faults.iter().map(|f| json!({
                "kind": f.fault.name(), "scheduled": f.scheduled, "injected": f.injected, "verified": f.verified,
            })).collect::<Vec<_>>(),
            "slots": slots,
            "effects": self.effects,
            "violations": self.violations.iter().map(|v| json!({
                "class": v.class.name(), "slot": v.slot, "detail": v.detail,
            })).collect::<Vec<_>>(),
        });
        for c in Class::ALL {
            o[c.name()] = json!(self.count(c));
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

pub fn judge(ev: &Evidence<'_>) -> Verdict {
    let mut v = Verdict {
        faults: fault_counts(&ev.scheduled, &ev.faults, &ev.webhook_log),
        ..Verdict::default()
    };
    let mut out = String::new();
    let add = |v: &mut Verdict, class: Class, slot: Option<&str>, detail: String| {
        v.violations
            .push(Violation::new(class, slot.map(str::to_owned), detail))
    };

    // ---- The CMS's log -----------------------------------------------------
    // Calls per (path, key), in arrival order; "applied" ones were answered
    // 2xx, so a CMS applied them (an idempotent one would apply the first).
    let mut calls_by: BTreeMap<(&str, &str), Vec<&Call>> = BTreeMap::new();
    for c in &ev.calls {
        let key = c.key.as_deref().unwrap_or("");
        match c.path.as_str() {
            "/publish" | "/index" => calls_by.entry((c.path.as_str(), key)).or_default().push(c),
            other => add(
                &mut v,
                Class::Unexpected,
                None,
                format!("a call to the unknown CMS path {other:?} (key {key:?})"),
            ),
        }
    }
    for cs in calls_by.values_mut() {
        cs.sort_by_key(|c| c.at);
    }
    let applied = |path: &str, key: &str| -> Vec<&Call> {
        calls_by
            .get(&(path, key))
            .map(|cs| cs.iter().copied().filter(|c| c.applied()).collect())
            .unwrap_or_default()
    };
    // The effect per key: the first applied call's body.
    let effects: BTreeMap<&str, &Value> = calls_by
        .iter()
        .filter(|((p, _), _)| *p == "/publish")
        .filter_map(|((_, k), cs)| cs.iter().find(|c| c.applied()).map(|c| (*k, &c.body)))
        .collect();
    let index_effects: BTreeMap<&str, &Value> = calls_by
        .iter()
        .filter(|((p, _), _)| *p == "/index")
        .filter_map(|((_, k), cs)| cs.iter().find(|c| c.applied()).map(|c| (*k, &c.body)))
        .collect();

    // Doubled: a draft under two keys; a key carrying two drafts.
    let mut keys_by_token: BTreeMap<String, BTreeSet<&str>> = BTreeMap::new();
    for ((path, key), cs) in &calls_by {
        if *path == "/publish" {
            for c in cs.iter().filter(|c| c.applied()) {
                keys_by_token
                    .entry(draft_token(&c.body))
                    .or_default()
                    .insert(key);
            }
        }
    }
    for (token, keys) in &keys_by_token {
        if keys.len() > 1 {
            let first = keys.iter().next().copied();
            add(
                &mut v,
                Class::Doubled,
                first,
                format!(
                    "draft {token:?} published under {} keys: {keys:?}",
                    keys.len()
                ),
            );
        }
    }
    for ((path, key), cs) in &calls_by {
        let contents: BTreeSet<String> = cs
            .iter()
            .map(|c| {
                if *path == "/publish" {
                    draft_token(&c.body)
                } else {
                    format!("{}|{}", c.body["draft_id"], c.body["url"])
                }
            })
            .collect();
        if contents.len() > 1 {
            add(
                &mut v,
                Class::Doubled,
                Some(key.trim_end_matches(":index")),
                format!(
                    "key {key:?} sent with {} different contents: {contents:?}",
                    contents.len()
                ),
            );
        }
    }

    // Replayed: a second applied call no injected fault explains.
    let in_reach = |slot: &str| {
        ev.faults
            .iter()
            .any(|r| r.injected && explains_replay(r.fault) && r.affected.contains(slot))
    };
    let mut replays = 0usize;
    let mut explained = 0usize;
    for ((path, key), cs) in &calls_by {
        let slot = key.trim_end_matches(":index");
        let mut seen_applied = false;
        let mut late_before = false;
        for c in cs {
            if c.applied() {
                if seen_applied {
                    replays += 1;
                    if late_before || in_reach(slot) {
                        explained += 1;
                    } else {
                        add(
                            &mut v,
                            Class::Replayed,
                            Some(slot),
                            format!(
                                "{path} {key:?} applied again at {} with no kill, stop, terminate or late answer in reach",
                                utc(c.at).format("%H:%M:%S%.3f")
                            ),
                        );
                    }
                }
                seen_applied = true;
            }
            // An answer the client could not have waited for.
            if answer_time(c).is_none_or(|d| d + Duration::from_millis(100) >= ev.http_timeout) {
                late_before = true;
            }
        }
    }

    // ---- Slot by slot --------------------------------------------------------
    let mut execs_by_slot: HashMap<&str, Vec<&Exec>> = HashMap::new();
    for e in &ev.executions {
        execs_by_slot
            .entry(e.slot_key.as_str())
            .or_default()
            .push(e);
    }
    // Per kind: units of the cap in use (published + failed).
    let mut used: HashMap<&str, i64> = HashMap::new();
    for key in ev.plan.keys() {
        if let Some(r) = ev.rows.get(key) {
            if r.state == "published" || r.state == "failed" {
                *used.entry(kind_of_key(key)).or_default() += 1;
            }
        }
    }
    let mut lost_slots = 0usize;
    let mut index_lost = 0usize;
    let mut index_errors = 0;
    let mut failed_slots = Vec::new();
    // Per kind: slots that ended failed because the CMS refused them (a
    // non-2xx answer under the key and no effect): each used a slot, a unit
    // of the cap and a draft, so one effect fewer is due.
    let mut refused_by_kind: HashMap<&str, u32> = HashMap::new();
    let mut effects_by_kind: HashMap<&str, u32> = HashMap::new();
    for (key, ki) in &ev.plan {
        let kind = &ev.kinds[*ki];
        let row = ev.rows.get(key);
        let state = row.map(|r| r.state.as_str());
        let due = ev.due.get(key).copied();
        let publishes = applied("/publish", key);
        if kind.record_only {
            if state == Some("published") {
                *effects_by_kind.entry(kind.name.as_str()).or_default() += 1;
            }
            if let Some(c) = publishes.first() {
                add(
                    &mut v,
                    Class::Unexpected,
                    Some(key),
                    format!("record-only {key} was sent to the CMS at {}", utc(c.at)),
                );
            }
        } else if !publishes.is_empty() {
            *effects_by_kind.entry(kind.name.as_str()).or_default() += 1;
        }
        // When the effect happened, by the witness of its kind.
        let effect_at = if kind.record_only {
            ev.ledger.published_at.get(key).copied()
        } else {
            publishes.first().map(|c| utc(c.at))
        };
        if let (Some(at), Some(due)) = (effect_at, due) {
            if at + chrono::Duration::seconds(1) < due {
                add(
                    &mut v,
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
        // slotgate's draft against the draft the CMS received.
        if let Some(post) = row.and_then(|r| r.post_id) {
            let sent: BTreeSet<i64> = publishes
                .iter()
                .filter_map(|c| draft_id(&c.body))
                .chain(
                    applied("/index", &format!("{key}:index"))
                        .iter()
                        .filter_map(|c| c.body.get("draft_id").and_then(Value::as_i64)),
                )
                .collect();
            if sent.iter().any(|d| *d != post) {
                add(
                    &mut v,
                    Class::Mismatch,
                    Some(key),
                    format!(
                        "slotgate bound draft {post} to {key}; the CMS received draft(s) {sent:?}"
                    ),
                );
            }
        }
        match state {
            Some("published") if !kind.record_only => {
                if publishes.is_empty() {
                    add(
                        &mut v,
                        Class::Phantom,
                        Some(key),
                        format!("slotgate recorded {key} published; the CMS never applied a call under its key"),
                    );
                }
                if kind.index && !index_effects.contains_key(format!("{key}:index").as_str()) {
                    let recorded = execs_by_slot.get(key.as_str()).is_some_and(|es| {
                        es.iter().any(|e| {
                            e.outcome == "published" && e.detail.get("index_error").is_some()
                        })
                    });
                    if recorded {
                        index_errors += 1;
                    } else {
                        index_lost += 1;
                        add(
                            &mut v,
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
                    add(
                        &mut v,
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
                let timely = publishes.iter().find(|c| {
                    answer_time(c).is_some_and(|d| d + Duration::from_millis(100) < ev.http_timeout)
                });
                // The answer slotgate went by is the key's last one: when
                // that was non-2xx or late (a redirect after a killed
                // worker's call applied, say), slotgate could not know.
                let last_refused = calls_by
                    .get(&("/publish", key.as_str()))
                    .and_then(|cs| cs.iter().max_by_key(|c| c.at))
                    .is_some_and(|c| {
                        !c.status.is_some_and(|s| (200..300).contains(&s))
                            || answer_time(c)
                                .is_none_or(|d| d + Duration::from_millis(100) >= ev.http_timeout)
                    });
                if let Some(c) = timely.filter(|_| !last_refused) {
                    add(
                        &mut v,
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
                let refused = calls_by.get(&("/publish", key.as_str())).is_some_and(|cs| {
                    cs.iter()
                        .any(|c| c.status.is_some_and(|s| !(200..300).contains(&s)))
                });
                if refused && publishes.is_empty() {
                    *refused_by_kind.entry(kind.name.as_str()).or_default() += 1;
                }
                failed_slots.push(format!(
                    "{key} ({}, CMS applied: {})",
                    row.and_then(|r| r.reason.clone()).unwrap_or_default(),
                    !publishes.is_empty()
                ));
            }
            other => {
                lost_slots += 1;
                add(
                    &mut v,
                    Class::Lost,
                    Some(key),
                    format!(
                        "{key} never reached an outcome ({})",
                        other.unwrap_or("no gate row")
                    ),
                );
            }
        }
        // The skip reason against the facts.
        let kind_used = used.get(kind.name.as_str()).copied().unwrap_or(0);
        let cap_bound = kind_used >= i64::from(kind.daily_cap);
        match row.and_then(|r| r.reason.as_deref()) {
            Some("quota_full") if state == Some("skipped") && !cap_bound => add(
                &mut v,
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
                    add(
                        &mut v,
                        Class::WrongReason,
                        Some(key),
                        format!("{key} skipped no_ready_draft, but {left} draft(s) of {} were still ready at the end", kind.name),
                    );
                }
            }
            _ => {}
        }
        // Exactly one outcome, matching the gate row.
        let es = execs_by_slot.get(key.as_str()).cloned().unwrap_or_default();
        let terminal: Vec<&&Exec> = es.iter().filter(|e| !e.slot_taken()).collect();
        let state_ok = match (terminal.as_slice(), row) {
            ([e], Some(r)) => e.outcome == r.state && e.reason == r.reason,
            _ => false,
        };
        if state.is_some_and(|s| matches!(s, "published" | "skipped" | "failed")) && !state_ok {
            add(
                &mut v,
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
    // Effects under keys nobody planned, or of another kind's draft.
    for (key, body) in &effects {
        if !ev.plan.contains_key(*key) {
            add(
                &mut v,
                Class::Unexpected,
                Some(key),
                format!("an effect under key {key:?}, which was never planned"),
            );
            continue;
        }
        let token = draft_token(body);
        if token_kind(&token) != Some(kind_of_key(key)) {
            add(
                &mut v,
                Class::Unexpected,
                Some(key),
                format!("{key} published draft {token:?} of another kind"),
            );
        }
    }
    for key in index_effects.keys() {
        let slot = key.trim_end_matches(":index");
        if !effects.contains_key(slot)
            && !ev.plan.get(slot).is_some_and(|k| ev.kinds[*k].record_only)
        {
            add(
                &mut v,
                Class::Unexpected,
                Some(slot),
                format!("index push {key} without a publish effect"),
            );
        }
    }
    // Per kind: within the cap, and exactly min(slots, cap, drafts).
    let mut kind_lost = 0usize;
    for k in ev.kinds {
        let got = *effects_by_kind.get(k.name.as_str()).unwrap_or(&0);
        if got > k.daily_cap {
            add(
                &mut v,
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
            .saturating_sub(*refused_by_kind.get(k.name.as_str()).unwrap_or(&0));
        if got < expected {
            kind_lost += (expected - got) as usize;
            add(
                &mut v,
                Class::Lost,
                None,
                format!("kind {} has {got} effects; every draft was ready, so min(slots, cap, drafts) less the slots the CMS refused = {expected} were due", k.name),
            );
        }
        // The quota row against the outcomes (the ledger's witness).
        let used_rows = used.get(k.name.as_str()).copied().unwrap_or(0);
        let q = ev
            .ledger
            .quota
            .iter()
            .find(|((kind, _), _)| kind == &k.name)
            .map(|(_, q)| *q);
        let (max, last) = q.unwrap_or((0, 0));
        if last != used_rows || max > i64::from(k.daily_cap) {
            add(
                &mut v,
                Class::Quota,
                None,
                format!(
                    "kind {}: daily_quota used {last} (at most {max}), but {used_rows} slot(s) published or failed; daily_cap {}",
                    k.name, k.daily_cap
                ),
            );
        }
    }
    v.lost = kind_lost.max(lost_slots) + index_lost;
    v.effects = effects_by_kind.values().map(|n| *n as usize).sum();

    // ---- Deliveries the harness added --------------------------------------
    let by_entry: HashMap<&str, &Exec> = ev
        .executions
        .iter()
        .filter_map(|e| e.entry_id.as_deref().map(|id| (id, e)))
        .collect();
    let planned_execs: Vec<&Exec> = ev
        .executions
        .iter()
        .filter(|e| ev.plan.contains_key(&e.slot_key))
        .collect();
    let handled_dups = planned_execs.len().saturating_sub(
        ev.plan
            .keys()
            .filter(|k| execs_by_slot.contains_key(k.as_str()))
            .count(),
    );
    let slot_taken = planned_execs.iter().filter(|e| e.slot_taken()).count();
    if handled_dups != slot_taken {
        add(
            &mut v,
            Class::Delivery,
            None,
            format!("{handled_dups} handled duplicate deliveries, but {slot_taken} recorded skipped/slot_taken"),
        );
    }
    let wiped_after = |at: Instant| ev.wipes.iter().any(|w| *w >= at);
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
            (None, _) if wiped_after(d.at) => dropped_by_wipe += 1,
            (None, _) => add(
                &mut v,
                Class::Delivery,
                d.slot.as_deref(),
                format!("{what} was never handled"),
            ),
            (Some(e), Expect::Taken) if !e.slot_taken() => add(
                &mut v,
                Class::Delivery,
                d.slot.as_deref(),
                format!(
                    "{what}, a duplicate of a finished slot, recorded {}",
                    e.label()
                ),
            ),
            (Some(e), Expect::Dead(r)) if !e.is("failed", r) => add(
                &mut v,
                Class::Delivery,
                d.slot.as_deref(),
                format!("{what} recorded {}, expected failed/{r}", e.label()),
            ),
            (Some(e), Expect::NotDue) if !e.is("skipped", "not_due") => add(
                &mut v,
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
            add(
                &mut v,
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

    // ---- Nothing pending; dead letters only for malformed ones -------------
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
        add(
            &mut v,
            Class::Pending,
            None,
            format!("left pending: stream {ready} ({pending} unacknowledged), delayed {delayed}, open gate rows {open_rows}, drafts publishing {}, CMS calls in flight {}", ev.drafts_publishing, ev.cms_in_flight),
        );
    }
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
            _ => add(
                &mut v,
                Class::DeadLetter,
                None,
                format!("a dead letter no injected delivery explains: {f:?}"),
            ),
        }
    }
    for (id, (d, _)) in &expect_dead {
        if !dead_seen.contains(*id) && !wiped_after(d.at) {
            add(
                &mut v,
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
        e.outcome == "failed"
            && matches!(
                e.reason.as_deref(),
                Some("bad_message" | "unknown_kind" | "unknown_slot" | "max_deliveries")
            )
            && !e
                .entry_id
                .as_deref()
                .is_some_and(|id| expect_dead.contains_key(id))
    }) {
        add(
            &mut v,
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
    if !ev.settled {
        add(
            &mut v,
            Class::Unsettled,
            None,
            "the run did not settle before its deadline".into(),
        );
    }
    v.violations.extend(ev.found.iter().cloned());

    // ---- The tables ---------------------------------------------------------
    let _ = writeln!(
        out,
        "\n{:<20} {:>9} {:>8} {:>8} {:>10} {:>11} {:>8} {:>10}",
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
            "{:<20} {:>9} {:>8} {:>8} {:>10} {:>11} {:>8} {:>10}",
            fc.fault.name(),
            fc.scheduled,
            fc.injected,
            fc.verified,
            execs.len(),
            execs.iter().filter(|e| e.slot_taken()).count(),
            affected
                .iter()
                .filter(
                    |k| effects.contains_key(k.as_str()) || ev.ledger.published_at.contains_key(*k)
                )
                .count(),
            affected
                .iter()
                .filter(|k| violating.contains(k.as_str()))
                .count(),
        );
    }
    let _ = writeln!(
        out,
        "{:<20} {:>9} {:>8} {:>8} {:>10} {:>11} {:>8} {:>10}",
        "all",
        v.faults.iter().map(|f| f.scheduled).sum::<usize>(),
        v.faults.iter().map(|f| f.injected).sum::<usize>(),
        v.faults.iter().map(|f| f.verified).sum::<usize>(),
        ev.executions.len(),
        ev.executions.iter().filter(|e| e.slot_taken()).count(),
        v.effects,
        v.violations.len()
    );

    // Per kind.
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
            .map(|key| {
                calls_by
                    .get(&("/publish", key.as_str()))
                    .map_or(0, Vec::len)
            })
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
            effects_by_kind.get(k.name.as_str()).unwrap_or(&0),
            calls,
            count_state("published", None),
            count_state("skipped", Some("quota_full")),
            count_state("skipped", Some("no_ready_draft")),
            count_state("failed", None),
        );
    }

    // Violations by class.
    let _ = writeln!(
        out,
        "\nviolation classes (effects judged from the CMS log and the ledger):"
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
    let _ = writeln!(
        out,
        "  note: {} raw CMS calls, {} publish + {} index keys, {replays} second applied calls ({explained} explained by a fault in reach or a late answer)",
        ev.calls.len(),
        effects.len(),
        index_effects.len()
    );
    if dropped_by_wipe > 0 {
        let _ = writeln!(out, "  note: {dropped_by_wipe} injected deliveries were still queued when the Redis prefix was wiped (Redis is transport; their slots were finished by the planned path)");
    }
    if index_errors > 0 {
        let _ = writeln!(
            out,
            "  note: {index_errors} published slot(s) recorded index_error"
        );
    }
    if !failed_slots.is_empty() {
        let _ = writeln!(
            out,
            "  note: {} slot(s) ended failed: {}",
            failed_slots.len(),
            sample(&failed_slots)
        );
    }
    v.report = out;
    v
}

fn sample(v: &[String]) -> String {
    let mut s = v.iter().take(5).cloned().collect::<Vec<_>>().join("; ");
    if v.len() > 5 {
        let _ = write!(s, "; … {} more", v.len() - 5);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use serde_json::json;

    const DAY: &str = "2026-01-01";

    fn kind(name: &str, slots: usize, cap: u32, drafts: u32) -> KindSpec {
        KindSpec {
            name: name.into(),
            offsets: vec![0; slots],
            daily_cap: cap,
            drafts,
            index: false,
            record_only: false,
            burst_at: 0,
            profile: "test",
        }
    }

    fn key(no: u32) -> String {
        format!("a:{DAY}:{no}")
    }

    /// Slot `no` of kind `a` is due at 12:00:`no`0.
    fn due(no: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 1, 1, 12, 0, no * 10).unwrap()
    }

    fn publish_body(k: &str, kind: &str, draft: u32) -> Value {
        json!({"slot": k, "draft": {"id": draft, "title": "t", "body": crate::stack::draft_token(kind, draft)}})
    }

    /// A publish call arriving `after_ms` after slot `no` was due, answered
    /// `status` within `answer_ms`.
    fn call(no: u32, draft: u32, status: u16, after_ms: i64, answer_ms: u64) -> Call {
        let at: SystemTime = (due(no) + chrono::Duration::milliseconds(after_ms)).into();
        Call {
            path: "/publish".into(),
            key: Some(key(no)),
            body: publish_body(&key(no), "a", draft),
            status: Some(status),
            at,
            answered_at: Some(at + Duration::from_millis(answer_ms)),
        }
    }

    fn exec(k: &str, outcome: &str, reason: Option<&str>, entry: &str) -> Exec {
        Exec {
            slot_key: k.into(),
            caller: "planner".into(),
            entry_id: Some(entry.into()),
            outcome: outcome.into(),
            reason: reason.map(Into::into),
            detail: json!({}),
        }
    }

    fn row(state: &str, reason: Option<&str>, post: Option<i64>) -> GateRow {
        GateRow {
            state: state.into(),
            reason: reason.map(Into::into),
            post_id: post,
        }
    }

    /// Kind `a`: 3 slots, cap 2, 5 drafts: slots 1 and 2 publish drafts 0
    /// and 1, slot 3 is quota_full; slot 1 also had a blocked duplicate.
    fn good(kinds: &[KindSpec]) -> Evidence<'_> {
        let keys = [key(1), key(2), key(3)];
        let mut ledger = ledger::Facts::default();
        ledger.quota.insert(("a".into(), DAY.into()), (2, 2));
        Evidence {
            kinds,
            plan: keys.iter().map(|k| (k.clone(), 0)).collect(),
            due: (1..=3).map(|n| (key(n), due(n))).collect(),
            executions: vec![
                exec(&keys[0], "published", None, "1-0"),
                exec(&keys[1], "published", None, "2-0"),
                exec(&keys[2], "skipped", Some("quota_full"), "3-0"),
                exec(&keys[0], "skipped", Some("slot_taken"), "4-0"),
            ],
            rows: HashMap::from([
                (keys[0].clone(), row("published", None, Some(0))),
                (keys[1].clone(), row("published", None, Some(1))),
                (keys[2].clone(), row("skipped", Some("quota_full"), None)),
            ]),
            drafts_publishing: 0,
            ready_left: HashMap::from([("a".to_owned(), 3)]),
            calls: vec![call(1, 0, 200, 100, 50), call(2, 1, 200, 100, 50)],
            http_timeout: Duration::from_millis(1000),
            webhook_log: Vec::new(),
            scheduled: Vec::new(),
            faults: Vec::new(),
            deliveries: Vec::new(),
            wipes: Vec::new(),
            residue: (0, 0, 0),
            cms_in_flight: 0,
            dead: Vec::new(),
            dead_seen: Vec::new(),
            settled: true,
            ledger,
            found: Vec::new(),
        }
    }

    fn classes(v: &Verdict) -> Vec<&'static str> {
        v.violations.iter().map(|x| x.class.name()).collect()
    }

    #[test]
    fn a_clean_run_passes() {
        let kinds = [kind("a", 3, 2, 5)];
        let v = judge(&good(&kinds));
        assert!(v.pass(), "{:?}\n{}", v.violations, v.report);
        assert_eq!(v.effects, 2);
        let j = v.json(1, Duration::from_secs(30), 3);
        assert_eq!(j["doubled"], 0);
        assert_eq!(j["effects"], 2);
        assert!(j["violations"].as_array().unwrap().is_empty());
    }

    #[test]
    fn a_draft_under_two_keys_is_doubled() {
        let kinds = [kind("a", 3, 2, 5)];
        let mut ev = good(&kinds);
        let mut again = call(1, 0, 200, 200, 50);
        again.key = Some(format!("{}#again", key(1)));
        ev.calls.push(again);
        let v = judge(&ev);
        assert_eq!(v.count(Class::Doubled), 1, "{:?}", v.violations);
        assert!(!v.pass());
    }

    #[test]
    fn one_key_with_two_drafts_is_doubled() {
        let kinds = [kind("a", 3, 2, 5)];
        let mut ev = good(&kinds);
        ev.calls.push(call(1, 4, 503, 300, 10));
        let v = judge(&ev);
        assert_eq!(classes(&v), ["doubled"], "{:?}", v.violations);
    }

    #[test]
    fn a_second_applied_call_under_one_key_is_replayed_unless_something_explains_it() {
        let kinds = [kind("a", 3, 2, 5)];
        let mut ev = good(&kinds);
        ev.calls.push(call(1, 0, 200, 2000, 50));
        assert_eq!(classes(&judge(&ev)), ["replayed"]);
        // A kill with the slot in reach explains it.
        ev.faults.push(FaultRecord {
            fault: Fault::Kill9,
            affected: HashSet::from([key(1)]),
            injected: true,
            verified: true,
        });
        assert!(judge(&ev).pass());
        // So does a first answer the client could not wait for.
        let mut ev = good(&kinds);
        ev.calls[0] = call(1, 0, 200, 100, 1200);
        ev.calls.push(call(1, 0, 200, 1300, 50));
        assert!(judge(&ev).pass(), "{:?}", judge(&ev).violations);
        // A non-2xx answer is no effect: retried calls are not replays.
        let mut ev = good(&kinds);
        ev.calls.insert(0, call(1, 0, 503, 0, 10));
        assert!(judge(&ev).pass());
    }

    #[test]
    fn a_published_slot_the_cms_never_applied_is_phantom() {
        let kinds = [kind("a", 3, 2, 5)];
        let mut ev = good(&kinds);
        ev.calls.remove(1);
        let v = judge(&ev);
        assert_eq!(v.count(Class::Phantom), 1, "{:?}", v.violations);
        // Answered non-2xx: not applied either.
        ev.calls.push(call(2, 1, 500, 100, 10));
        assert_eq!(judge(&ev).count(Class::Phantom), 1);
    }

    #[test]
    fn a_failed_slot_the_cms_applied_in_time_is_failed_with_effect() {
        let kinds = [kind("a", 3, 3, 5)];
        let mut ev = good(&kinds);
        ev.kinds = &kinds;
        ev.rows
            .insert(key(2), row("failed", Some("publish_error"), Some(1)));
        ev.executions[1] = exec(&key(2), "failed", Some("publish_error"), "2-0");
        ev.rows
            .insert(key(3), row("skipped", Some("no_ready_draft"), None));
        ev.executions[2] = exec(&key(3), "skipped", Some("no_ready_draft"), "3-0");
        ev.ready_left.insert("a".into(), 0);
        ev.kinds = &kinds;
        let kinds2 = [kind("a", 3, 3, 2)];
        ev.kinds = &kinds2;
        let v = judge(&ev);
        assert_eq!(classes(&v), ["failed_with_effect"], "{:?}", v.violations);
        // Answered past the client's timeout: the worker never saw it.
        ev.calls[1] = call(2, 1, 200, 100, 1500);
        let v = judge(&ev);
        assert!(v.pass(), "{:?}", v.violations);
    }

    #[test]
    fn an_effect_more_than_a_second_before_its_slot_is_early() {
        let kinds = [kind("a", 3, 2, 5)];
        let mut ev = good(&kinds);
        ev.calls[1] = call(2, 1, 200, -1500, 10);
        assert_eq!(classes(&judge(&ev)), ["early"]);
        ev.calls[1] = call(2, 1, 200, -500, 10);
        assert!(judge(&ev).pass());
        // Record-only: the ledger's clock is the witness.
        let mut ro = kind("a", 3, 2, 5);
        ro.record_only = true;
        let kinds = [ro];
        let mut ev = good(&kinds);
        ev.calls.clear();
        ev.ledger.published_at.insert(key(1), due(1));
        ev.ledger
            .published_at
            .insert(key(2), due(2) - chrono::Duration::seconds(5));
        assert_eq!(classes(&judge(&ev)), ["early"]);
    }

    #[test]
    fn a_draft_the_cms_did_not_receive_is_a_mismatch() {
        let kinds = [kind("a", 3, 2, 5)];
        let mut ev = good(&kinds);
        ev.rows.insert(key(2), row("published", None, Some(3)));
        assert_eq!(classes(&judge(&ev)), ["mismatch"]);
    }

    #[test]
    fn skip_reasons_the_facts_contradict_are_wrong() {
        // quota_full with one unit of the cap left.
        let kinds = [kind("a", 3, 3, 5)];
        let mut ev = good(&kinds);
        ev.ledger.quota.insert(("a".into(), DAY.into()), (2, 2));
        let v = judge(&ev);
        assert!(classes(&v).contains(&"wrong_reason"), "{:?}", v.violations);
        // no_ready_draft with drafts left and the cap not bound.
        let mut ev = good(&kinds);
        ev.rows
            .insert(key(3), row("skipped", Some("no_ready_draft"), None));
        ev.executions[2] = exec(&key(3), "skipped", Some("no_ready_draft"), "3-0");
        let v = judge(&ev);
        assert!(classes(&v).contains(&"wrong_reason"), "{:?}", v.violations);
        ev.ready_left.insert("a".into(), 0);
        let kinds2 = [kind("a", 3, 3, 2)];
        ev.kinds = &kinds2;
        assert!(judge(&ev).pass(), "{:?}", judge(&ev).violations);
    }

    #[test]
    fn effects_over_the_cap_or_for_skipped_slots_are_unexpected() {
        let kinds = [kind("a", 3, 2, 5)];
        let mut ev = good(&kinds);
        ev.calls.push(call(3, 2, 200, 100, 10));
        let v = judge(&ev);
        // Recorded skipped, and over the cap of 2.
        assert_eq!(v.count(Class::Unexpected), 2, "{:?}", v.violations);
    }

    #[test]
    fn the_quota_row_must_match_the_outcomes() {
        let kinds = [kind("a", 3, 2, 5)];
        let mut ev = good(&kinds);
        ev.ledger.quota.insert(("a".into(), DAY.into()), (3, 1));
        assert_eq!(classes(&judge(&ev)), ["quota"]);
    }

    #[test]
    fn a_duplicate_that_was_not_blocked_fails() {
        let kinds = [kind("a", 3, 2, 5)];
        let mut ev = good(&kinds);
        ev.executions[3] = exec(&key(1), "published", None, "4-0");
        ev.deliveries.push(Delivery {
            fault: Fault::SerialDup,
            entry: Some("4-0".into()),
            slot: Some(key(1)),
            at: Instant::now(),
            expect: Expect::Taken,
        });
        let v = judge(&ev);
        assert!(v.count(Class::Delivery) >= 1, "{:?}", v.violations);
        assert!(v.count(Class::Outcome) >= 1, "{:?}", v.violations);
    }

    #[test]
    fn pending_work_unsettled_runs_stray_dead_letters_and_worker_exits_fail() {
        let kinds = [kind("a", 3, 2, 5)];
        let mut ev = good(&kinds);
        ev.residue = (1, 1, 0);
        assert_eq!(classes(&judge(&ev)), ["pending"]);
        let mut ev = good(&kinds);
        ev.settled = false;
        assert_eq!(classes(&judge(&ev)), ["unsettled"]);
        let mut ev = good(&kinds);
        ev.dead.push(HashMap::from([
            ("entry_id".to_owned(), "9-0".to_owned()),
            ("reason".to_owned(), "max_deliveries".to_owned()),
        ]));
        assert_eq!(classes(&judge(&ev)), ["dead_letter"]);
        let mut ev = good(&kinds);
        ev.found
            .push(Violation::new(Class::WorkerExit, None, "w1 exited".into()));
        assert_eq!(classes(&judge(&ev)), ["worker_exit"]);
        let mut ev = good(&kinds);
        ev.rows.remove(&key(3));
        ev.executions.remove(2);
        let v = judge(&ev);
        assert_eq!(v.lost, 1, "{:?}", v.violations);
    }

    #[test]
    fn a_malformed_delivery_must_be_dead_lettered_unless_a_wipe_took_it() {
        let kinds = [kind("a", 3, 2, 5)];
        let mut ev = good(&kinds);
        let at = Instant::now();
        ev.deliveries.push(Delivery {
            fault: Fault::Malformed,
            entry: Some("9-0".into()),
            slot: Some("ghost:2026-01-01:1".into()),
            at,
            expect: Expect::Dead("unknown_kind"),
        });
        let mut r = exec("ghost:2026-01-01:1", "failed", Some("unknown_kind"), "9-0");
        r.caller = "chaos-malformed".into();
        ev.executions.push(r);
        // Not in P:dead, never seen there, no wipe: a violation.
        assert!(!judge(&ev).pass());
        // Seen right after it was handled; a later wipe deleted P:dead.
        ev.dead_seen.push(HashMap::from([
            ("entry_id".to_owned(), "9-0".to_owned()),
            ("reason".to_owned(), "unknown_kind".to_owned()),
        ]));
        ev.wipes.push(Instant::now());
        let v = judge(&ev);
        assert!(v.pass(), "{:?}", v.violations);
        // With the wrong reason it fails.
        ev.dead_seen[0].insert("reason".into(), "bad_message".into());
        ev.wipes.clear();
        assert!(!judge(&ev).pass());
    }

    #[test]
    fn fewer_effects_than_slots_caps_and_drafts_allow_is_lost() {
        // Cap 3 and 5 drafts for 3 slots: all 3 were due, only 2 happened.
        let kinds = [kind("a", 3, 3, 5)];
        let v = judge(&good(&kinds));
        assert_eq!(v.lost, 1, "{:?}", v.violations);
    }

    #[test]
    fn record_only_effects_are_counted_from_the_gate_rows() {
        let mut ro = kind("a", 3, 2, 5);
        ro.record_only = true;
        let kinds = [ro];
        let mut ev = good(&kinds);
        ev.calls.clear();
        let v = judge(&ev);
        assert!(v.pass(), "{:?}", v.violations);
        assert_eq!(v.effects, 2);
        // A record-only slot sent to the CMS is unexpected.
        ev.calls.push(call(1, 0, 200, 0, 10));
        assert!(classes(&judge(&ev)).contains(&"unexpected"));
    }
}
