//! `planner prune`: old history goes in small batches, and a pruned day stays
//! guarded — a later backfill or a `redis-cli` delivery for one of its slots
//! runs nothing.

use crate::common::{kind_toml, today, Env, T};
use slotgate::retention::{prune, RetentionError};
use std::time::Duration;

const NINETY_DAYS: Duration = Duration::from_secs(90 * 24 * 3600);

async fn ready_drafts(env: &Env) -> i64 {
    testkit::count(
        &env.db.pool,
        "SELECT count(*) FROM draft WHERE status = 'ready'",
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pruned_day_stays_guarded() {
    let env = Env::new(&kind_toml("article", &["08:00", "12:00", "18:00"], 10, "")).await;
    env.add_drafts("article", 10).await;
    // One instant for the whole test: a run across midnight UTC would
    // otherwise move the prune's horizon by a day between two readings.
    let now = chrono::Utc::now();
    let today = now.date_naive();
    let old = today - chrono::Days::new(100);
    let unplanned = old + chrono::Days::new(1);
    let w = env.start_workers(1, |_| {});
    let p = env.planner();
    // The old day ran once (a backfill); the day after it was never planned.
    let b = p.backfill("article", old, old).await.unwrap();
    assert_eq!(b.delivered.len(), 3);
    env.wait_executions(3, T).await;
    // One slot of today, which must survive the prune. Run now whatever
    // the time of day (`trigger --early`): before 08:00 a plain delivery
    // would be recorded `not_due` and publish nothing.
    p.trigger_early("article", today, 1).await.unwrap();
    env.wait_executions(4, T).await;
    // As if the backfill had run back then: executions and the operator's
    // requests age by when they ran.
    for sql in [
        "UPDATE execution SET started_at = started_at - interval '100 days' WHERE day = $1",
        "UPDATE exemption_request SET requested_at = requested_at - interval '100 days' WHERE day = $1",
    ] {
        sqlx::query(sql)
            .bind(old)
            .execute(&env.db.pool)
            .await
            .unwrap();
    }
    let stored_answers = testkit::count(
        &env.db.pool,
        &format!("SELECT count(*) FROM publish_slot WHERE day = '{old}' AND response IS NOT NULL"),
    )
    .await;

    // Out of range: too recent to be safe.
    let short = prune(
        &env.db.pool,
        &env.config,
        now,
        Duration::from_secs(86400),
        false,
    )
    .await;
    assert!(
        matches!(short, Err(RetentionError::OutOfRange { .. })),
        "{short:?}"
    );

    let dry = prune(&env.db.pool, &env.config, now, NINETY_DAYS, true)
        .await
        .unwrap();
    assert_eq!(
        (
            dry.executions,
            dry.planned,
            dry.sealed,
            dry.responses,
            dry.requests
        ),
        // Sealed: every slot of the ten days from the first planned one up
        // to the horizon, but the old day's three that ran.
        (3, 3, 27, stored_answers as u64, 3),
        "{dry:?}"
    );
    assert_eq!(env.executions().await, 4, "a dry run changes nothing");

    let done = prune(&env.db.pool, &env.config, now, NINETY_DAYS, false)
        .await
        .unwrap();
    assert!(!done.dry_run);
    assert_eq!(
        (
            done.executions,
            done.planned,
            done.sealed,
            done.responses,
            done.requests
        ),
        (
            dry.executions,
            dry.planned,
            dry.sealed,
            dry.responses,
            dry.requests
        )
    );
    assert_eq!(env.executions().await, 1, "today's execution stays");
    assert_eq!(
        testkit::count(&env.db.pool, "SELECT count(*) FROM exemption_request").await,
        1,
        "today's request stays"
    );
    let gate: Vec<(chrono::NaiveDate, String, Option<String>)> = sqlx::query_as(
        "SELECT day, state, reason FROM publish_slot WHERE day < $1 ORDER BY day, slot",
    )
    .bind(today)
    .fetch_all(&env.db.pool)
    .await
    .unwrap();
    assert_eq!(gate.len(), 30, "{gate:?}");
    assert!(
        gate[..3]
            .iter()
            .all(|(d, s, _)| *d == old && s == "published"),
        "{gate:?}"
    );
    assert!(
        gate[3..]
            .iter()
            .all(|(d, s, r)| *d > old && s == "skipped" && r.as_deref() == Some("pruned")),
        "{gate:?}"
    );
    assert_eq!(
        testkit::count(
            &env.db.pool,
            &format!("SELECT count(*) FROM planned_slot WHERE day < '{today}'")
        )
        .await,
        0
    );

    // The pruned days stay guarded against every caller.
    let drafts_before = ready_drafts(&env).await;
    let again = p.backfill("article", old, unplanned).await.unwrap();
    assert!(again.delivered.is_empty(), "{again:?}");
    for (day, caller) in [
        (old, "manual"),
        (unplanned, "manual"),
        (unplanned, "backfill"),
    ] {
        env.xadd(&[("slot", &format!("article:{day}:2")), ("caller", caller)])
            .await;
    }
    env.wait_executions(4, T).await;
    w.stop().await;
    let o = env.outcomes().await;
    assert_eq!(o.get("skipped/slot_taken"), Some(&3), "{o:?}");
    assert_eq!(
        ready_drafts(&env).await,
        drafts_before,
        "no draft was taken"
    );
    assert_eq!(
        testkit::count(
            &env.db.pool,
            "SELECT count(*) FROM publish_slot WHERE state = 'published'"
        )
        .await,
        4
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prune_runs_beside_busy_workers() {
    let times: Vec<String> = (0..50).map(|i| format!("00:00:{i:02}")).collect();
    let times: Vec<&str> = times.iter().map(String::as_str).collect();
    let env = Env::new(&kind_toml("news", &times, 200, "")).await;
    // 30,000 old executions: thirty batches of prune.
    sqlx::query(
        "INSERT INTO execution (slot_key, kind, day, slot, caller, worker_id, outcome, reason,
                                started_at, finished_at)
         SELECT 'news:2020-01-01:1', 'news', '2020-01-01', 1, 'planner', 'old', 'skipped',
                'slot_taken', now() - interval '400 days', now() - interval '400 days'
           FROM generate_series(1, 30000)",
    )
    .execute(&env.db.pool)
    .await
    .unwrap();
    env.add_drafts("news", 50).await;
    let w = env.start_workers(2, |_| {});
    // Today's 50 slots, each delivered twice, while prune runs: every
    // delivery must be recorded, each slot published once.
    let pool = env.db.pool.clone();
    let config = env.config.clone();
    let pruning =
        tokio::spawn(
            async move { prune(&pool, &config, chrono::Utc::now(), NINETY_DAYS, false).await },
        );
    for _ in 0..2 {
        for n in 1..=50 {
            env.xadd(&[
                ("slot", &format!("news:{}:{n}", today())),
                ("caller", "manual"),
            ])
            .await;
        }
    }
    let pruned = pruning.await.unwrap().unwrap();
    assert_eq!(pruned.executions, 30_000);
    env.wait_executions(100, T).await;
    w.stop().await;
    let o = env.outcomes().await;
    assert_eq!(o.get("published"), Some(&50), "{o:?}");
    assert_eq!(o.get("skipped/slot_taken"), Some(&50), "{o:?}");
}
