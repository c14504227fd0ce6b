//! A slot never runs before its time: a delivery for a day that has not
//! come — whoever its caller, planned or not, one at a time or in a batch —
//! is recorded `skipped/not_due` and takes nothing (no gate row, no draft,
//! no unit of the cap, no CMS call); the slot still runs at its time, and
//! only `planner trigger --early` runs it before.

use crate::common::{kind_toml, publish_to, today, Env, T};
use chrono::NaiveDate;
use slotgate::clock::{ManualClock, SharedClock};
use slotgate::executor::Handled;
use slotgate::outcome::{Outcome, SkipReason};
use std::sync::Arc;
use testkit::cms::Cms;

/// A webhook kind with one slot at 12:00 UTC and `drafts` ready drafts, a
/// clock that only moves when the test says (starting now, so the drafts
/// are ready), and a day `days_ahead` from today.
async fn setup(drafts: usize, days_ahead: i64) -> (Cms, Env, ManualClock, NaiveDate) {
    let cms = Cms::start().await;
    let mut env = Env::new(&kind_toml("article", &["12:00"], 1, &publish_to(&cms))).await;
    let clock = ManualClock::new(chrono::Utc::now());
    env.clock = Arc::new(clock.clone()) as SharedClock;
    env.add_drafts("article", drafts).await;
    (
        cms,
        env,
        clock,
        today() + chrono::Duration::days(days_ahead),
    )
}

/// Moves the stored due time of `key` to `secs` seconds from Postgres's
/// now (negative: in the past).
async fn due_in(env: &Env, key: &str, secs: i64) {
    let k: slotgate::slot::SlotKey = key.parse().unwrap();
    let n = sqlx::query(
        "UPDATE planned_slot SET due_at = clock_timestamp() + make_interval(secs => $4)
          WHERE kind = $1 AND day = $2 AND slot = $3",
    )
    .bind(&k.kind)
    .bind(k.day)
    .bind(k.slot_no as i32)
    .bind(secs as f64)
    .execute(&env.db.pool)
    .await
    .unwrap()
    .rows_affected();
    assert_eq!(n, 1, "{key} is planned");
}

/// [`due_in`] a second ago.
async fn make_due(env: &Env, key: &str) {
    due_in(env, key, -1).await;
}

async fn count(env: &Env, sql: &str) -> i64 {
    testkit::count(&env.db.pool, sql).await
}

