//! The batch path (`Executor::batch`, `store::gate_batch`,
//! `store::finish_batch`): it writes the rows the one-delivery path
//! writes, decides only the plain case and leaves everything else untouched
//! for that path, writes nothing when a cap cannot cover it, concurrent
//! overlapping batches neither deadlock nor publish a slot twice, webhook
//! calls of a batch overlap, a taken-over claim is fenced, and a batch
//! abandoned mid-publish is resumed under the same key.

use crate::common;

use crate::common::{kind_toml, today, yesterday, Env};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde_json::{json, Value};
use slotgate::executor::Handled;
use slotgate::outcome::{Outcome, SkipReason};

/// A kind whose slots are late one hour after they were due.
fn strict_kind(name: &str, slots: &[&str]) -> String {
    kind_toml(name, slots, 10, "").replace("\"48h\"", "\"1h\"")
}

/// slot, state, reason, claim expired-or-cleared, attempt, draft, response.
type SlotRow = (i32, String, Option<String>, bool, i32, Option<i64>, Value);
/// slot, outcome, reason, detail, worker, has an entry id, times are sane.
type ExecRow = (i32, String, Option<String>, Value, String, bool, bool);

async fn deliver(env: &Env, key: &str, caller: &str) {
    env.queue.deliver(key, caller, 0).await.unwrap();
}

