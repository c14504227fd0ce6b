//! Planning: idempotent, jitter in range and stable, DST rules, concurrent planners.

use crate::common::{kind_toml, Env};
use chrono::{NaiveDate, TimeZone, Utc};
use slotgate::config::Config;
use slotgate::slot::{day_schedule, SlotKey};
use std::path::Path;

fn berlin() -> Config {
    Config::parse(
        Path::new("berlin.toml"),
        r#"
[[kinds]]
name = "article"
timezone = "Europe/Berlin"
slots = ["01:30", "02:00", "02:30", "02:59:59", "03:00", "03:30"]
jitter = "0"
daily_cap = 6
starting_deadline = "2h"
"#,
    )
    .unwrap()
}

#[test]
fn spring_forward_gap_runs_at_the_first_instant_after_it() {
    let c = berlin();
    let day = NaiveDate::from_ymd_opt(2026, 3, 29).unwrap();
    let s = day_schedule(&c.kinds[0], day, "seed");
    assert_eq!(s.len(), 6, "exactly one slot per configured time");
    let utc = |h, m, sec| Utc.with_ymd_and_hms(2026, 3, 29, h, m, sec).unwrap();
    // 01:30 CET = 00:30 UTC. 02:00, 02:30 and 02:59:59 do not exist: they run
    // at 03:00 CEST = 01:00 UTC, the first instant after the gap.
    assert_eq!(s[0].nominal_at, utc(0, 30, 0));
    assert_eq!(s[1].nominal_at, utc(1, 0, 0));
    assert_eq!(s[2].nominal_at, utc(1, 0, 0));
    assert_eq!(s[3].nominal_at, utc(1, 0, 0));
    assert_eq!(s[4].nominal_at, utc(1, 0, 0));
    assert_eq!(s[5].nominal_at, utc(1, 30, 0));
    let keys: Vec<String> = s.iter().map(|p| p.key.to_string()).collect();
    assert_eq!(keys[1], "article:2026-03-29:2");
}

#[test]
fn fall_back_repeated_hour_runs_once_at_its_first_occurrence() {
    let c = berlin();
    let day = NaiveDate::from_ymd_opt(2026, 10, 25).unwrap();
    let s = day_schedule(&c.kinds[0], day, "seed");
    assert_eq!(s.len(), 6);
    let utc = |h, m, sec| Utc.with_ymd_and_hms(2026, 10, 25, h, m, sec).unwrap();
    // 02:00–02:59:59 happen twice (CEST, then CET): each runs once, at its
    // first occurrence (CEST, UTC+2).
    assert_eq!(
        s[0].nominal_at,
        Utc.with_ymd_and_hms(2026, 10, 24, 23, 30, 0).unwrap()
    );
    assert_eq!(s[1].nominal_at, utc(0, 0, 0));
    assert_eq!(s[2].nominal_at, utc(0, 30, 0));
    assert_eq!(s[3].nominal_at, utc(0, 59, 59));
    // 03:00 exists once, in CET (UTC+1).
    assert_eq!(s[4].nominal_at, utc(2, 0, 0));
    assert_eq!(s[5].nominal_at, utc(2, 30, 0));
}

#[test]
fn jitter_lies_in_the_window_and_is_stable() {
    let c = Config::parse(
        Path::new("j.toml"),
        &kind_toml("news", &["08:00"; 50], 1, "").replace("jitter = \"0\"", "jitter = \"15m\""),
    )
    .unwrap();
    let day = NaiveDate::from_ymd_opt(2026, 9, 25).unwrap();
    let a = day_schedule(&c.kinds[0], day, "install-a");
    let b = day_schedule(&c.kinds[0], day, "install-a");
    assert_eq!(a, b, "same key and seed give the same due times");
    for p in &a {
        assert!((0..900_000).contains(&p.jitter_ms), "{}", p.jitter_ms);
        assert_eq!(
            p.due_at - p.nominal_at,
            chrono::Duration::milliseconds(p.jitter_ms)
        );
    }
    let distinct: std::collections::HashSet<i64> = a.iter().map(|p| p.jitter_ms).collect();
    assert!(
        distinct.len() > 40,
        "jitter spreads slots: {} distinct of 50",
        distinct.len()
    );
    let other = day_schedule(&c.kinds[0], day, "install-b");
    assert_ne!(a, other, "another installation jitters differently");
}

