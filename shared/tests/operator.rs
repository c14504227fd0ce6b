//! Operator actions on failed slots, deadlines, the reconciler and status.

use crate::common;

use crate::common::{kind_toml, today, yesterday, Env, T};
use slotgate::plan::PlanError;
use slotgate::slot::SlotKey;
use slotgate::store::{self, Requester};
use testkit::cms::{Cms, Reply};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_reruns_a_failed_slot_with_the_same_key_and_draft() {
    let cms = Cms::start().await;
    let env = Env::new(&kind_toml(
        "article",
        &["00:00"],
        5,
        &common::publish_to(&cms),
    ))
    .await;
    let drafts = env.add_drafts("article", 2).await;
    cms.script("/publish", [Reply::Status(400)]);
    let key: SlotKey = format!("article:{}:1", today()).parse().unwrap();
    env.xadd(&[("slot", &key.to_string()), ("caller", "planner")])
        .await;
    let w = env.start_workers(1, |_| {});
    env.wait_executions(1, T).await;
    let p = env.planner();
    p.retry(&key).await.unwrap();
    env.wait_executions(2, T).await;
    w.stop().await;
    let calls = cms.calls_to("/publish");
    assert_eq!(calls.len(), 2);
    assert!(calls
        .iter()
        .all(|c| c.key.as_deref() == Some(key.to_string().as_str())));
    assert!(calls.iter().all(|c| c.body["draft"]["id"] == drafts[0]));
    let rows: Vec<(String, Option<String>, String)> =
        sqlx::query_as("SELECT outcome, reason, caller FROM execution ORDER BY id")
            .fetch_all(&env.db.pool)
            .await
            .unwrap();
    assert_eq!(
        rows[0],
        (
            "failed".into(),
            Some("publish_error".into()),
            "planner".into()
        )
    );
    assert_eq!(rows[1], ("published".into(), None, "manual".into()));
    let (state, attempt): (String, i32) = sqlx::query_as("SELECT state, attempt FROM publish_slot")
        .fetch_one(&env.db.pool)
        .await
        .unwrap();
    assert_eq!((state.as_str(), attempt), ("published", 2));
    // A published slot cannot be retried or abandoned.
    assert!(matches!(
        p.retry(&key).await,
        Err(PlanError::NotFailed { .. })
    ));
    assert!(matches!(
        p.abandon(&key, false).await,
        Err(PlanError::NotFailed { .. })
    ));
    let never: SlotKey = format!("article:{}:1", today().succ_opt().unwrap())
        .parse()
        .unwrap();
    assert!(matches!(
        p.retry(&never).await,
        Err(PlanError::NoSuchSlot(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandon_keeps_or_requeues_the_draft_as_asked() {
    let cms = Cms::start().await;
    let env = Env::new(&kind_toml(
        "article",
        &["00:00", "00:00:01"],
        5,
        &common::publish_to(&cms),
    ))
    .await;
    let drafts = env.add_drafts("article", 2).await;
    cms.script("/publish", [Reply::Status(422), Reply::Status(422)]);
    let day = today();
    env.xadd(&[("slot", &format!("article:{day}:1")), ("caller", "planner")])
        .await;
    env.xadd(&[("slot", &format!("article:{day}:2")), ("caller", "planner")])
        .await;
    let w = env.start_workers(1, |o| o.concurrency = 1);
    env.wait_executions(2, T).await;
    w.stop().await;
    assert_eq!(
        testkit::count(&env.db.pool, "SELECT used::bigint FROM daily_quota").await,
        2,
        "failed slots keep their units"
    );
    let p = env.planner();
    let k1: SlotKey = format!("article:{day}:1").parse().unwrap();
    let k2: SlotKey = format!("article:{day}:2").parse().unwrap();
    let d1 = p.abandon(&k1, false).await.unwrap().unwrap();
    let d2 = p.abandon(&k2, true).await.unwrap().unwrap();
    assert_eq!(
        [d1, d2]
            .iter()
            .copied()
            .collect::<std::collections::BTreeSet<_>>(),
        drafts.iter().copied().collect()
    );
    let status = |id: i64| {
        let pool = env.db.pool.clone();
        async move {
            sqlx::query_scalar::<_, String>("SELECT status FROM draft WHERE id = $1")
                .bind(id)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    assert_eq!(status(d1).await, "failed");
    assert_eq!(status(d2).await, "ready");
    assert_eq!(
        testkit::count(&env.db.pool, "SELECT used::bigint FROM daily_quota").await,
        1,
        "requeue released a unit"
    );
    let abandoned = testkit::count(
        &env.db.pool,
        "SELECT count(*) FROM execution WHERE reason = 'abandoned' AND caller = 'manual'",
    )
    .await;
    assert_eq!(abandoned, 2);
    assert_eq!(
        testkit::count(
            &env.db.pool,
            "SELECT count(*) FROM publish_slot WHERE state = 'failed' AND reason = 'abandoned'"
        )
        .await,
        2
    );
    // Abandoning is final: a second abandon would release a second unit of
    // the cap, and a retry could publish the requeued draft under a second key.
    assert!(matches!(
        p.abandon(&k2, true).await,
        Err(PlanError::NotFailed { .. })
    ));
    assert!(matches!(
        p.retry(&k2).await,
        Err(PlanError::NotFailed { .. })
    ));
    assert_eq!(
        testkit::count(&env.db.pool, "SELECT used::bigint FROM daily_quota").await,
        1,
        "a second abandon released nothing"
    );
    assert_eq!(status(d2).await, "ready", "the requeued draft stays ready");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_deliveries_skip_unless_someone_asked_for_a_late_run() {
    // Yesterday's slots at 00:00 with a 1 s deadline are long past it,
    // whatever the hour (today's were not in the UTC day's first seconds).
    let toml = kind_toml(
        "article",
        &["00:00", "00:00:01", "00:00:02", "00:00:03", "00:00:04"],
        5,
        "",
    )
    .replace("\"48h\"", "\"1s\"");
    let env = Env::new(&toml).await;
    env.add_drafts("article", 5).await;
    let day = yesterday();
    let key = |n: u32| SlotKey::new("article", day, n);
    // What `planner trigger` and `planner backfill` write before their
    // deliveries: the operator's request, in Postgres.
    for (n, who) in [(2, Requester::Manual), (3, Requester::Backfill)] {
        store::request_exemptions(&env.db.pool, &[key(n)], who, false, "test")
            .await
            .unwrap();
    }
    // A request for manual does not back a claim of backfill.
    store::request_exemptions(&env.db.pool, &[key(5)], Requester::Manual, false, "test")
        .await
        .unwrap();
    let xadd = |n: u32, caller: &'static str| {
        let env = &env;
        async move {
            env.xadd(&[("slot", &key(n).to_string()), ("caller", caller)])
                .await
        }
    };
    xadd(1, "planner").await;
    xadd(2, "manual").await;
    xadd(3, "backfill").await;
    xadd(4, "manual").await; // claimed with redis-cli; nobody asked
    xadd(5, "backfill").await;
    let w = env.start_workers(1, |_| {});
    env.wait_executions(5, T).await;
    w.stop().await;
    let o = env.outcomes().await;
    assert_eq!(o.get("skipped/missed_deadline"), Some(&3), "{o:?}");
    assert_eq!(o.get("published"), Some(&2), "{o:?}");
    // The unbacked claims are recorded as claimed, and skipped.
    let rows: Vec<(i32, String, String)> =
        sqlx::query_as("SELECT slot, outcome, caller FROM execution ORDER BY slot")
            .fetch_all(&env.db.pool)
            .await
            .unwrap();
    let got: Vec<(i32, &str, &str)> = rows
        .iter()
        .map(|(s, o, c)| (*s, o.as_str(), c.as_str()))
        .collect();
    assert_eq!(
        got,
        vec![
            (1, "skipped", "planner"),
            (2, "published", "manual"),
            (3, "published", "backfill"),
            (4, "skipped", "manual"),
            (5, "skipped", "backfill"),
        ]
    );
}

/// Issue 26's finding: a Redis writer claiming `caller manual` for days
/// of 2019 (each with a fresh cap) published one draft per day. Now the
/// claim grants nothing without an operator's request in Postgres.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_writer_claiming_manual_for_past_days_publishes_nothing() {
    let env = Env::new(&kind_toml("article", &["12:00"], 5, "")).await;
    env.add_drafts("article", 3).await;
    for d in ["2019-05-01", "2019-05-02", "2019-05-03"] {
        env.xadd(&[("slot", &format!("article:{d}:1")), ("caller", "manual")])
            .await;
    }
    let w = env.start_workers(1, |_| {});
    env.wait_executions(3, T).await;
    w.stop().await;
    let o = env.outcomes().await;
    assert_eq!(o.get("skipped/missed_deadline"), Some(&3), "{o:?}");
    assert_eq!(o.get("published"), None, "{o:?}");
    let ready: i64 = sqlx::query_scalar("SELECT count(*) FROM draft WHERE status = 'ready'")
        .fetch_one(&env.db.pool)
        .await
        .unwrap();
    assert_eq!(ready, 3, "every draft is still waiting");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reconciler_marks_missed_slots_and_redelivers_lost_ones() {
    // Slot 1 is past its deadline and was never delivered; slot 2 is due,
    // within its deadline, and was lost from Redis. Planned in a zone where
    // it is about noon now, so that whatever the time of day the suite runs
    // at, slot 1 (local midnight) is ~12 h past its 10-minute deadline and
    // slot 2 (20 s ago) falls on the same local day.
    let now = chrono::Utc::now();
    let zone = testkit::zone::around_noon(now, std::time::Duration::from_secs(60));
    let within = zone.hms(now - chrono::Duration::seconds(20));
    let toml = kind_toml("article", &["00:00:00", &within], 5, "")
        .replace("\"48h\"", "\"10m\"")
        .replace(
            "timezone = \"UTC\"",
            &format!("timezone = {:?}", zone.name()),
        );
    let env = Env::new(&toml).await;
    env.add_drafts("article", 2).await;
    let day = zone.day(now);
    env.planner().plan(Some(day), &[], false).await.unwrap();
    let mut c = env.redis.conn().await;
    let _: i64 = redis::cmd("DEL")
        .arg(env.queue.keys().delayed())
        .query_async(&mut c)
        .await
        .unwrap();
    let w = env.start_workers(1, |_| {});
    env.wait_executions(2, T).await;
    w.stop().await;
    let rows: Vec<(String, String, Option<String>)> =
        sqlx::query_as("SELECT caller, outcome, reason FROM execution ORDER BY slot")
            .fetch_all(&env.db.pool)
            .await
            .unwrap();
    assert_eq!(
        rows[0],
        (
            "reconciler".into(),
            "skipped".into(),
            Some("missed_deadline".into())
        )
    );
    assert_eq!(rows[1], ("reconciler".into(), "published".into(), None));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_shows_leader_workers_and_depths() {
    let env = Env::new(&kind_toml("article", &["23:59:59"], 5, "")).await;
    env.planner()
        .plan(Some(today().succ_opt().unwrap()), &[], false)
        .await
        .unwrap();
    let w = env.start_workers(2, |_| {});
    let s = testkit::wait_for("a leader and two workers", T, || async {
        let s = slotgate::report::status(&env.queue, &env.clock)
            .await
            .unwrap();
        (s.leader.is_some() && s.workers.len() == 2).then_some(s)
    })
    .await;
    assert!(s.epoch.unwrap() >= 1);
    assert!(s.lease_ms_left.unwrap() > 0);
    assert_eq!(s.queue.delayed, 1);
    assert_eq!((s.queue.ready, s.queue.pending), (0, 0));
    let text = s.render();
    assert!(
        text.contains("leader") && text.contains("delayed       1"),
        "{text}"
    );
    w.stop().await;
    let after = slotgate::report::status(&env.queue, &env.clock)
        .await
        .unwrap();
    assert!(after.workers.is_empty(), "clean shutdown removes workers");
    assert_eq!(after.leader, None, "and releases the lease");
}
