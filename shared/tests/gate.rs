//! The gate and the quota: duplicates of one slot, from any caller and at any
//! distance in time, publish once; concurrent slots never pass the cap.

use crate::common;

use crate::common::{kind_toml, today, yesterday, Env, T};
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
    let day = yesterday();
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
    slotgate::store::insert_draft(
        &mut conn,
        &slotgate::store::NewDraft {
            kind: "news",
            title: "future",
            body: "",
            ready_at: later,
            priority: 0,
            category: None,
        },
        chrono::Utc::now(),
    )
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_slots_pick_by_priority_then_age() {
    // 24 concurrent slots (cap 24: concurrent batches each take the best
    // drafts no other holds, and none rolls back) over 30 drafts.
    let slots = vec!["00:00"; 24];
    let env = Env::new(&kind_toml("news", &slots, 24, "")).await;
    // Oldest first. The 5 newest go first (priority 10), the 3 oldest go
    // last (priority -1): oldest-first alone would leave the 6 newest.
    let ids = env.add_drafts("news", 30).await;
    let (low, high) = (&ids[..3], &ids[25..]);
    for (set, p) in [(high, 10), (low, -1)] {
        sqlx::query("UPDATE draft SET priority = $2 WHERE id = ANY($1)")
            .bind(set)
            .bind(p)
            .execute(&env.db.pool)
            .await
            .unwrap();
    }
    env.planner().plan(Some(today()), &[], false).await.unwrap();
    let workers = env.start_workers(3, |o| o.concurrency = 8);
    env.wait_executions(24, T).await;
    workers.stop().await;
    let o = env.outcomes().await;
    assert_eq!(o.get("published"), Some(&24), "{o:?}");
    let left: Vec<i64> =
        sqlx::query_scalar("SELECT id FROM draft WHERE status = 'ready' ORDER BY id")
            .fetch_all(&env.db.pool)
            .await
            .unwrap();
    let mut want: Vec<i64> = low.iter().chain(&ids[22..25]).copied().collect();
    want.sort_unstable();
    assert_eq!(
        left, want,
        "left: the 3 of priority -1 and the 3 newest of priority 0"
    );
}

/// The cap stays exact under both new picks: 12 concurrent slots of a
/// kind with a cap of 5, drafts with priorities (one kind) and categories
/// (a rotating kind): exactly 5 published per kind, the other 7 skipped
/// `quota_full`, and no draft bound to two slots.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn priority_and_rotation_keep_the_cap_exact_under_concurrent_slots() {
    let slots = vec!["00:00"; 12];
    let env = Env::new(&format!(
        "{}{}",
        kind_toml("prio", &slots, 5, ""),
        kind_toml("rota", &slots, 5, "rotate_by = \"category\"")
    ))
    .await;
    env.add_drafts("prio", 20).await;
    env.add_drafts("rota", 20).await;
    sqlx::query("UPDATE draft SET priority = id % 3 WHERE kind = 'prio'")
        .execute(&env.db.pool)
        .await
        .unwrap();
    sqlx::query("UPDATE draft SET category = 'c' || (id % 4) WHERE kind = 'rota'")
        .execute(&env.db.pool)
        .await
        .unwrap();
    env.planner().plan(Some(today()), &[], false).await.unwrap();
    let workers = env.start_workers(3, |o| o.concurrency = 8);
    env.wait_executions(24, T).await;
    workers.stop().await;
    for kind in ["prio", "rota"] {
        let rows: Vec<(String, Option<String>, i64)> = sqlx::query_as(
            "SELECT state, reason, count(*) FROM publish_slot WHERE kind = $1 GROUP BY 1, 2 ORDER BY 1",
        )
        .bind(kind)
        .fetch_all(&env.db.pool)
        .await
        .unwrap();
        assert_eq!(
            rows,
            [
                ("published".to_owned(), None, 5),
                ("skipped".to_owned(), Some("quota_full".to_owned()), 7)
            ],
            "{kind}"
        );
        let bound: i64 = sqlx::query_scalar(
            "SELECT count(DISTINCT slot_key) FROM draft WHERE kind = $1 AND status = 'published'",
        )
        .bind(kind)
        .fetch_one(&env.db.pool)
        .await
        .unwrap();
        assert_eq!(bound, 5, "{kind}: five drafts, each bound to its own slot");
        let used: i32 = sqlx::query_scalar("SELECT used FROM daily_quota WHERE kind = $1")
            .bind(kind)
            .fetch_one(&env.db.pool)
            .await
            .unwrap();
        assert_eq!(used, 5, "{kind}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotating_kind_takes_each_category_in_turn_least_recently_published_first() {
    // 5 concurrent slots and a cap of 5: concurrent batches each take
    // the best drafts no other holds, and none rolls back.
    // A plain kind due at the same time (its slots may share batches
    // with the rotating ones: store::gate's own test pins that case) keeps
    // the plain pick, oldest first.
    let slots = vec!["00:00"; 5];
    let env = Env::new(&format!(
        "{}{}",
        kind_toml("news", &slots, 5, "rotate_by = \"category\""),
        kind_toml("blog", &["00:00", "00:00"], 2, "")
    ))
    .await;
    let blog = env.add_drafts("blog", 3).await;
    // Oldest first: 4 of sport, 2 of arts, 1 of tech, 1 without a
    // category. arts went out an hour ago, sport a day ago, tech never.
    let ids = env.add_drafts("news", 8).await;
    let cats = ["sport", "sport", "sport", "sport", "arts", "arts", "tech"];
    for (id, c) in ids.iter().zip(cats) {
        sqlx::query("UPDATE draft SET category = $2 WHERE id = $1")
            .bind(id)
            .bind(c)
            .execute(&env.db.pool)
            .await
            .unwrap();
    }
    for (c, ago) in [("arts", "1 hour"), ("sport", "1 day")] {
        sqlx::query(&format!(
            "INSERT INTO draft (kind, title, body, status, ready_at, category, published_at, url)
             VALUES ('news', 'old', '', 'published', now() - interval '2 days', $1, now() - interval '{ago}', 'u')"
        ))
        .bind(c)
        .execute(&env.db.pool)
        .await
        .unwrap();
    }
    env.planner().plan(Some(today()), &[], false).await.unwrap();
    let workers = env.start_workers(3, |o| o.concurrency = 8);
    env.wait_executions(7, T).await;
    workers.stop().await;
    let o = env.outcomes().await;
    assert_eq!(o.get("published"), Some(&7), "{o:?}");
    let blog_out: Vec<i64> = sqlx::query_scalar(
        "SELECT id FROM draft WHERE kind = 'blog' AND status = 'published' ORDER BY id",
    )
    .fetch_all(&env.db.pool)
    .await
    .unwrap();
    assert_eq!(blog_out, blog[..2], "the plain kind: the two oldest");
    let published: Vec<i64> = sqlx::query_scalar(
        "SELECT id FROM draft WHERE kind = 'news' AND status = 'published' AND title <> 'old' ORDER BY id",
    )
    .fetch_all(&env.db.pool)
    .await
    .unwrap();
    // First turn: the uncategorized one and tech (never out), sport (a
    // day ago), arts (an hour ago); second turn: sport's next.
    let mut want = vec![ids[7], ids[6], ids[0], ids[4], ids[1]];
    want.sort_unstable();
    assert_eq!(
        published, want,
        "one of each category before a second of any"
    );
}
