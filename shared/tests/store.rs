//! Statement-level guarantees of the store.

use chrono::Utc;
use serde_json::json;
use slotgate::store::{insert_execution, ExecutionRecord};

fn rec(entry: &str, outcome: &'static str, reason: Option<&'static str>) -> ExecutionRecord {
    ExecutionRecord {
        slot_key: "a:2026-01-01:1".into(),
        key: Some("a:2026-01-01:1".parse().unwrap()),
        entry_id: Some(entry.into()),
        caller: "planner".into(),
        worker_id: "w".into(),
        leader_epoch: None,
        outcome,
        reason,
        detail: json!({"n": outcome}),
        due_at: None,
        started_at: Utc::now(),
        finished_at: Utc::now(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_keeps_one_execution_and_the_effect_wins_over_slot_taken() {
    let db = testkit::TestDb::new().await;
    let mut c = db.pool.acquire().await.unwrap();
    // A stalled handler records slot_taken first, the reclaiming one publishes.
    assert!(
        insert_execution(&mut c, &rec("1-0", "skipped", Some("slot_taken")))
            .await
            .unwrap()
    );
    assert!(insert_execution(&mut c, &rec("1-0", "published", None))
        .await
        .unwrap());
    // The other order: the published row stays.
    assert!(insert_execution(&mut c, &rec("2-0", "published", None))
        .await
        .unwrap());
    assert!(
        !insert_execution(&mut c, &rec("2-0", "skipped", Some("slot_taken")))
            .await
            .unwrap()
    );
    // A plain redelivery of a handled entry adds nothing.
    assert!(!insert_execution(&mut c, &rec("2-0", "published", None))
        .await
        .unwrap());
    let rows: Vec<(String, String, serde_json::Value)> =
        sqlx::query_as("SELECT entry_id, outcome, detail FROM execution ORDER BY entry_id")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!(
        (rows[0].1.as_str(), rows[1].1.as_str()),
        ("published", "published")
    );
    assert_eq!(rows[0].2["superseded"]["n"], "skipped");
    assert!(rows[1].2.get("superseded").is_none());
}
