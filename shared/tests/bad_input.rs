//! Malformed deliveries are dead-lettered with a reason while good ones keep
//! flowing; every one of them still leaves an execution row.

use crate::common::{kind_toml, today, Env};
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_deliveries_are_dead_lettered_and_good_ones_flow() {
    let env = Env::new(&kind_toml(
        "article",
        &["00:00", "00:00:01", "00:00:02"],
        5,
        "",
    ))
    .await;
    env.add_drafts("article", 3).await;
    let day = today();
    let good = |n: u32| format!("article:{day}:{n}");
    env.xadd(&[("slot", &good(1)), ("caller", "planner")]).await;
    env.xadd(&[("caller", "manual")]).await; // no slot
    env.xadd(&[("slot", "not a key"), ("caller", "manual")])
        .await;
    env.xadd(&[
        ("slot", &format!("nosuchkind:{day}:1")),
        ("caller", "manual"),
    ])
    .await;
    env.xadd(&[("slot", &format!("article:{day}:9")), ("caller", "manual")])
        .await;
    env.xadd(&[("slot", "article:2026-02-30:1"), ("caller", "manual")])
        .await;
    // A real day spelled otherwise than a key is written (2026-01-05):
    // not a key, though a lenient date parser would read one.
    env.xadd(&[("slot", "article:2026-01- 5:1"), ("caller", "manual")])
        .await;
    env.xadd(&[("slot", &good(2)), ("caller", "planner")]).await;
    let w = env.start_workers(2, |_| {});
    env.xadd(&[("slot", &good(3))]).await; // caller missing: recorded as unknown
    env.wait_executions(9, Duration::from_secs(30)).await;
    w.stop().await;
    let o = env.outcomes().await;
    assert_eq!(o.get("published"), Some(&3), "{o:?}");
    assert_eq!(o.get("failed/bad_message"), Some(&4), "{o:?}");
    assert_eq!(o.get("failed/unknown_kind"), Some(&1), "{o:?}");
    assert_eq!(o.get("failed/unknown_slot"), Some(&1), "{o:?}");
    let dead = env.queue.dead_letters(100).await.unwrap();
    let mut reasons: Vec<String> = dead.iter().map(|d| d.fields["reason"].clone()).collect();
    reasons.sort();
    assert_eq!(
        reasons,
        vec![
            "bad_message",
            "bad_message",
            "bad_message",
            "bad_message",
            "unknown_kind",
            "unknown_slot"
        ]
    );
    assert!(dead.iter().all(|d| d.fields.contains_key("entry_id")));
    let d = env
        .queue
        .depths(chrono::Utc::now().timestamp_millis())
        .await
        .unwrap();
    assert_eq!(
        (d.ready, d.pending, d.dead),
        (0, 0, 6),
        "everything acknowledged"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_seen_too_often_is_dead_lettered_with_its_count() {
    let env = Env::new(&kind_toml("article", &["00:00"], 5, "")).await;
    let q = &env.queue;
    q.ensure_group().await.unwrap();
    let key = format!("article:{}:1", today());
    let id = env.xadd(&[("slot", &key), ("caller", "planner")]).await;
    // Eleven consumers each take the entry and die without acknowledging it.
    q.read("ghost", 1, Duration::from_millis(10)).await.unwrap();
    for i in 0..10 {
        let got = q
            .reclaim(&format!("ghost{i}"), Duration::ZERO, 1)
            .await
            .unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].deliveries, i + 2);
    }
    let w = env.start_workers(1, |o| o.visibility = Duration::from_millis(200));
    env.wait_executions(1, Duration::from_secs(30)).await;
    w.stop().await;
    let o = env.outcomes().await;
    assert_eq!(o.get("failed/max_deliveries"), Some(&1), "{o:?}");
    let dead = q.dead_letters(10).await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].fields["reason"], "max_deliveries");
    assert_eq!(dead[0].fields["entry_id"], id);
    assert_eq!(dead[0].fields["deliveries"], "12");
}
