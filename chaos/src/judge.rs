//! The verdict. Effects are judged from the stand-in CMS's ledger (what was
//! called, under which key, with which draft, and what was applied), never
//! from slotgate's own bookkeeping; slotgate's tables are read only to count
//! deliveries and to see which outcome each slot recorded.

use crate::run::{Delivery, FaultRecord};
use crate::scenario::{Fault, KindSpec};
use crate::stack::token_kind;
use crate::webhook;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt::Write as _;
use std::time::Instant;
use testkit::cms::Call;

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
        self.outcome == "skipped" && self.reason.as_deref() == Some("slot_taken")
    }
    fn label(&self) -> String {
        match &self.reason {
            Some(r) => format!("{}/{r}", self.outcome),
            None => self.outcome.clone(),
        }
    }
}

/// Everything the judge looks at.
pub struct Evidence<'a> {
    pub kinds: &'a [KindSpec],
    /// Planned slot key → kind index.
    pub plan: BTreeMap<String, usize>,
    pub executions: Vec<Exec>,
    /// Gate rows: slot key → (state, reason).
    pub rows: HashMap<String, (String, Option<String>)>,
    pub drafts_publishing: i64,
    pub calls: Vec<Call>,
    pub applied_publish: HashMap<String, Value>,
    pub applied_index: HashMap<String, Value>,
    pub webhook_log: Vec<webhook::Injected>,
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
}

#[derive(Debug, Default)]
pub struct Verdict {
    pub lost: usize,
    pub doubled: usize,
    pub unexpected: usize,
    pub violations: Vec<String>,
    pub report: String,
}

