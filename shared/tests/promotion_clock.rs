//! A leader whose clock runs ahead cannot promote a slot early: promotion
//! never passes Redis's own clock (`TIME`).

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