/// Plans today, delivers `kind`'s slots 1..=n once each (caller `planner`)
/// and reads them back as consumer `w`, in slot order.
async fn planned_deliveries(env: &Env, kind: &str, n: u32) -> Vec<slotgate::queue::Delivery> {
    env.planner().plan(Some(today()), &[], false).await.unwrap();
    for i in 1..=n {
        deliver(env, &format!("{kind}:{}:{i}", today()), "planner").await;
    }
    env.read_all("w").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_writes_the_rows_one_delivery_writes() {
    let env = Env::new(&kind_toml(
        "news",
        &["00:00", "00:00:01", "00:00:02", "00:00:03"],
        10,
        "",
    ))
    .await;
    let drafts = env.add_drafts("news", 4).await;
    env.planner().plan(Some(today()), &[], false).await.unwrap();
    for n in [4, 1, 2, 3] {
        deliver(&env, &format!("news:{}:{n}", today()), "planner").await;
    }
    let ds = env.read_all("w").await;
    assert_eq!(ds.len(), 4);
    let exec = env.executor("w");
    // Slot 4 the one-delivery way, then slots 1–3 as one batch.
    assert_eq!(
        exec.handle(&ds[0]).await.unwrap(),
        Handled::Recorded(Outcome::Published)
    );
    let mut settled = exec.batch(&ds[1..]).await.unwrap();
    settled.sort();
    assert_eq!(settled, vec![0, 1, 2]);

    let slots: Vec<SlotRow> = sqlx::query_as(
        "SELECT slot, state, reason, claim_expires_at IS NULL, attempt, post_id, response
           FROM publish_slot ORDER BY slot",
    )
    .fetch_all(&env.db.pool)
    .await
    .unwrap();
    assert_eq!(slots.len(), 4);
    // The oldest ready draft goes first: slot 4 (handled first) took the
    // oldest, then the batch handed out the rest in slot order.
    let expect_draft = [drafts[1], drafts[2], drafts[3], drafts[0]];
    for (i, (slot, state, reason, no_expiry, attempt, post_id, response)) in
        slots.iter().enumerate()
    {
        assert_eq!(*slot, i as i32 + 1);
        assert_eq!(
            (state.as_str(), reason, *no_expiry, *attempt),
            ("published", &None, true, 1),
            "slot {slot}"
        );
        assert_eq!(*post_id, Some(expect_draft[i]), "slot {slot}");
        let url = format!("record-only://news/{}", expect_draft[i]);
        assert_eq!(*response, json!({"url": url, "record_only": true}));
    }
    let execs: Vec<ExecRow> = sqlx::query_as(
        "SELECT slot, outcome, reason, detail, worker_id, entry_id IS NOT NULL,
                due_at IS NOT NULL AND started_at <= finished_at
           FROM execution ORDER BY slot",
    )
    .fetch_all(&env.db.pool)
    .await
    .unwrap();
    assert_eq!(execs.len(), 4);
    for (i, (slot, outcome, reason, detail, worker, has_entry, times)) in execs.iter().enumerate() {
        let url = format!("record-only://news/{}", expect_draft[i]);
        assert_eq!(
            (
                outcome.as_str(),
                reason,
                detail,
                worker.as_str(),
                *has_entry,
                *times
            ),
            ("published", &None, &json!({ "url": url }), "w", true, true),
            "slot {slot}"
        );
    }
    let drafts_ok = testkit::count(
        &env.db.pool,
        "SELECT count(*) FROM draft d JOIN publish_slot s ON s.post_id = d.id
          WHERE d.status = 'published' AND d.url = s.response->>'url'
            AND d.slot_key = s.kind || ':' || s.day || ':' || s.slot AND d.published_at IS NOT NULL",
    )
    .await;
    assert_eq!(drafts_ok, 4);
    assert_eq!(
        testkit::count(&env.db.pool, "SELECT used::bigint FROM daily_quota").await,
        4
    );
    let d = env.queue.depths(0).await.unwrap();
    assert_eq!(
        (d.ready, d.pending),
        (0, 0),
        "the batch acknowledged its entries"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_decides_only_plain_slots_and_leaves_the_rest_untouched() {
    let toml = [
        kind_toml(
            "news",
            &["00:00", "00:00:01", "00:00:02", "00:00:03"],
            10,
            "",
        ),
        kind_toml("empty", &["00:00"], 10, ""),
        strict_kind("strict", &["00:00", "00:00:01"]),
    ]
    .concat();
    let env = Env::new(&toml).await;
    let news = env.add_drafts("news", 5).await;
    env.add_drafts("strict", 2).await;
    let (day, yesterday) = (today(), yesterday());
    env.planner().plan(Some(day), &[], false).await.unwrap();
    env.planner()
        .plan(Some(yesterday), &[], false)
        .await
        .unwrap();
    sqlx::query("DELETE FROM planned_slot WHERE kind = 'news' AND slot = 4")
        .execute(&env.db.pool)
        .await
        .unwrap();
    // The operator asked for yesterday's strict:2 (`planner trigger`
    // writes this before its delivery); strict:1's lateness is unasked.
    slotgate::store::request_exemptions(
        &env.db.pool,
        &[slotgate::slot::SlotKey::new("strict", yesterday, 2)],
        slotgate::store::Requester::Manual,
        false,
        "test",
    )
    .await
    .unwrap();
    let exec = env.executor("w");
    // news:1 is finished before the batch runs.
    deliver(&env, &format!("news:{day}:1"), "planner").await;
    let first = env.read_all("w").await;
    exec.handle(&first[0]).await.unwrap();

    let batch = [
        (format!("news:{day}:1"), "planner"),         // gate row exists
        (format!("news:{day}:2"), "planner"),         // plain
        (format!("news:{day}:2"), "cron"),            // duplicate inside the batch
        (format!("empty:{day}:1"), "planner"),        // no ready draft
        (format!("strict:{yesterday}:1"), "planner"), // past its starting deadline
        (format!("strict:{yesterday}:2"), "manual"),  // late, but exempt
        (format!("news:{day}:4"), "planner"),         // never planned
    ];
    for (key, caller) in &batch {
        deliver(&env, key, caller).await;
    }
    let ds = env.read_all("w").await;
    assert_eq!(ds.len(), batch.len());
    let mut settled = exec.batch(&ds).await.unwrap();
    settled.sort();
    assert_eq!(settled, vec![1, 5], "only the plain slots");
    // What was deferred left no trace.
    let gates: Vec<String> =
        sqlx::query_scalar("SELECT kind || ':' || slot FROM publish_slot ORDER BY 1")
            .fetch_all(&env.db.pool)
            .await
            .unwrap();
    assert_eq!(gates, vec!["news:1", "news:2", "strict:2"]);
    // A slot that already has its gate row takes no draft: news:2 got the
    // oldest draft left after news:1's, and only those two left `ready`.
    let bound: Vec<(i32, i64)> =
        sqlx::query_as("SELECT slot, post_id FROM publish_slot WHERE kind = 'news' ORDER BY slot")
            .fetch_all(&env.db.pool)
            .await
            .unwrap();
    assert_eq!(bound, vec![(1, news[0]), (2, news[1])]);
    let taken: Vec<i64> = sqlx::query_scalar(
        "SELECT id FROM draft WHERE kind = 'news' AND status <> 'ready' ORDER BY id",
    )
    .fetch_all(&env.db.pool)
    .await
    .unwrap();
    assert_eq!(taken, vec![news[0], news[1]]);
    let used: Vec<(String, i32)> =
        sqlx::query_as("SELECT kind, used FROM daily_quota WHERE used > 0 ORDER BY 1")
            .fetch_all(&env.db.pool)
            .await
            .unwrap();
    assert_eq!(used, vec![("news".into(), 2), ("strict".into(), 1)]);
    assert_eq!(env.executions().await, 3);
    let d = env.queue.depths(0).await.unwrap();
    assert_eq!(d.pending, 5, "deferred entries stay unacknowledged");

    // The one-delivery path then decides each deferred delivery.
    let expect = [
        Outcome::Skipped(SkipReason::SlotTaken),
        Outcome::Skipped(SkipReason::SlotTaken),
        Outcome::Skipped(SkipReason::NoReadyDraft),
        Outcome::Skipped(SkipReason::MissedDeadline),
        Outcome::Published,
    ];
    for (i, want) in [0, 2, 3, 4, 6].into_iter().zip(expect) {
        assert_eq!(
            exec.handle(&ds[i]).await.unwrap(),
            Handled::Recorded(want),
            "{:?}",
            batch[i]
        );
    }
    let o = env.outcomes().await;
    assert_eq!(o.get("published"), Some(&4), "{o:?}");
    assert_eq!(o.get("skipped/slot_taken"), Some(&2), "{o:?}");
    assert_eq!(env.queue.depths(0).await.unwrap().pending, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cap_that_cannot_cover_the_batch_writes_nothing() {
    let env = Env::new(&kind_toml(
        "news",
        &["00:00", "00:00:01", "00:00:02", "00:00:03"],
        2,
        "",
    ))
    .await;
    env.add_drafts("news", 4).await;
    let ds = planned_deliveries(&env, "news", 4).await;
    let exec = env.executor("w");
    assert_eq!(exec.batch(&ds).await.unwrap(), Vec::<usize>::new());
    let written = testkit::count(
        &env.db.pool,
        "SELECT (SELECT count(*) FROM publish_slot) + (SELECT count(*) FROM execution)
              + (SELECT coalesce(sum(used), 0) FROM daily_quota)
              + (SELECT count(*) FROM draft WHERE status <> 'ready')",
    )
    .await;
    assert_eq!(written, 0, "the whole batch rolled back");
    for d in &ds {
        exec.handle(d).await.unwrap();
    }
    let o = env.outcomes().await;
    assert_eq!(o.get("published"), Some(&2), "{o:?}");
    assert_eq!(o.get("skipped/quota_full"), Some(&2), "{o:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_overlapping_batches_publish_each_slot_once() {
    let times: Vec<String> = (0..20).map(|s| format!("00:00:{s:02}")).collect();
    let times: Vec<&str> = times.iter().map(String::as_str).collect();
    let toml = [
        kind_toml("a", &times, 100, ""),
        kind_toml("b", &times, 100, ""),
    ]
    .concat();
    let env = Env::new(&toml).await;
    env.add_drafts("a", 25).await;
    env.add_drafts("b", 25).await;
    env.planner().plan(Some(today()), &[], false).await.unwrap();
    // Every slot three times, from three callers.
    for caller in ["planner", "manual", "cron"] {
        for kind in ["a", "b"] {
            for n in 1..=20 {
                deliver(&env, &format!("{kind}:{}:{n}", today()), caller).await;
            }
        }
    }
    let ds = env.read_all("w").await;
    assert_eq!(ds.len(), 120);
    // Eight batches of 32 random entries race; an entry may be in several.
    let mut rng = rand::rngs::StdRng::seed_from_u64(20261129);
    let batches: Vec<Vec<_>> = (0..8)
        .map(|_| ds.choose_multiple(&mut rng, 32).cloned().collect())
        .collect();
    let tasks: Vec<_> = batches
        .into_iter()
        .enumerate()
        .map(|(i, b)| {
            let exec = env.executor(&format!("w{i}"));
            tokio::spawn(async move { exec.batch(&b).await.map(|s| s.len()) })
        })
        .collect();
    let mut settled = 0;
    for t in tasks {
        // An error here would be a deadlock or a unique violation.
        settled += t.await.unwrap().expect("a batch failed");
    }
    assert!(settled > 0, "the batches settled nothing");
    assert!(settled <= 40, "{settled} settled for 40 slots");
    // Everything else, and every entry again, the one-delivery way.
    let exec = env.executor("w");
    for d in &ds {
        exec.handle(d).await.unwrap();
    }
    assert_eq!(env.executions().await, 120, "one row per entry");
    let o = env.outcomes().await;
    assert_eq!(o.get("published"), Some(&40), "{o:?}");
    assert_eq!(o.get("skipped/slot_taken"), Some(&80), "{o:?}");
    let one_each = testkit::count(
        &env.db.pool,
        "SELECT count(DISTINCT slot_key) FROM draft WHERE status = 'published'",
    )
    .await;
    assert_eq!(one_each, 40);
    assert_eq!(
        testkit::count(
            &env.db.pool,
            "SELECT count(*) FROM draft WHERE status = 'published'"
        )
        .await,
        40
    );
    let used: Vec<i32> = sqlx::query_scalar("SELECT used FROM daily_quota ORDER BY kind")
        .fetch_all(&env.db.pool)
        .await
        .unwrap();
    assert_eq!(used, vec![20, 20]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_batch_a_burst_with_duplicates_and_publish_each_slot_once() {
    let times: Vec<String> = (0..60).map(|s| format!("00:00:{s:02}")).collect();
    let times: Vec<&str> = times.iter().map(String::as_str).collect();
    let toml = [
        kind_toml("a", &times, 50, ""),
        kind_toml("b", &times, 100, ""),
    ]
    .concat();
    let env = Env::new(&toml).await;
    env.add_drafts("a", 60).await;
    env.add_drafts("b", 40).await;
    // Every slot planned (and promoted by the leader), and delivered once
    // more by hand before any worker runs.
    env.planner().plan(Some(today()), &[], false).await.unwrap();
    for kind in ["a", "b"] {
        for n in 1..=60 {
            deliver(&env, &format!("{kind}:{}:{n}", today()), "manual").await;
        }
    }
    let workers = env.start_workers(3, |o| {
        o.concurrency = 4;
        o.batch = 16;
    });
    env.wait_executions(240, common::T).await;
    workers.stop().await;
    let o = env.outcomes().await;
    // a: 60 slots, cap 50 → 50 published, 10 quota_full.
    // b: 60 slots, 40 drafts → 40 published, 20 no_ready_draft.
    assert_eq!(o.get("published"), Some(&90), "{o:?}");
    assert_eq!(o.get("skipped/quota_full"), Some(&10), "{o:?}");
    assert_eq!(o.get("skipped/no_ready_draft"), Some(&20), "{o:?}");
    assert_eq!(o.get("skipped/slot_taken"), Some(&120), "{o:?}");
    assert_eq!(env.executions().await, 240);
    let doubled = testkit::count(
        &env.db.pool,
        "SELECT count(*) FROM (SELECT slot_key FROM draft WHERE status = 'published'
                                GROUP BY slot_key HAVING count(*) > 1) x",
    )
    .await;
    assert_eq!(doubled, 0);
    let used: Vec<i32> = sqlx::query_scalar("SELECT used FROM daily_quota ORDER BY kind")
        .fetch_all(&env.db.pool)
        .await
        .unwrap();
    assert_eq!(used, vec![50, 40]);
    let d = env.queue.depths(0).await.unwrap();
    assert_eq!((d.ready, d.pending), (0, 0));
}

/// A kind publishing to the stand-in CMS, with the test's short retry policy.
async fn webhook_env(slots: &[&str]) -> (Env, testkit::cms::Cms) {
    let cms = testkit::cms::Cms::start().await;
    let env = Env::new(&kind_toml("news", slots, 10, &common::publish_to(&cms))).await;
    (env, cms)
}

fn fast_retries(mut exec: slotgate::executor::Executor) -> slotgate::executor::Executor {
    exec.retry_override = Some(slotgate::retry::RetryPolicy {
        max_attempts: 2,
        base: std::time::Duration::from_millis(10),
        cap: std::time::Duration::from_millis(20),
    });
    exec
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_batch_publishes_concurrently_and_records_like_one_delivery() {
    let (env, cms) = webhook_env(&["00:00", "00:00:01", "00:00:02", "00:00:03"]).await;
    env.add_drafts("news", 4).await;
    env.planner().plan(Some(today()), &[], false).await.unwrap();
    // Slot 3's CMS answers 400 (not retried); every call takes 300 ms, so
    // one-at-a-time publishing would take 900 ms for the batch.
    let bad = format!("news:{}:3", today());
    cms.set_chooser(Some(std::sync::Arc::new(move |_, key, _| {
        Some(if key == Some(bad.as_str()) {
            testkit::cms::Reply::Status(400)
        } else {
            testkit::cms::Reply::Delay(std::time::Duration::from_millis(300), 200)
        })
    })));
    for n in [4, 1, 2, 3] {
        deliver(&env, &format!("news:{}:{n}", today()), "planner").await;
    }
    let ds = env.read_all("w").await;
    let exec = fast_retries(env.executor("w"));
    assert_eq!(
        exec.handle(&ds[0]).await.unwrap(),
        Handled::Recorded(Outcome::Published)
    );
    // While the batch runs, both its 300 ms calls must be in flight at once.
    let saw_two = {
        let cms = cms.clone();
        tokio::spawn(async move {
            testkit::wait_for("two calls in flight", common::T, || async {
                (cms.in_flight() >= 2).then_some(())
            })
            .await
        })
    };
    let mut settled = exec.batch(&ds[1..]).await.unwrap();
    saw_two.await.unwrap();
    settled.sort();
    assert_eq!(settled, vec![0, 1, 2]);

    type Row = (i32, String, Option<String>, bool, Option<Value>);
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT slot, state, reason, claim_expires_at IS NULL, response FROM publish_slot ORDER BY slot",
    )
    .fetch_all(&env.db.pool)
    .await
    .unwrap();
    let states: Vec<(&str, Option<&str>, bool)> = rows
        .iter()
        .map(|r| (r.1.as_str(), r.2.as_deref(), r.3))
        .collect();
    assert_eq!(
        states,
        vec![
            ("published", None, true),
            ("published", None, true),
            ("failed", Some("publish_error"), true),
            ("published", None, true)
        ]
    );
    for r in rows.iter().filter(|r| r.1 == "published") {
        let url =
            r.4.as_ref()
                .and_then(|v| v.get("url"))
                .and_then(Value::as_str);
        assert!(
            url.is_some_and(|u| u.starts_with("https://cms.test/")),
            "{r:?}"
        );
    }
    let execs: Vec<(i32, String, Option<String>, Value)> =
        sqlx::query_as("SELECT slot, outcome, reason, detail FROM execution ORDER BY slot")
            .fetch_all(&env.db.pool)
            .await
            .unwrap();
    let shape: Vec<(String, Option<String>, Vec<String>)> = execs
        .iter()
        .map(|(_, o, r, d)| {
            let mut keys: Vec<String> = d.as_object().unwrap().keys().cloned().collect();
            keys.sort();
            (o.clone(), r.clone(), keys)
        })
        .collect();
    let published = (
        "published".to_owned(),
        None,
        vec!["attempts".to_owned(), "url".to_owned()],
    );
    assert_eq!(shape[0], published, "batched");
    assert_eq!(shape[3], published, "one delivery");
    assert_eq!(
        shape[2],
        (
            "failed".to_owned(),
            Some("publish_error".to_owned()),
            vec!["publish_error".to_owned()]
        )
    );
    // Drafts: three published with the CMS's URL, the failed one kept.
    let drafts: Vec<(String, Option<String>)> =
        sqlx::query_as("SELECT status, url FROM draft ORDER BY slot_key")
            .fetch_all(&env.db.pool)
            .await
            .unwrap();
    assert_eq!(
        drafts.iter().map(|d| d.0.as_str()).collect::<Vec<_>>(),
        vec!["published", "published", "failed", "published"]
    );
    // One call per slot, each under its slot's key.
    let mut keys: Vec<String> = cms
        .calls_to("/publish")
        .into_iter()
        .filter_map(|c| c.key)
        .collect();
    keys.sort();
    let want: Vec<String> = (1..=4).map(|n| format!("news:{}:{n}", today())).collect();
    assert_eq!(keys, want);
    assert_eq!(env.queue.depths(0).await.unwrap().pending, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_whose_claim_was_taken_over_records_slot_taken_and_changes_nothing() {
    let (env, cms) = webhook_env(&["00:00", "00:00:01"]).await;
    env.add_drafts("news", 2).await;
    cms.script(
        "/publish",
        [
            testkit::cms::Reply::Delay(std::time::Duration::from_millis(800), 200),
            testkit::cms::Reply::Delay(std::time::Duration::from_millis(800), 200),
        ],
    );
    let ds = planned_deliveries(&env, "news", 2).await;
    let exec = env.executor("w");
    let run = tokio::spawn(async move { exec.batch(&ds).await });
    testkit::wait_for("two calls in flight", common::T, || async {
        (cms.in_flight() >= 2).then_some(())
    })
    .await;
    // Slot 1 is taken over (as after a lapsed claim) while its call runs.
    sqlx::query("UPDATE publish_slot SET claimed_by = 'other', attempt = 2 WHERE slot = 1")
        .execute(&env.db.pool)
        .await
        .unwrap();
    let mut settled = run.await.unwrap().unwrap();
    settled.sort();
    assert_eq!(settled, vec![0, 1], "both decided and acknowledged");
    let rows: Vec<(i32, String, String, i32)> =
        sqlx::query_as("SELECT slot, state, claimed_by, attempt FROM publish_slot ORDER BY slot")
            .fetch_all(&env.db.pool)
            .await
            .unwrap();
    assert_eq!(
        rows,
        vec![
            (1, "publishing".into(), "other".into(), 2),
            (2, "published".into(), "w".into(), 1)
        ]
    );
    let lost: Vec<(i32, String, Option<String>, Value)> =
        sqlx::query_as("SELECT slot, outcome, reason, detail FROM execution ORDER BY slot")
            .fetch_all(&env.db.pool)
            .await
            .unwrap();
    assert_eq!(lost[0].1, "skipped");
    assert_eq!(lost[0].2.as_deref(), Some("slot_taken"));
    assert_eq!(lost[0].3["claim_lost"], json!(true));
    assert_eq!(lost[1].1, "published");
    let draft1: String = sqlx::query_scalar(
        "SELECT d.status FROM draft d JOIN publish_slot s ON s.post_id = d.id WHERE s.slot = 1",
    )
    .fetch_one(&env.db.pool)
    .await
    .unwrap();
    assert_eq!(draft1, "publishing", "the new owner finishes the draft");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_abandoned_mid_publish_is_resumed_under_the_same_key() {
    let (env, cms) = webhook_env(&["00:00", "00:00:01"]).await;
    env.add_drafts("news", 2).await;
    cms.script(
        "/publish",
        [
            testkit::cms::Reply::Delay(std::time::Duration::from_secs(3), 200),
            testkit::cms::Reply::Delay(std::time::Duration::from_secs(3), 200),
        ],
    );
    let ds = planned_deliveries(&env, "news", 2).await;
    let exec = env.executor("w");
    let batch = ds.clone();
    let run = tokio::spawn(async move { exec.batch(&batch).await });
    testkit::wait_for("two calls in flight", common::T, || async {
        (cms.in_flight() >= 2).then_some(())
    })
    .await;
    // The worker dies mid-publish: its claims stay open, nothing recorded.
    run.abort();
    let _ = run.await;
    assert_eq!(env.executions().await, 0);
    let open = testkit::count(
        &env.db.pool,
        "SELECT count(*) FROM publish_slot WHERE state = 'publishing' AND claimed_by = 'w'",
    )
    .await;
    assert_eq!(open, 2);
    // The claims lapse; the unacknowledged entries come round again.
    sqlx::query("UPDATE publish_slot SET claim_expires_at = now() - interval '1 second'")
        .execute(&env.db.pool)
        .await
        .unwrap();
    let other = env.executor("w2");
    for d in &ds {
        assert_eq!(
            other.handle(d).await.unwrap(),
            Handled::Recorded(Outcome::Published)
        );
    }
    let resumed = testkit::count(
        &env.db.pool,
        "SELECT count(*) FROM execution WHERE outcome = 'published' AND detail->>'resumed' = 'true'",
    )
    .await;
    assert_eq!(resumed, 2);
    // Each slot's calls carried its own key both times: one effect per slot.
    let calls = cms.calls_to("/publish");
    assert_eq!(calls.len(), 4);
    for n in 1..=2 {
        let key = format!("news:{}:{n}", today());
        assert_eq!(
            calls
                .iter()
                .filter(|c| c.key.as_deref() == Some(&key))
                .count(),
            2
        );
    }
    testkit::wait_for("the delayed first calls to land", common::T, || async {
        (cms.in_flight() == 0).then_some(())
    })
    .await;
    assert_eq!(cms.applied("/publish").len(), 2, "one effect per slot");
}

/// Has the CMS hold the publish calls of today's `news` slots `slots` open
/// until each one's handle is notified; the others answer at once.
fn hold_at_cms(
    cms: &testkit::cms::Cms,
    slots: &[u32],
) -> std::collections::HashMap<String, std::sync::Arc<tokio::sync::Notify>> {
    let holds: std::collections::HashMap<String, std::sync::Arc<tokio::sync::Notify>> = slots
        .iter()
        .map(|n| (format!("news:{}:{n}", today()), Default::default()))
        .collect();
    let chooser = holds.clone();
    cms.set_chooser(Some(std::sync::Arc::new(move |_, key, _| {
        key.and_then(|k| chooser.get(k))
            .map(|n| testkit::cms::Reply::Hold(n.clone(), 200))
    })));
    holds
}

/// Each pending entry of the stream with its idle time in ms, by entry id.
async fn idle_ms(env: &Env) -> std::collections::HashMap<String, i64> {
    let mut c = env.redis.conn().await;
    let rows: Vec<(String, String, i64, i64)> = redis::cmd("XPENDING")
        .arg(
            slotgate::queue::KeySpace::new(env.redis.prefix.as_str())
                .part(0)
                .ready(),
        )
        .arg(slotgate::queue::GROUP)
        .arg("-")
        .arg("+")
        .arg(100)
        .query_async(&mut c)
        .await
        .unwrap();
    rows.into_iter()
        .map(|(id, _, idle, _)| (id, idle))
        .collect()
}

/// The claims' expiries by slot, and Postgres's clock.
async fn expiries(
    env: &Env,
) -> (
    std::collections::HashMap<i32, chrono::DateTime<chrono::Utc>>,
    chrono::DateTime<chrono::Utc>,
) {
    let rows: Vec<(i32, chrono::DateTime<chrono::Utc>)> = sqlx::query_as(
        "SELECT slot, claim_expires_at FROM publish_slot WHERE claim_expires_at IS NOT NULL",
    )
    .fetch_all(&env.db.pool)
    .await
    .unwrap();
    let now: chrono::DateTime<chrono::Utc> = sqlx::query_scalar("SELECT clock_timestamp()")
        .fetch_one(&env.db.pool)
        .await
        .unwrap();
    (rows.into_iter().collect(), now)
}

/// One heartbeat keeps every claim of a batch alive — its gate rows and
/// its stream entries — for as long as the batch waits on its slowest
/// call, even one whose own call is long done; a claim taken over meanwhile
/// is dropped from it (not renewed again) and recorded as lost by it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_heartbeat_keeps_every_claim_of_a_batch_alive_and_drops_one_taken_over() {
    let (env, cms) = webhook_env(&["00:00", "00:00:01", "00:00:02"]).await;
    env.add_drafts("news", 3).await;
    // Every call is held at the CMS until released.
    let holds = hold_at_cms(&cms, &[1, 2, 3]);
    let ds = planned_deliveries(&env, "news", 3).await;
    let entries: Vec<String> = ds.iter().map(|d| d.entry_id.clone()).collect();
    let mut exec = env.executor("w");
    // A beat every 200 ms.
    exec.visibility = std::time::Duration::from_millis(600);
    let run = tokio::spawn(async move { exec.batch(&ds).await });
    testkit::wait_for("slots 1, 2 and 3 held at the CMS", common::T, || async {
        (cms.calls_to("/publish").len() == 3 && cms.in_flight() == 3).then_some(())
    })
    .await;
    // Every claim renewed past the expiry it was written with, by the one
    // heartbeat of the walk.
    let (first, _) = expiries(&env).await;
    assert_eq!(first.len(), 3, "three open claims: {first:?}");
    testkit::wait_for(
        "all three claims renewed past their first expiry",
        common::T,
        || async {
            let (now, at) = expiries(&env).await;
            (at > *first.values().max().unwrap()
                && (1..=3).all(|s| now.get(&s).is_some_and(|e| *e > at)))
            .then_some(())
        },
    )
    .await;
    // The entries' idle times are reset too. They were read before the
    // gate, over 600 ms ago by Postgres's clock now: untouched, each would
    // be idle longer than that.
    testkit::wait_for("the entries touched", common::T, || async {
        let idle = idle_ms(&env).await;
        entries
            .iter()
            .all(|e| idle.get(e).is_some_and(|i| *i < 400))
            .then_some(())
    })
    .await;
    // Slot 2 is taken over while its call runs: the heartbeat renews it no
    // more, and goes on renewing slots 1 and 3.
    let taken: chrono::DateTime<chrono::Utc> = sqlx::query_scalar(
        "UPDATE publish_slot SET claimed_by = 'other', attempt = 2 WHERE slot = 2 RETURNING claim_expires_at",
    )
    .fetch_one(&env.db.pool)
    .await
    .unwrap();
    testkit::wait_for(
        "slots 1 and 3 renewed well past slot 2's expiry",
        common::T,
        || async {
            let (now, _) = expiries(&env).await;
            let far = taken + chrono::Duration::milliseconds(1000);
            (now[&1] > far && now[&3] > far).then_some(())
        },
    )
    .await;
    let (now, _) = expiries(&env).await;
    assert_eq!(
        now[&2], taken,
        "the taken-over claim is not renewed by its old owner"
    );
    for n in holds.values() {
        n.notify_one();
    }
    let mut settled = run.await.unwrap().unwrap();
    settled.sort();
    assert_eq!(settled, vec![0, 1, 2]);
    let rows: Vec<(i32, String, Option<String>, Value)> =
        sqlx::query_as("SELECT slot, outcome, reason, detail FROM execution ORDER BY slot")
            .fetch_all(&env.db.pool)
            .await
            .unwrap();
    assert_eq!(
        rows.iter()
            .map(|r| (r.0, r.1.as_str(), r.2.as_deref()))
            .collect::<Vec<_>>(),
        vec![
            (1, "published", None),
            (2, "skipped", Some("slot_taken")),
            (3, "published", None)
        ]
    );
    assert_eq!(
        rows[1].3["heartbeat_saw_loss"],
        json!(true),
        "{:?}",
        rows[1].3
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_call_holds_up_only_its_own_record_and_its_own_call_permit() {
    let (env, cms) = webhook_env(&["00:00", "00:00:01", "00:00:02", "00:00:03"]).await;
    env.add_drafts("news", 4).await;
    // Slot 3 is held at the CMS until released; the others answer at once.
    let holds = hold_at_cms(&cms, &[3]);
    let ds = planned_deliveries(&env, "news", 4).await;
    let exec = env.executor("w");
    // Each token stands for a permit: its receiver sees it released.
    let (gate, mut gate_released) = tokio::sync::oneshot::channel::<()>();
    let (calls, mut calls_released): (Vec<_>, Vec<_>) = (0..4)
        .map(|_| tokio::sync::oneshot::channel::<()>())
        .unzip();
    let permits = slotgate::executor::Permits {
        gate: Some(gate),
        calls: calls.into_iter().map(Some).collect(),
    };
    let run = tokio::spawn(async move { exec.batch_holding(&ds, permits).await });
    testkit::wait_for("slot 3 held at the CMS", common::T, || async {
        (cms.in_flight() == 1 && cms.calls_to("/publish").len() == 4).then_some(())
    })
    .await;
    // The three calls that returned are recorded and acknowledged, and
    // their permits and the gate's released, while slot 3's call is open.
    testkit::wait_for("slots 1, 2 and 4 recorded", common::T, || async {
        let n = testkit::count(
            &env.db.pool,
            "SELECT count(*) FROM execution WHERE outcome = 'published' AND slot IN (1, 2, 4)",
        )
        .await;
        (n == 3).then_some(())
    })
    .await;
    fn released(rx: &mut tokio::sync::oneshot::Receiver<()>) -> bool {
        matches!(
            rx.try_recv(),
            Err(tokio::sync::oneshot::error::TryRecvError::Closed)
        )
    }
    testkit::wait_for("three call permits released", common::T, || {
        let n = calls_released
            .iter_mut()
            .map(released)
            .filter(|r| *r)
            .count();
        async move { (n == 3).then_some(()) }
    })
    .await;
    assert!(
        released(&mut gate_released),
        "the gate's permit is released before the calls return"
    );
    assert_eq!(cms.in_flight(), 1, "slot 3's call is still open");
    assert_eq!(
        calls_released
            .iter_mut()
            .map(released)
            .filter(|r| *r)
            .count(),
        3,
        "the open call keeps its permit"
    );
    let open = testkit::count(
        &env.db.pool,
        "SELECT count(*) FROM publish_slot WHERE slot = 3 AND state = 'publishing'",
    )
    .await;
    assert_eq!(open, 1, "slot 3 is not recorded before its call returns");
    testkit::wait_for("slots 1, 2 and 4 acknowledged", common::T, || async {
        (env.queue.depths(0).await.unwrap().pending == 1).then_some(())
    })
    .await;
    for n in holds.values() {
        n.notify_one();
    }
    let mut settled = run.await.unwrap().unwrap();
    settled.sort();
    assert_eq!(settled, vec![0, 1, 2, 3]);
    assert!(calls_released.iter_mut().all(released));
    let o = env.outcomes().await;
    assert_eq!(o.get("published"), Some(&4), "{o:?}");
    assert_eq!(env.queue.depths(0).await.unwrap().pending, 0);
    // One call per slot.
    assert_eq!(cms.calls_to("/publish").len(), 4);
}