impl Verdict {
    pub fn pass(&self) -> bool {
        self.lost == 0 && self.doubled == 0 && self.unexpected == 0 && self.violations.is_empty()
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

fn kind_of_key(key: &str) -> &str {
    key.split(':').next().unwrap_or("")
}

pub fn judge(ev: &Evidence<'_>) -> Verdict {
    let mut v = Verdict::default();
    let mut out = String::new();
    let violation = |v: &mut Verdict, s: String| v.violations.push(s);

    // ---- The ledger --------------------------------------------------------
    let mut publish_calls: BTreeMap<&str, Vec<&Call>> = BTreeMap::new();
    let mut index_calls: BTreeMap<&str, Vec<&Call>> = BTreeMap::new();
    let mut other_calls = 0usize;
    for c in &ev.calls {
        let key = c.key.as_deref().unwrap_or("");
        match c.path.as_str() {
            "/publish" => publish_calls.entry(key).or_default().push(c),
            "/index" => index_calls.entry(key).or_default().push(c),
            _ => other_calls += 1,
        }
    }
    if other_calls > 0 {
        violation(
            &mut v,
            format!("{other_calls} call(s) to unknown CMS paths"),
        );
    }
    let effect_keys: BTreeSet<&str> = ev.applied_publish.keys().map(String::as_str).collect();
    let mut lost_keys: BTreeSet<String> = BTreeSet::new();
    let mut doubled_keys: BTreeSet<String> = BTreeSet::new();
    let mut unexpected_keys: BTreeSet<String> = BTreeSet::new();

    // A draft published under more than one key.
    let mut keys_by_token: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    for (key, body) in &ev.applied_publish {
        keys_by_token
            .entry(draft_token(body))
            .or_default()
            .push(key);
    }
    let mut drafts_twice = 0;
    for (token, keys) in &keys_by_token {
        if keys.len() > 1 {
            drafts_twice += 1;
            v.doubled += keys.len() - 1;
            doubled_keys.extend(keys.iter().map(|k| k.to_string()));
            violation(
                &mut v,
                format!(
                    "DOUBLED: draft {token:?} published under {} keys: {keys:?}",
                    keys.len()
                ),
            );
        }
    }
    // A key applied twice: the same idempotency key sent with different
    // content (a CMS without idempotency would have applied both).
    let mut keys_twice = 0;
    let mut replays = 0usize;
    for (key, calls) in publish_calls.iter().chain(index_calls.iter()) {
        let contents: BTreeSet<String> = calls
            .iter()
            .map(|c| {
                if c.path == "/publish" {
                    draft_token(&c.body)
                } else {
                    format!("{}|{}", c.body["draft_id"], c.body["url"])
                }
            })
            .collect();
        if contents.len() > 1 {
            keys_twice += 1;
            v.doubled += contents.len() - 1;
            doubled_keys.insert(key.trim_end_matches(":index").to_owned());
            violation(
                &mut v,
                format!(
                    "DOUBLED: key {key:?} sent with {} different contents: {contents:?}",
                    contents.len()
                ),
            );
        }
        let ok = calls
            .iter()
            .filter(|c| c.status.is_some_and(|s| (200..300).contains(&s)))
            .count();
        replays += ok.saturating_sub(1);
    }

    // Effects per kind against the caps and the expectation.
    let mut effects_by_kind: HashMap<&str, u32> = HashMap::new();
    for (key, body) in &ev.applied_publish {
        let kind = kind_of_key(key);
        if !ev.plan.contains_key(key.as_str()) {
            v.unexpected += 1;
            unexpected_keys.insert(key.clone());
            violation(
                &mut v,
                format!("UNEXPECTED: effect under key {key:?}, which was never planned"),
            );
            continue;
        }
        *effects_by_kind.entry(kind).or_default() += 1;
        let token = draft_token(body);
        if token_kind(&token) != Some(kind) {
            v.unexpected += 1;
            unexpected_keys.insert(key.clone());
            violation(
                &mut v,
                format!("UNEXPECTED: {key} published draft {token:?} of another kind"),
            );
        }
        match ev.rows.get(key).map(|(s, r)| (s.as_str(), r.as_deref())) {
            Some(("published", _)) | Some(("failed", _)) => {}
            other => {
                v.unexpected += 1;
                unexpected_keys.insert(key.clone());
                violation(
                    &mut v,
                    format!("UNEXPECTED: the CMS applied {key} but slotgate recorded {other:?}"),
                );
            }
        }
    }
    for (key, body) in &ev.applied_index {
        let slot = key.trim_end_matches(":index");
        match ev.applied_publish.get(slot) {
            None => {
                v.unexpected += 1;
                unexpected_keys.insert(slot.to_owned());
                violation(
                    &mut v,
                    format!("UNEXPECTED: index push {key} without a publish effect"),
                );
            }
            Some(p) => {
                if p.pointer("/draft/id") != body.get("draft_id") {
                    v.doubled += 1;
                    doubled_keys.insert(slot.to_owned());
                    violation(
                        &mut v,
                        format!("DOUBLED: index push {key} names draft {} but {slot} published draft {}", body["draft_id"], p["draft"]["id"]),
                    );
                }
            }
        }
    }

    // Slot by slot: slotgate's recorded outcome against the ledger.
    let mut execs_by_slot: HashMap<&str, Vec<&Exec>> = HashMap::new();
    for e in &ev.executions {
        execs_by_slot
            .entry(e.slot_key.as_str())
            .or_default()
            .push(e);
    }
    let mut not_terminal = Vec::new();
    let mut bad_terminal = Vec::new();
    let mut failed_slots = Vec::new();
    let mut index_missing = Vec::new();
    let mut index_errors = 0;
    for (key, kind) in &ev.plan {
        let row = ev.rows.get(key);
        match row.map(|(s, _)| s.as_str()) {
            Some("published") => {
                if !effect_keys.contains(key.as_str()) {
                    lost_keys.insert(key.clone());
                    violation(
                        &mut v,
                        format!(
                            "LOST: slotgate recorded {key} published, the CMS never applied it"
                        ),
                    );
                }
                if ev.kinds[*kind].index && !ev.applied_index.contains_key(&format!("{key}:index"))
                {
                    let recorded = execs_by_slot.get(key.as_str()).is_some_and(|es| {
                        es.iter().any(|e| {
                            e.outcome == "published" && e.detail.get("index_error").is_some()
                        })
                    });
                    if recorded {
                        index_errors += 1;
                    } else {
                        index_missing.push(key.clone());
                    }
                }
            }
            Some("skipped") => {}
            Some("failed") => failed_slots.push(format!(
                "{key} ({}, CMS effect: {})",
                row.and_then(|r| r.1.clone()).unwrap_or_default(),
                effect_keys.contains(key.as_str())
            )),
            other => {
                lost_keys.insert(key.clone());
                not_terminal.push(format!("{key} ({})", other.unwrap_or("no gate row")));
            }
        }
        let es = execs_by_slot.get(key.as_str()).cloned().unwrap_or_default();
        let terminal: Vec<&&Exec> = es.iter().filter(|e| !e.slot_taken()).collect();
        let state_ok = match (terminal.as_slice(), row) {
            ([e], Some((state, reason))) => &e.outcome == state && &e.reason == reason,
            _ => false,
        };
        if row.is_some_and(|(s, _)| matches!(s.as_str(), "published" | "skipped" | "failed"))
            && !state_ok
        {
            bad_terminal.push(format!(
                "{key}: row {:?}, executions {:?}",
                row.map(|r| &r.0),
                es.iter().map(|e| e.label()).collect::<Vec<_>>()
            ));
        }
    }
    for key in &index_missing {
        lost_keys.insert(key.clone());
        violation(
            &mut v,
            format!(
                "LOST: {key} published without an index push and without a recorded index_error"
            ),
        );
    }
    if !not_terminal.is_empty() {
        violation(
            &mut v,
            format!(
                "{} planned slot(s) never reached an outcome: {}",
                not_terminal.len(),
                sample(&not_terminal)
            ),
        );
    }
    if !bad_terminal.is_empty() {
        violation(
            &mut v,
            format!(
                "{} slot(s) without exactly one outcome matching their gate row: {}",
                bad_terminal.len(),
                sample(&bad_terminal)
            ),
        );
    }
    let mut kind_lost = 0usize;
    for k in ev.kinds {
        let got = *effects_by_kind.get(k.name.as_str()).unwrap_or(&0);
        if got > k.daily_cap {
            v.unexpected += (got - k.daily_cap) as usize;
            violation(
                &mut v,
                format!(
                    "OVER CAP: kind {} has {got} effects, daily_cap {}",
                    k.name, k.daily_cap
                ),
            );
        }
        let expected = k.expected_effects();
        if got < expected {
            kind_lost += (expected - got) as usize;
            violation(
                &mut v,
                format!("LOST: kind {} has {got} effects; every draft was ready, so min(slots, cap, drafts) = {expected} were due", k.name),
            );
        }
    }
    v.lost = kind_lost.max(lost_keys.len() - index_missing.len()) + index_missing.len();

    // ---- Deliveries -------------------------------------------------------
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
        violation(
            &mut v,
            format!("{handled_dups} handled duplicate deliveries, but {slot_taken} recorded skipped/slot_taken"),
        );
    }
    let wiped_after = |at: Instant| ev.wipes.iter().any(|w| *w >= at);
    let mut dropped_by_wipe = 0;
    let mut not_taken = Vec::new();
    let mut never_handled = Vec::new();
    for d in &ev.deliveries {
        let Some(id) = d.entry.as_deref() else {
            continue;
        };
        match by_entry.get(id) {
            None if wiped_after(d.at) => dropped_by_wipe += 1,
            None => never_handled.push(format!(
                "{} {id} ({})",
                d.fault.name(),
                d.slot.as_deref().unwrap_or("-")
            )),
            Some(e) => {
                if d.after_done && !e.slot_taken() {
                    not_taken.push(format!(
                        "{} {id} for {}: {}",
                        d.fault.name(),
                        e.slot_key,
                        e.label()
                    ));
                }
                if let Some(r) = d.expect_reason {
                    if e.outcome != "failed" || e.reason.as_deref() != Some(r) {
                        violation(
                            &mut v,
                            format!(
                                "malformed delivery {id} recorded {}, expected failed/{r}",
                                e.label()
                            ),
                        );
                    }
                }
            }
        }
    }
    if !not_taken.is_empty() {
        violation(
            &mut v,
            format!(
                "{} duplicate(s) of finished slots not recorded skipped/slot_taken: {}",
                not_taken.len(),
                sample(&not_taken)
            ),
        );
    }
    if !never_handled.is_empty() {
        violation(
            &mut v,
            format!(
                "{} injected deliveries never handled: {}",
                never_handled.len(),
                sample(&never_handled)
            ),
        );
    }
    let stray: Vec<String> = ev
        .executions
        .iter()
        .filter(|e| !ev.plan.contains_key(&e.slot_key))
        .filter(|e| {
            !ev.deliveries
                .iter()
                .any(|d| d.fault == Fault::Malformed && d.entry.is_some() && d.entry == e.entry_id)
        })
        .map(|e| format!("{:?} {} ({})", e.slot_key, e.label(), e.caller))
        .collect();
    if !stray.is_empty() {
        violation(
            &mut v,
            format!(
                "{} execution(s) for slots that were never planned: {}",
                stray.len(),
                sample(&stray)
            ),
        );
    }

    // ---- Nothing pending; dead letters only for malformed ones -------------
    let (ready, pending, delayed) = ev.residue;
    let open_rows = ev
        .rows
        .values()
        .filter(|(s, _)| !matches!(s.as_str(), "published" | "skipped" | "failed"))
        .count();
    let pending_ok = ready == 0
        && pending == 0
        && delayed == 0
        && open_rows == 0
        && ev.drafts_publishing == 0
        && ev.cms_in_flight == 0;
    if !pending_ok {
        violation(
            &mut v,
            format!("left pending: stream {ready} ({pending} unacknowledged), delayed {delayed}, open gate rows {open_rows}, drafts publishing {}, CMS calls in flight {}", ev.drafts_publishing, ev.cms_in_flight),
        );
    }
    let malformed: HashMap<&str, &Delivery> = ev
        .deliveries
        .iter()
        .filter(|d| d.fault == Fault::Malformed)
        .filter_map(|d| d.entry.as_deref().map(|id| (id, d)))
        .collect();
    let mut dead_ok = true;
    let mut dead_seen = HashSet::new();
    for f in ev.dead.iter().chain(ev.dead_seen.iter()) {
        let id = f.get("entry_id").map(String::as_str).unwrap_or("");
        let reason = f.get("reason").map(String::as_str).unwrap_or("");
        match malformed.get(id) {
            Some(d) if d.expect_reason == Some(reason) => {
                dead_seen.insert(id.to_owned());
            }
            _ => {
                dead_ok = false;
                violation(
                    &mut v,
                    format!("dead letter not injected as malformed: {f:?}"),
                );
            }
        }
    }
    for (id, d) in &malformed {
        if !dead_seen.contains(*id) && !wiped_after(d.at) {
            dead_ok = false;
            violation(
                &mut v,
                format!(
                    "malformed delivery {id} ({}) is not in the dead letters",
                    d.slot.as_deref().unwrap_or("no slot")
                ),
            );
        }
    }
    let dead_rows: Vec<&Exec> = ev
        .executions
        .iter()
        .filter(|e| {
            e.outcome == "failed"
                && matches!(
                    e.reason.as_deref(),
                    Some("bad_message" | "unknown_kind" | "unknown_slot" | "max_deliveries")
                )
        })
        .filter(|e| {
            !e.entry_id
                .as_deref()
                .is_some_and(|id| malformed.contains_key(id))
        })
        .collect();
    for e in &dead_rows {
        dead_ok = false;
        violation(
            &mut v,
            format!(
                "dead-lettered delivery not injected as malformed: {} {} ({})",
                e.slot_key,
                e.label(),
                e.caller
            ),
        );
    }
    if !ev.settled {
        violation(&mut v, "the run did not settle before its deadline".into());
    }

    // ---- The table ----------------------------------------------------------
    let exec_of_entry = |fault: Fault| -> Vec<&Exec> {
        if fault == Fault::BackfillDup {
            return ev
                .executions
                .iter()
                .filter(|e| e.caller == "backfill")
                .collect();
        }
        ev.deliveries
            .iter()
            .filter(|d| d.fault == fault)
            .filter_map(|d| d.entry.as_deref().and_then(|id| by_entry.get(id).copied()))
            .collect()
    };
    let _ = writeln!(
        out,
        "\n{:<20} {:>8} {:>10} {:>11} {:>8} {:>5} {:>7} {:>10}",
        "fault",
        "injected",
        "deliveries",
        "dup-blocked",
        "effects",
        "lost",
        "doubled",
        "unexpected"
    );
    let mut total_injected = 0;
    for fault in Fault::ALL {
        let (injected, affected): (usize, HashSet<String>) = match fault {
            Fault::Webhook503
            | Fault::WebhookTimeout
            | Fault::WebhookSlow
            | Fault::WebhookReset => {
                let l: Vec<&webhook::Injected> =
                    ev.webhook_log.iter().filter(|i| i.fault == fault).collect();
                (
                    l.len(),
                    l.iter()
                        .map(|i| i.key.trim_end_matches(":index").to_owned())
                        .collect(),
                )
            }
            _ => {
                let rs: Vec<&FaultRecord> = ev.faults.iter().filter(|r| r.fault == fault).collect();
                (
                    rs.len(),
                    rs.iter().flat_map(|r| r.affected.iter().cloned()).collect(),
                )
            }
        };
        total_injected += injected;
        let execs: Vec<&Exec> = match fault {
            Fault::ConcurrentDup
            | Fault::SerialDup
            | Fault::TriggerDup
            | Fault::BackfillDup
            | Fault::XaddDup
            | Fault::Malformed => exec_of_entry(fault),
            _ => ev
                .executions
                .iter()
                .filter(|e| affected.contains(&e.slot_key))
                .collect(),
        };
        let blocked = execs.iter().filter(|e| e.slot_taken()).count();
        let count = |set: &BTreeSet<String>| affected.iter().filter(|k| set.contains(*k)).count();
        let effects = affected
            .iter()
            .filter(|k| effect_keys.contains(k.as_str()))
            .count();
        let _ = writeln!(
            out,
            "{:<20} {:>8} {:>10} {:>11} {:>8} {:>5} {:>7} {:>10}",
            fault.name(),
            injected,
            execs.len(),
            blocked,
            effects,
            count(&lost_keys),
            count(&doubled_keys),
            count(&unexpected_keys)
        );
    }
    let all_blocked = ev.executions.iter().filter(|e| e.slot_taken()).count();
    let _ = writeln!(
        out,
        "{:<20} {:>8} {:>10} {:>11} {:>8} {:>5} {:>7} {:>10}",
        "all",
        total_injected,
        ev.executions.len(),
        all_blocked,
        ev.applied_publish.len(),
        v.lost,
        v.doubled,
        v.unexpected
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
                    ev.rows.get(key.as_str()).is_some_and(|(s, r)| {
                        s == state && (reason.is_none() || r.as_deref() == reason)
                    })
                })
                .count()
        };
        let calls: usize = keys
            .iter()
            .map(|key| publish_calls.get(key.as_str()).map_or(0, Vec::len))
            .sum();
        let _ = writeln!(
            out,
            "{:<12} {:<16} {:>5} {:>4} {:>6} {:>8} {:>7} {:>6} | {:>9} {:>10} {:>14} {:>6}",
            k.name,
            k.profile,
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

    // Invariants.
    let ok = |b: bool| if b { "ok" } else { "FAIL" };
    let _ = writeln!(out, "\ninvariants (effects from the CMS ledger):");
    let _ = writeln!(
        out,
        "  {:<4} no draft published under more than one key ({} drafts published)",
        ok(drafts_twice == 0),
        keys_by_token.len()
    );
    let _ = writeln!(
        out,
        "  {:<4} no key applied twice ({} publish + {} index keys; {} raw calls; {} idempotent 2xx replays)",
        ok(keys_twice == 0),
        publish_calls.len(),
        index_calls.len(),
        ev.calls.len(),
        replays
    );
    let _ = writeln!(
        out,
        "  {:<4} every planned slot ends in exactly one terminal state ({} planned, {} not terminal, {} inconsistent)",
        ok(not_terminal.is_empty() && bad_terminal.is_empty()),
        ev.plan.len(),
        not_terminal.len(),
        bad_terminal.len()
    );
    let over: Vec<String> = ev
        .kinds
        .iter()
        .filter(|k| *effects_by_kind.get(k.name.as_str()).unwrap_or(&0) > k.daily_cap)
        .map(|k| k.name.clone())
        .collect();
    let _ = writeln!(
        out,
        "  {:<4} published per kind and day <= daily_cap {}",
        ok(over.is_empty()),
        if over.is_empty() {
            String::new()
        } else {
            format!("(over: {over:?})")
        }
    );
    let _ = writeln!(
        out,
        "  {:<4} every handled duplicate recorded as skipped/slot_taken ({handled_dups} duplicates, {slot_taken} slot_taken; {} injected after the slot finished)",
        ok(handled_dups == slot_taken && not_taken.is_empty()),
        ev.deliveries.iter().filter(|d| d.after_done).count()
    );
    let _ = writeln!(
        out,
        "  {:<4} nothing left pending (stream {ready}, unacknowledged {pending}, delayed {delayed}, open rows {open_rows})",
        ok(pending_ok)
    );
    let _ = writeln!(
        out,
        "  {:<4} dead letters only for the injected malformed deliveries ({} of {} malformed seen dead-lettered with the expected reason; {} dead letters at the end)",
        ok(dead_ok),
        dead_seen.len(),
        malformed.len(),
        ev.dead.len()
    );
    let _ = writeln!(
        out,
        "  {:<4} no effect lost (expected per kind = min(slots, cap, drafts))",
        ok(v.lost == 0)
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
    use serde_json::json;

    fn kind(name: &str, slots: usize, cap: u32, drafts: u32) -> KindSpec {
        KindSpec {
            name: name.into(),
            offsets: vec![0; slots],
            daily_cap: cap,
            drafts,
            index: false,
            profile: "test",
        }
    }

    fn publish_body(key: &str, kind: &str, draft: u32) -> Value {
        json!({"slot": key, "draft": {"id": draft, "title": "t", "body": crate::stack::draft_token(kind, draft)}})
    }

    fn exec(key: &str, outcome: &str, reason: Option<&str>, entry: &str) -> Exec {
        Exec {
            slot_key: key.into(),
            caller: "planner".into(),
            entry_id: Some(entry.into()),
            outcome: outcome.into(),
            reason: reason.map(Into::into),
            detail: json!({}),
        }
    }

    /// Kind `a`: 3 slots, cap 2, 5 drafts: slots 1 and 2 publish drafts 0
    /// and 1, slot 3 is quota_full; slot 1 also had a blocked duplicate.
    fn good(kinds: &[KindSpec]) -> Evidence<'_> {
        let keys = ["a:2026-01-01:1", "a:2026-01-01:2", "a:2026-01-01:3"];
        let mut calls = Vec::new();
        let mut applied = HashMap::new();
        for (i, k) in keys.iter().take(2).enumerate() {
            let body = publish_body(k, "a", i as u32);
            calls.push(Call {
                path: "/publish".into(),
                key: Some((*k).into()),
                body: body.clone(),
                status: Some(200),
            });
            applied.insert((*k).to_owned(), body);
        }
        let mut rows = HashMap::new();
        rows.insert(keys[0].to_owned(), ("published".to_owned(), None));
        rows.insert(keys[1].to_owned(), ("published".to_owned(), None));
        rows.insert(
            keys[2].to_owned(),
            ("skipped".to_owned(), Some("quota_full".to_owned())),
        );
        Evidence {
            kinds,
            plan: keys.iter().map(|k| (k.to_string(), 0)).collect(),
            executions: vec![
                exec(keys[0], "published", None, "1-0"),
                exec(keys[1], "published", None, "2-0"),
                exec(keys[2], "skipped", Some("quota_full"), "3-0"),
                exec(keys[0], "skipped", Some("slot_taken"), "4-0"),
            ],
            rows,
            drafts_publishing: 0,
            calls,
            applied_publish: applied,
            applied_index: HashMap::new(),
            webhook_log: Vec::new(),
            faults: Vec::new(),
            deliveries: Vec::new(),
            wipes: Vec::new(),
            residue: (0, 0, 0),
            cms_in_flight: 0,
            dead: Vec::new(),
            dead_seen: Vec::new(),
            settled: true,
        }
    }

    #[test]
    fn a_clean_run_passes() {
        let kinds = [kind("a", 3, 2, 5)];
        let v = judge(&good(&kinds));
        assert!(v.pass(), "{:?}\n{}", v.violations, v.report);
        assert!(v.report.contains("all "));
    }

    #[test]
    fn a_draft_under_two_keys_is_doubled() {
        let kinds = [kind("a", 3, 3, 5)];
        let mut ev = good(&kinds);
        let k3 = "a:2026-01-01:3";
        let body = publish_body(k3, "a", 0);
        ev.calls.push(Call {
            path: "/publish".into(),
            key: Some(k3.into()),
            body: body.clone(),
            status: Some(200),
        });
        ev.applied_publish.insert(k3.into(), body);
        ev.rows.insert(k3.into(), ("published".into(), None));
        ev.executions[2] = exec(k3, "published", None, "3-0");
        let v = judge(&ev);
        assert_eq!(v.doubled, 1, "{:?}", v.violations);
        assert!(!v.pass());
    }

    #[test]
    fn one_key_with_two_drafts_is_doubled() {
        let kinds = [kind("a", 3, 2, 5)];
        let mut ev = good(&kinds);
        let k1 = "a:2026-01-01:1";
        ev.calls.push(Call {
            path: "/publish".into(),
            key: Some(k1.into()),
            body: publish_body(k1, "a", 4),
            status: Some(503),
        });
        let v = judge(&ev);
        assert_eq!(v.doubled, 1, "{:?}", v.violations);
    }

    #[test]
    fn a_published_slot_without_an_effect_is_lost() {
        let kinds = [kind("a", 3, 2, 5)];
        let mut ev = good(&kinds);
        ev.applied_publish.remove("a:2026-01-01:2");
        let v = judge(&ev);
        assert_eq!(v.lost, 1, "{:?}", v.violations);
        assert!(!v.pass());
    }

    #[test]
    fn effects_over_the_cap_or_for_skipped_slots_are_unexpected() {
        let kinds = [kind("a", 3, 2, 5)];
        let mut ev = good(&kinds);
        let k3 = "a:2026-01-01:3";
        ev.applied_publish
            .insert(k3.into(), publish_body(k3, "a", 2));
        let v = judge(&ev);
        // Recorded skipped, and over the cap of 2.
        assert_eq!(v.unexpected, 2, "{:?}", v.violations);
    }

    #[test]
    fn a_duplicate_that_was_not_blocked_fails() {
        let kinds = [kind("a", 3, 2, 5)];
        let mut ev = good(&kinds);
        ev.executions[3] = exec("a:2026-01-01:1", "published", None, "4-0");
        ev.deliveries.push(Delivery {
            fault: Fault::SerialDup,
            entry: Some("4-0".into()),
            slot: Some("a:2026-01-01:1".into()),
            at: Instant::now(),
            after_done: true,
            expect_reason: None,
        });
        let v = judge(&ev);
        assert!(v.violations.len() >= 2, "{:?}", v.violations);
    }

    #[test]
    fn pending_work_unsettled_runs_and_stray_dead_letters_fail() {
        let kinds = [kind("a", 3, 2, 5)];
        let mut ev = good(&kinds);
        ev.residue = (1, 1, 0);
        assert!(!judge(&ev).pass());
        let mut ev = good(&kinds);
        ev.settled = false;
        assert!(!judge(&ev).pass());
        let mut ev = good(&kinds);
        ev.dead.push(HashMap::from([
            ("entry_id".to_owned(), "9-0".to_owned()),
            ("reason".to_owned(), "max_deliveries".to_owned()),
        ]));
        assert!(!judge(&ev).pass());
        let mut ev = good(&kinds);
        ev.rows.remove("a:2026-01-01:3");
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
            after_done: false,
            expect_reason: Some("unknown_kind"),
        });
        let mut row = exec("ghost:2026-01-01:1", "failed", Some("unknown_kind"), "9-0");
        row.caller = "chaos-malformed".into();
        ev.executions.push(row);
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
        // Cap 3 and 5 drafts for 3 slots: all 3 were due, only 2 happened
        // (slotgate skipping a slot it should have published).
        let kinds = [kind("a", 3, 3, 5)];
        let v = judge(&good(&kinds));
        assert_eq!(v.lost, 1, "{:?}", v.violations);
    }
}