/// Nothing was taken: no gate row, every draft still ready, no unit of any
/// cap, no call to the CMS.
async fn assert_nothing_taken(env: &Env, cms: &Cms) {
    assert_eq!(
        count(env, "SELECT count(*) FROM publish_slot").await,
        0,
        "no gate row"
    );
    assert_eq!(
        count(
            env,
            "SELECT count(*) FROM draft WHERE status <> 'ready' OR slot_key IS NOT NULL"
        )
        .await,
        0,
        "no draft taken"
    );
    assert_eq!(
        count(
            env,
            "SELECT coalesce(sum(used), 0)::bigint FROM daily_quota"
        )
        .await,
        0,
        "no unit of the cap"
    );
    assert!(cms.calls().is_empty(), "no CMS call: {:?}", cms.calls());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_for_a_day_that_has_not_come_run_nothing_and_the_slot_still_runs_at_its_time() {
    let (cms, env, clock, day) = setup(2, 30).await;
    let unplanned_day = day + chrono::Duration::days(1);
    let planner = env.planner();
    planner.plan(Some(day), &[], false).await.unwrap();
    let key = format!("article:{day}:1");
    let unplanned = format!("article:{unplanned_day}:1");
    for caller in ["manual", "backfill", "someone-with-redis-cli"] {
        env.xadd(&[("slot", &key), ("caller", caller)]).await;
    }
    env.xadd(&[("slot", &unplanned), ("caller", "manual")])
        .await;
    let ds = env.read_all("w").await;
    assert_eq!(ds.len(), 4);
    let exec = env.executor("w");
    // The batch path decides none of them: they are left to `handle`.
    assert_eq!(exec.batch(&ds).await.unwrap(), Vec::<usize>::new());
    for d in &ds {
        assert_eq!(
            exec.handle(d).await.unwrap(),
            Handled::Recorded(Outcome::Skipped(SkipReason::NotDue)),
            "{d:?}"
        );
    }
    let o = env.outcomes().await;
    assert_eq!(o.get("skipped/not_due"), Some(&4), "{o:?}");
    assert_eq!(o.len(), 1, "{o:?}");
    assert_nothing_taken(&env, &cms).await;
    let ahead: i64 = sqlx::query_scalar(
        "SELECT min((detail->>'ahead_ms')::bigint) FROM execution WHERE slot_key = $1",
    )
    .bind(&key)
    .fetch_one(&env.db.pool)
    .await
    .unwrap();
    assert!(
        ahead > 29 * 24 * 3600 * 1000,
        "detail says how early: {ahead}"
    );
    // The unplanned slot was not planned on the delivery's behalf, so the
    // planner still creates (and schedules) it.
    let new = planner.plan(Some(unplanned_day), &[], false).await.unwrap();
    assert!(new.iter().all(|s| s.new), "{new:?}");
    assert_eq!(
        count(
            &env,
            "SELECT count(*) FROM execution WHERE entry_id IS NULL"
        )
        .await,
        0
    );

    // The day comes: the planner's own delivery runs the slot. Postgres's
    // clock judges "due", and it cannot be moved a month: the slot's due
    // time is brought to Postgres's now instead (its promotion is driven by
    // the injected clock, a month ahead of Redis's).
    let due = slotgate::store::get_planned_many(&env.db.pool, &[key.parse().unwrap()])
        .await
        .unwrap()
        .remove(0)
        .due_at;
    make_due(&env, &key).await;
    clock.set(due + chrono::Duration::seconds(1));
    let w = env.start_workers(1, |o| o.promote_by = slotgate::queue::PromoteBy::CallerTime);
    env.wait_executions(5, T).await;
    w.stop().await;
    let o = env.outcomes().await;
    assert_eq!(o.get("published"), Some(&1), "{o:?}");
    assert_eq!(o.get("skipped/not_due"), Some(&4), "{o:?}");
    let published: (String, String) =
        sqlx::query_as("SELECT slot_key, caller FROM execution WHERE outcome = 'published'")
            .fetch_one(&env.db.pool)
            .await
            .unwrap();
    assert_eq!(published, (key.clone(), "planner".to_owned()));
    assert_eq!(cms.calls_to("/publish").len(), 1);
    assert_eq!(
        count(&env, "SELECT used::bigint FROM daily_quota").await,
        1,
        "one unit of that day's cap"
    );
    // The report's first start and lag are the run's, not the early
    // deliveries' (which are still counted as deliveries).
    let r = slotgate::report::build(&env.db.pool, &env.config, &env.clock, Some(day), &[])
        .await
        .unwrap();
    assert_eq!(r.slots[0].deliveries, 4, "{:?}", r.slots[0]);
    assert!(
        r.slots[0].lag_ms.is_some_and(|l| l >= 0),
        "{:?}",
        r.slots[0]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trigger_refuses_a_slot_that_is_not_due_and_trigger_early_runs_it() {
    let (cms, env, _clock, day) = setup(1, 30).await;
    let planner = env.planner();
    let refused = planner.trigger("article", day, 1, "manual").await;
    assert!(
        matches!(refused, Err(slotgate::plan::PlanError::NotDue { .. })),
        "{refused:?}"
    );
    assert_eq!(count(&env, "SELECT count(*) FROM planned_slot").await, 0);
    planner.trigger_early("article", day, 1).await.unwrap();
    let ds = env.read_all("w").await;
    assert_eq!(ds.len(), 1);
    assert_eq!(ds[0].early(), Some("1"));
    assert_eq!(ds[0].caller(), "manual");
    let exec = env.executor("w");
    assert_eq!(
        exec.handle(&ds[0]).await.unwrap(),
        Handled::Recorded(Outcome::Published)
    );
    assert_eq!(cms.calls_to("/publish").len(), 1);
    // `early=1` from any other caller is not the operator's trigger; nor
    // is `caller manual` + `early=1` written with redis-cli: no request
    // in Postgres backs it (issue 26).
    for (days, caller) in [(1, "planner"), (2, "manual")] {
        let later = format!("article:{}:1", day + chrono::Duration::days(days));
        env.xadd(&[("slot", &later), ("caller", caller), ("early", "1")])
            .await;
        let ds = env.read_all("w").await;
        assert_eq!(
            exec.handle(&ds[0]).await.unwrap(),
            Handled::Recorded(Outcome::Skipped(SkipReason::NotDue)),
            "{caller}"
        );
    }
    assert_eq!(cms.calls_to("/publish").len(), 1, "nothing more published");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_within_a_minute_of_its_time_runs() {
    let (_cms, env, clock, day) = setup(1, 2).await;
    env.planner().plan(Some(day), &[], false).await.unwrap();
    let key = format!("article:{day}:1");
    let due = slotgate::store::get_planned_many(&env.db.pool, &[key.parse().unwrap()])
        .await
        .unwrap()
        .remove(0)
        .due_at;
    // 30 s ahead by Postgres's clock (the one that judges), whatever the
    // worker's.
    due_in(&env, &key, 30).await;
    clock.set(due - chrono::Duration::hours(1));
    env.xadd(&[("slot", &key), ("caller", "planner")]).await;
    let ds = env.read_all("w").await;
    assert_eq!(
        env.executor("w").handle(&ds[0]).await.unwrap(),
        Handled::Recorded(Outcome::Published)
    );
}

/// The review's case: the only worker's clock runs 2 minutes fast, and a
/// stray copy of a slot arrives 80 s before the slot's time by Postgres's
/// clock. By the worker's clock the slot is 40 s overdue; by the one clock
/// that decides, it is early: `skipped/not_due`, nothing taken, on the
/// single path and the batch path alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_whose_clock_runs_fast_publishes_nothing_early() {
    let (cms, env, clock, day) = setup(1, 2).await;
    env.planner().plan(Some(day), &[], false).await.unwrap();
    let key = format!("article:{day}:1");
    due_in(&env, &key, 80).await;
    clock.set(chrono::Utc::now() + chrono::Duration::seconds(120));
    env.xadd(&[("slot", &key), ("caller", "planner")]).await;
    let ds = env.read_all("w").await;
    let exec = env.executor("w");
    assert_eq!(
        exec.batch(&ds).await.unwrap(),
        Vec::<usize>::new(),
        "the batch leaves it"
    );
    assert_eq!(
        exec.handle(&ds[0]).await.unwrap(),
        Handled::Recorded(Outcome::Skipped(SkipReason::NotDue))
    );
    assert_nothing_taken(&env, &cms).await;
    let ahead: i64 = sqlx::query_scalar(
        "SELECT (detail->>'ahead_ms')::bigint FROM execution WHERE slot_key = $1",
    )
    .bind(&key)
    .fetch_one(&env.db.pool)
    .await
    .unwrap();
    assert!(
        (60_000..=80_000).contains(&ahead),
        "ahead by Postgres's clock: {ahead} ms"
    );
}
