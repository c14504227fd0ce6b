//! Promotion from the delayed set: a leader whose clock runs ahead cannot
//! promote a slot early (promotion never passes Redis's own clock,
//! `TIME`), and one call moves exactly the due slots it reads, lowest
//! due time first, and leaves every other member where it was.

use crate::common::{publish_to, Env, T};
use slotgate::clock::ManualClock;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use testkit::cms::Cms;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_forty_seconds_ahead_promotes_nothing_before_its_time() {
    let cms = Cms::start().await;
    // One slot due four seconds from now (its own day, so any time of day).
    let due = chrono::Utc::now() + chrono::Duration::seconds(4);
    let toml = format!(
        "[[kinds]]\nname = \"article\"\ntimezone = \"UTC\"\nslots = [\"{}\"]\njitter = \"0\"\ndaily_cap = 5\nstarting_deadline = \"1h\"\n{}\n",
        due.format("%H:%M:%S"),
        publish_to(&cms)
    );
    let mut env = Env::new(&toml).await;
    env.add_drafts("article", 1).await;
    let planned = env
        .planner()
        .plan(Some(due.date_naive()), &[], false)
        .await
        .unwrap();
    assert_eq!(planned.len(), 1);
    let due_at = planned[0].due_at;
    // The only worker, and so the leader, runs 40 s ahead.
    env.clock = Arc::new(ManualClock::new(
        chrono::Utc::now() + chrono::Duration::seconds(40),
    ));
    let w = env.start_workers(1, |_| {});
    testkit::wait_for("the slot's publish call", T, || async {
        (!cms.calls_to("/publish").is_empty()).then_some(())
    })
    .await;
    w.stop().await;
    let call = &cms.calls_to("/publish")[0];
    let at: chrono::DateTime<chrono::Utc> = call.at.into();
    assert!(
        at >= due_at,
        "published at {at}, before its due time {due_at}: the leader promoted by its own clock"
    );
    assert!(call.at <= SystemTime::now() + Duration::from_secs(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promotion_moves_exactly_the_due_slots_it_read_and_leaves_the_rest() {
    let env = Env::new(&crate::common::kind_toml("article", &["09:00"], 5, "")).await;
    env.queue.ensure_group().await.unwrap();
    let key = |n: u32| format!("article:2030-01-15:{n}");
    // Five due at one time (a tie: a sorted set orders them by member),
    // three due later, two not due; added out of order.
    let mut slots: Vec<(String, i64)> = vec![(key(9), 5_000), (key(10), 9_000_000)];
    slots.extend((1..=5).rev().map(|n| (key(n), 1_000)));
    slots.extend((6..=8).map(|n| (key(n), 2_000)));
    slots.push((key(11), 9_000_001));
    env.queue.schedule(&slots).await.unwrap();
    // One promotion call of at most 6 → (moved, head), and the members
    // the delayed set holds after it, in its order.
    let promote = || async {
        let by = slotgate::queue::PromoteBy::CallerTime;
        let p = env
            .queue
            .promote(10_000, 6, None, by)
            .await
            .unwrap()
            .unwrap();
        let left: Vec<String> = redis::cmd("ZRANGE")
            .arg(env.queue.keys().part(0).delayed())
            .arg(0)
            .arg(-1)
            .query_async(&mut env.redis.conn().await)
            .await
            .unwrap();
        (p.moved, p.head_ms, left)
    };
    let (moved, head, left) = promote().await;
    assert_eq!(
        (moved, head),
        (6, Some(2_000)),
        "the next due member is the head"
    );
    assert_eq!(left, vec![key(7), key(8), key(9), key(10), key(11)]);
    let read: Vec<String> = env
        .read_all("w")
        .await
        .iter()
        .map(|d| d.slot().unwrap().to_owned())
        .collect();
    assert_eq!(
        read,
        (1..=6).map(key).collect::<Vec<_>>(),
        "lowest due first"
    );
    // The rest of the due ones next; the two not due stay.
    assert_eq!(
        promote().await,
        (3, Some(9_000_000), vec![key(10), key(11)])
    );
}