/// The delayed set's members with their scores.
async fn delayed(env: &Env, c: &mut redis::aio::MultiplexedConnection) -> Vec<(String, f64)> {
    redis::cmd("ZRANGE")
        .arg(env.queue.keys().delayed())
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query_async(c)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replanning_changes_nothing_and_enqueues_nothing() {
    let env = Env::new(
        &kind_toml("article", &["08:00", "12:00", "18:30:15"], 2, "")
            .replace("jitter = \"0\"", "jitter = \"15m\""),
    )
    .await;
    let day = NaiveDate::from_ymd_opt(2030, 1, 10).unwrap();
    let p = env.planner();
    let first = p.plan(Some(day), &[], false).await.unwrap();
    assert_eq!(first.len(), 3);
    assert!(first.iter().all(|s| s.new));
    let mut c = env.redis.conn().await;
    let delayed = delayed(&env, &mut c).await;
    assert_eq!(delayed.len(), 3);
    for s in &first {
        let score = delayed
            .iter()
            .find(|(m, _)| *m == s.slot)
            .expect("enqueued")
            .1 as i64;
        assert_eq!(score, s.due_at.timestamp_millis());
    }
    // Remove one from Redis to prove a re-plan does not enqueue again.
    let _: i64 = redis::cmd("ZREM")
        .arg(env.queue.keys().delayed())
        .arg(&first[0].slot)
        .query_async(&mut c)
        .await
        .unwrap();
    let second = p.plan(Some(day), &[], false).await.unwrap();
    assert!(second.iter().all(|s| !s.new));
    assert_eq!(
        first
            .iter()
            .map(|s| (s.slot.clone(), s.due_at))
            .collect::<Vec<_>>(),
        second
            .iter()
            .map(|s| (s.slot.clone(), s.due_at))
            .collect::<Vec<_>>()
    );
    let n: i64 = redis::cmd("ZCARD")
        .arg(env.queue.keys().delayed())
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(n, 2, "re-plan enqueued nothing");
    let rows = testkit::count(&env.db.pool, "SELECT count(*) FROM planned_slot").await;
    assert_eq!(rows, 3);
    // Dry run reports without changing anything.
    let dry = p
        .plan(Some(day.succ_opt().unwrap()), &[], true)
        .await
        .unwrap();
    assert!(dry.iter().all(|s| s.new));
    assert_eq!(
        testkit::count(&env.db.pool, "SELECT count(*) FROM planned_slot").await,
        3
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_planners_create_and_enqueue_each_slot_once() {
    let times: Vec<String> = (0..40)
        .map(|i| format!("{:02}:{:02}", 6 + i / 4, (i % 4) * 15))
        .collect();
    let refs: Vec<&str> = times.iter().map(String::as_str).collect();
    let env = Env::new(&kind_toml("a", &refs, 5, "")).await;
    let day = NaiveDate::from_ymd_opt(2030, 2, 1).unwrap();
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let p = env.planner();
        tasks.push(tokio::spawn(async move {
            p.plan(Some(day), &[], false).await.unwrap()
        }));
    }
    let mut new = 0;
    for t in tasks {
        new += t.await.unwrap().iter().filter(|s| s.new).count();
    }
    assert_eq!(new, 40, "each slot created by exactly one planner");
    let mut c = env.redis.conn().await;
    let n: i64 = redis::cmd("ZCARD")
        .arg(env.queue.keys().delayed())
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(n, 40);
    assert_eq!(
        testkit::count(&env.db.pool, "SELECT count(*) FROM planned_slot").await,
        40
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dst_days_plan_exactly_one_slot_per_configured_time() {
    let env = Env::new(
        r#"
[[kinds]]
name = "article"
timezone = "Europe/Berlin"
slots = ["01:30", "02:00", "02:30", "03:00"]
jitter = "0"
daily_cap = 4
starting_deadline = "2h"
"#,
    )
    .await;
    let p = env.planner();
    for day in [
        NaiveDate::from_ymd_opt(2026, 3, 29).unwrap(),
        NaiveDate::from_ymd_opt(2026, 10, 25).unwrap(),
    ] {
        let v = p.plan(Some(day), &[], false).await.unwrap();
        assert_eq!(v.len(), 4);
        let keys: Vec<SlotKey> = v.iter().map(|s| s.slot.parse().unwrap()).collect();
        assert_eq!(
            keys.iter().map(|k| k.slot_no).collect::<Vec<_>>(),
            vec![1, 2, 3, 4]
        );
    }
    assert_eq!(
        testkit::count(&env.db.pool, "SELECT count(*) FROM planned_slot").await,
        8
    );
}

/// A plan larger than one insert batch, over a day that is partly planned
/// already: exactly the missing slots are created and scheduled, the others
/// keep their stored due times, the answer keeps the layout's order, and
/// planning again adds nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_of_many_batches_creates_and_schedules_only_the_missing_slots() {
    let times: Vec<String> = (0..12_000)
        .map(|i| format!("{:02}:{:02}:{:02}", i / 3600, i / 60 % 60, i % 60))
        .collect();
    let refs: Vec<&str> = times.iter().map(String::as_str).collect();
    let toml = kind_toml("a", &refs, 1, "") + &kind_toml("b", &refs[..3000], 1, "");
    let env = Env::new(&toml.replace("jitter = \"0\"", "jitter = \"10m\"")).await;
    let day = NaiveDate::from_ymd_opt(2030, 3, 1).unwrap();
    // Every third slot of kind a planned before, by a planner whose seed
    // (hence jitter) differs: those must keep that due time.
    let mut other = (*env.config).clone();
    other.jitter_seed = "another installation".into();
    let earlier: Vec<_> = day_schedule(&other.kinds[0], day, &other.jitter_seed)
        .into_iter()
        .step_by(3)
        .collect();
    let mut conn = env.db.pool.acquire().await.unwrap();
    slotgate::store::insert_planned(&mut conn, &earlier, "test")
        .await
        .unwrap();
    drop(conn);

    let p = env.planner();
    let first = p.plan(Some(day), &[], false).await.unwrap();
    let layout = p.layout(Some(day), &[]).unwrap();
    assert_eq!(first.len(), 15_000);
    assert_eq!(
        first.iter().map(|s| s.slot.clone()).collect::<Vec<_>>(),
        layout.iter().map(|s| s.key.to_string()).collect::<Vec<_>>(),
        "the answer follows the layout"
    );
    let was: std::collections::HashMap<String, _> = earlier
        .iter()
        .map(|s| (s.key.to_string(), s.due_at))
        .collect();
    for s in &first {
        match was.get(&s.slot) {
            Some(due) => assert!(!s.new && s.due_at == *due, "{} keeps its due time", s.slot),
            None => assert!(s.new, "{} is new", s.slot),
        }
    }
    let mut c = env.redis.conn().await;
    let queued = delayed(&env, &mut c).await;
    let new: std::collections::HashMap<&str, i64> = first
        .iter()
        .filter(|s| s.new)
        .map(|s| (s.slot.as_str(), s.due_at.timestamp_millis()))
        .collect();
    assert_eq!(
        queued.len(),
        15_000 - earlier.len(),
        "only the new ones are scheduled"
    );
    for (m, score) in &queued {
        assert_eq!(new.get(m.as_str()), Some(&(*score as i64)), "{m}");
    }

    let again = p.plan(Some(day), &[], false).await.unwrap();
    assert!(again.iter().all(|s| !s.new), "planning again adds nothing");
    assert_eq!(
        first
            .iter()
            .map(|s| (&s.slot, s.due_at))
            .collect::<Vec<_>>(),
        again
            .iter()
            .map(|s| (&s.slot, s.due_at))
            .collect::<Vec<_>>()
    );
    assert_eq!(
        delayed(&env, &mut c).await,
        queued,
        "and schedules nothing, nor moves a score"
    );
    assert_eq!(
        testkit::count(&env.db.pool, "SELECT count(*) FROM planned_slot").await,
        15_000
    );
    let dry = p
        .plan(Some(day.succ_opt().unwrap()), &[], true)
        .await
        .unwrap();
    assert!(dry.len() == 15_000 && dry.iter().all(|s| s.new));
    assert_eq!(
        testkit::count(&env.db.pool, "SELECT count(*) FROM planned_slot").await,
        15_000,
        "a dry run changes nothing"
    );
}
