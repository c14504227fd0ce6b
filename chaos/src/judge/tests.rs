//! The judge's own rules, each shown on a small hand-made run: a clean
//! one passes, and each broken rule is caught under its class.

use super::*;
use crate::model::Expect;
use chrono::TimeZone;
use serde_json::json;
use std::collections::HashSet;

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
        wordpress: None,
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
        probe: false,
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
        wordpress: None,
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

#[test]
fn a_delivery_of_a_slot_a_schedule_edit_removed_is_turned_away_not_a_second_outcome() {
    let kinds = [kind("a", 3, 2, 5)];
    let mut ev = good(&kinds);
    // Slot 3's time was removed: cancelled, then a copy of its delivery
    // reached a worker on the new config (DESIGN 4.18).
    ev.rows
        .insert(key(3), row("skipped", Some("unscheduled"), None));
    ev.executions[2] = exec(&key(3), "skipped", Some("unscheduled"), "3-0");
    ev.executions
        .push(exec(&key(3), "failed", Some("unknown_slot"), "5-0"));
    ev.dead.push(HashMap::from([
        ("entry_id".to_owned(), "5-0".to_owned()),
        ("reason".to_owned(), "unknown_slot".to_owned()),
    ]));
    let v = judge(&ev);
    assert!(v.pass(), "{:?}", v.violations);
    // The same beside a slot that was not cancelled is a second outcome
    // and a dead letter nothing explains.
    ev.rows
        .insert(key(3), row("skipped", Some("quota_full"), None));
    ev.executions[2] = exec(&key(3), "skipped", Some("quota_full"), "3-0");
    let v = judge(&ev);
    assert!(v.count(Class::Outcome) >= 1, "{:?}", v.violations);
    assert!(v.count(Class::DeadLetter) >= 1, "{:?}", v.violations);
}

/// A probe of slot `no`'s key arriving `after_ms` after it was due,
/// answered `status` at once.
fn probe(no: u32, status: u16, after_ms: i64) -> Call {
    let at: SystemTime = (due(no) + chrono::Duration::milliseconds(after_ms)).into();
    Call {
        path: "/probe".into(),
        key: Some(key(no)),
        body: Value::Null,
        status: Some(status),
        at,
        answered_at: Some(at + Duration::from_millis(2)),
    }
}

/// `--cms probe`, slot 1: the POST was held 2.5 s before the CMS applied
/// it (the client's try timed out at 1 s), the worker's probes were
/// answered 409 twice, then 200; slotgate recorded it published.
fn held_then_probed(kinds: &[KindSpec]) -> Evidence<'_> {
    let mut ev = good(kinds);
    ev.probe = true;
    ev.calls[0] = call(1, 0, 200, 100, 2500);
    ev.calls.extend([
        probe(1, 409, 1150),
        probe(1, 409, 1400),
        probe(1, 200, 2800),
    ]);
    ev.executions[0].detail = json!({"found_applied": true});
    ev
}

#[test]
fn probe_cms_a_key_applied_once_after_409_probes_passes_and_twice_is_applied_twice() {
    let kinds = [kind("a", 3, 2, 5)];
    let ev = held_then_probed(&kinds);
    let v = judge(&ev);
    assert!(v.pass(), "{:?}\n{}", v.violations, v.report);
    assert_eq!(v.effects, 2);
    assert!(v.report.contains("409 ×2, 200 ×1"), "{}", v.report);

    // The probe said 404 while the POST was still being applied, and the
    // re-send was applied too: two articles under one key.
    let mut ev = held_then_probed(&kinds);
    ev.calls.truncate(2);
    ev.calls
        .extend([probe(1, 404, 1150), call(1, 0, 200, 1300, 30)]);
    let v = judge(&ev);
    assert_eq!(classes(&v), ["applied_twice"], "{:?}", v.violations);
    assert_eq!(v.json(1, Duration::from_secs(20), 3)["applied_twice"], 1);
    // Nothing excuses it: not a kill with the slot in reach, not the late
    // answer the first POST got (the webhook scenario's CMS, which dedupes,
    // would call both a harmless replay).
    ev.faults.push(FaultRecord {
        fault: Fault::Kill9,
        affected: HashSet::from([key(1)]),
        injected: true,
        verified: true,
    });
    assert_eq!(classes(&judge(&ev)), ["applied_twice"]);
    ev.probe = false;
    ev.calls.retain(|c| c.path != "/probe");
    assert!(judge(&ev).pass(), "{:?}", judge(&ev).violations);
}

#[test]
fn probe_cms_a_failed_slot_the_cms_applied_late_is_failed_with_effect() {
    // Slot 2 recorded failed; the CMS applied its POST 1.5 s after it
    // arrived. The webhook scenario excuses it (slotgate never saw the
    // answer); with a probe_url slotgate could ask, so the probe
    // scenario does not.
    let kinds = [kind("a", 3, 3, 5)];
    let mut ev = good(&kinds);
    ev.rows
        .insert(key(2), row("failed", Some("publish_error"), Some(1)));
    ev.executions[1] = exec(&key(2), "failed", Some("publish_error"), "2-0");
    ev.rows
        .insert(key(3), row("skipped", Some("no_ready_draft"), None));
    ev.executions[2] = exec(&key(3), "skipped", Some("no_ready_draft"), "3-0");
    ev.ready_left.insert("a".into(), 0);
    let kinds2 = [kind("a", 3, 3, 2)];
    ev.kinds = &kinds2;
    ev.calls[1] = call(2, 1, 200, 100, 1500);
    assert!(judge(&ev).pass(), "{:?}", judge(&ev).violations);
    ev.probe = true;
    assert_eq!(classes(&judge(&ev)), ["failed_with_effect"]);
}

#[test]
fn probe_calls_are_unexpected_unless_the_run_has_a_probe_url() {
    let kinds = [kind("a", 3, 2, 5)];
    let mut ev = good(&kinds);
    ev.calls.push(probe(1, 200, 500));
    assert_eq!(classes(&judge(&ev)), ["unexpected"]);
    ev.probe = true;
    assert!(judge(&ev).pass(), "{:?}", judge(&ev).violations);
}
