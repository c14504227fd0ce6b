//! The gate and the quota: duplicates of one slot, from any caller and at any
//! distance in time, publish once; concurrent slots never pass the cap.

mod common;

use common::{kind_toml, today, Env, T};
use std::time::Duration;
use testkit::cms::Cms;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_concurrent_and_five_serial_duplicates_publish_once() {
    let cms = Cms::start().await;
    let env = Env::new(&kind_toml(
        "article",
        &["00:00"],
        5,
        &common::publish_to(&cms),
    ))
    .await;
    env.add_drafts("article", 3).await;
    let key = format!("article:{}:1", today());
    // Ten copies queued before any worker runs: three workers race for them.
    for _ in 0..10 {
        env.xadd(&[("slot", &key), ("caller", "planner")]).await;
    }
    let workers = env.start_workers(3, |_| {});
    env.wait_executions(10, T).await;
    // Five more, one at a time, each after the previous finished.
    for i in 0..5 {
        env.xadd(&[
            ("slot", &key),
            ("caller", if i % 2 == 0 { "manual" } else { "cron" }),
        ])
        .await;
        env.wait_executions(11 + i, T).await;
    }
    workers.stop().await;
    let o = env.outcomes().await;
    assert_eq!(o.get("published"), Some(&1), "{o:?}");
    assert_eq!(o.get("skipped/slot_taken"), Some(&14), "{o:?}");
    assert_eq!(o.len(), 2, "{o:?}");
    assert_eq!(cms.calls_to("/publish").len(), 1, "the CMS was called once");
    assert_eq!(
        testkit::count(
            &env.db.pool,
            "SELECT count(*) FROM draft WHERE status = 'published'"
        )
        .await,
        1
    );
    // Every duplicate names what it ran into.
    let replay: i64 = testkit::count(
        &env.db.pool,
        "SELECT count(*) FROM execution WHERE reason = 'slot_taken' AND detail ? 'replay'",
    )
    .await;
    assert_eq!(replay, 14);
    // Nothing left pending.
    let d = env
        .queue
        .depths(chrono::Utc::now().timestamp_millis())
        .await
        .unwrap();
    assert_eq!((d.ready, d.pending), (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn planner_trigger_and_backfill_of_one_slot_publish_once() {
    let env = Env::new(&kind_toml("article", &["00:00", "00:00:01"], 5, "")).await;
    env.add_drafts("article", 5).await;
    let day = today();
    let p = env.planner();
    p.plan(Some(day), &[], false).await.unwrap();
    p.trigger("article", day, 1, "manual").await.unwrap();
    let b = p.backfill("article", day, day).await.unwrap();
    assert_eq!(b.delivered.len(), 2, "nothing had an outcome yet: {b:?}");
    let workers = env.start_workers(2, |_| {});
    // planner promotion (2 slots) + trigger (1) + backfill (2) = 5 deliveries.
    env.wait_executions(5, T).await;
    // A backfill after the outcomes exist delivers nothing.
    let again = p.backfill("article", day, day).await.unwrap();
    assert!(again.delivered.is_empty(), "{again:?}");
    workers.stop().await;
    let o = env.outcomes().await;
    assert_eq!(o.get("published"), Some(&2), "one publish per slot: {o:?}");
    assert_eq!(o.get("skipped/slot_taken"), Some(&3), "{o:?}");
    let callers: Vec<String> =
        sqlx::query_scalar("SELECT DISTINCT caller FROM execution ORDER BY 1")
            .fetch_all(&env.db.pool)
            .await
            .unwrap();
    assert_eq!(callers, vec!["backfill", "manual", "planner"]);
    let per_draft: i64 = testkit::count(&env.db.pool, "SELECT count(*) FROM (SELECT slot_key FROM draft WHERE status = 'published' GROUP BY slot_key HAVING count(*) > 1) x").await;
    assert_eq!(per_draft, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_slots_never_pass_the_daily_cap() {
    let slots = vec!["00:00"; 24];
    let env = Env::new(&kind_toml("news", &slots, 5, "")).await;
    env.add_drafts("news", 30).await;
    env.planner().plan(Some(today()), &[], false).await.unwrap();
    let workers = env.start_workers(3, |o| o.concurrency = 8);
    env.wait_executions(24, T).await;
    workers.stop().await;
    let o = env.outcomes().await;
    assert_eq!(o.get("published"), Some(&5), "{o:?}");
    assert_eq!(o.get("skipped/quota_full"), Some(&19), "{o:?}");
    assert_eq!(
        testkit::count(
            &env.db.pool,
            "SELECT count(*) FROM draft WHERE status = 'published'"
        )
        .await,
        5
    );
    assert_eq!(
        testkit::count(&env.db.pool, "SELECT max(used)::bigint FROM daily_quota").await,
        5
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_ready_draft_is_recorded_and_does_not_use_the_cap() {
    let env = Env::new(&kind_toml(
        "news",
        &["00:00", "00:00:01", "00:00:02"],
        2,
        "",
    ))
    .await;
    // One draft ready, one ready only next year.
    env.add_drafts("news", 1).await;
    let mut conn = env.db.pool.acquire().await.unwrap();
    let later = chrono::Utc::now() + chrono::Duration::days(365);
    slotgate::store::insert_draft(&mut conn, "news", "future", "", later, chrono::Utc::now())
        .await
        .unwrap();
    drop(conn);
    env.planner().plan(Some(today()), &[], false).await.unwrap();
    let workers = env.start_workers(1, |_| {});
    env.wait_executions(3, T).await;
    workers.stop().await;
    let o = env.outcomes().await;
    assert_eq!(o.get("published"), Some(&1), "{o:?}");
    assert_eq!(o.get("skipped/no_ready_draft"), Some(&2), "{o:?}");
    assert_eq!(
        testkit::count(&env.db.pool, "SELECT max(used)::bigint FROM daily_quota").await,
        1,
        "skips give their unit back"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redelivered_entry_whose_outcome_is_committed_adds_nothing() {
    use slotgate::executor::Handled;
    let env = Env::new(&kind_toml("article", &["00:00"], 5, "")).await;
    env.add_drafts("article", 2).await;
    let exec = env.executor("w");
    env.queue.ensure_group().await.unwrap();
    let key = format!("article:{}:1", today());
    env.xadd(&[("slot", &key), ("caller", "planner")]).await;
    let d = env
        .queue
        .read("w", 1, Duration::from_millis(100))
        .await
        .unwrap()
        .remove(0);
    let first = exec.handle(&d).await.unwrap();
    assert_eq!(
        first,
        Handled::Recorded(slotgate::outcome::Outcome::Published)
    );
    // The same entry again, as after a crash between commit and XACK.
    let again = exec.handle(&d).await.unwrap();
    assert_eq!(again, Handled::AlreadyHandled);
    assert_eq!(env.executions().await, 1, "no second row for one entry");
    // A different entry for the same slot is a duplicate, and says so.
    env.xadd(&[("slot", &key), ("caller", "manual")]).await;
    let d2 = env
        .queue
        .read("w", 1, Duration::from_millis(100))
        .await
        .unwrap()
        .remove(0);
    assert_eq!(
        exec.handle(&d2).await.unwrap(),
        Handled::Recorded(slotgate::outcome::Outcome::Skipped(
            slotgate::outcome::SkipReason::SlotTaken
        ))
    );
    assert_eq!(env.executions().await, 2);
}

/// A draft the fast (`SKIP LOCKED`) pick passes over may be given back by
/// the transaction holding it — a batch its cap rolls back, a delivery
/// whose slot a concurrent one gated first. The slot must then get that
/// draft; it was ready, so `no_ready_draft` would record what did not
/// happen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draft_held_and_given_back_is_published_not_recorded_as_missing() {
    use slotgate::executor::Handled;
    use slotgate::outcome::Outcome;
    let env = Env::new(&kind_toml("news", &["00:00"], 5, "")).await;
    let drafts = env.add_drafts("news", 1).await;
    env.planner().plan(Some(today()), &[], false).await.unwrap();
    env.queue
        .deliver(&format!("news:{}:1", today()), "planner", 0)
        .await
        .unwrap();
    let ds = env.read_all("w").await;
    assert_eq!(ds.len(), 1);
    // Another transaction holds the only ready draft.
    let mut holder = env.db.pool.begin().await.unwrap();
    sqlx::query("SELECT id FROM draft WHERE id = $1 FOR UPDATE")
        .bind(drafts[0])
        .execute(&mut *holder)
        .await
        .unwrap();
    let exec = env.executor("w");
    let d = ds[0].clone();
    let gate = tokio::spawn(async move { exec.handle(&d).await });
    // The fault happened: the gate is waiting on that lock, not recording.
    let pool = env.db.pool.clone();
    testkit::wait_for("the gate to wait for the held draft", T, || {
        let pool = pool.clone();
        async move {
            let waiting = testkit::count(
                &pool,
                "SELECT count(*) FROM pg_stat_activity
                  WHERE datname = current_database() AND wait_event_type = 'Lock'",
            )
            .await;
            (waiting == 1).then_some(())
        }
    })
    .await;
    assert_eq!(env.executions().await, 0, "nothing recorded while it waits");
    holder.rollback().await.unwrap();
    assert_eq!(
        gate.await.unwrap().unwrap(),
        Handled::Recorded(Outcome::Published)
    );
    let o = env.outcomes().await;
    assert_eq!(o.get("published"), Some(&1), "{o:?}");
    assert_eq!(o.get("skipped/no_ready_draft"), None, "{o:?}");
}
