//! Statement-level guarantees of the store.

use chrono::Utc;
use serde_json::json;
use slotgate::outcome::{Outcome, SkipReason};
use slotgate::store::{insert_execution, DraftStatus, ExecutionRecord, SlotState};

const TAKEN: Outcome = Outcome::Skipped(SkipReason::SlotTaken);

fn rec(entry: &str, outcome: Outcome) -> ExecutionRecord {
    let key: slotgate::slot::SlotKey = "a:2026-01-01:1".parse().unwrap();
    ExecutionRecord::new(key.to_string(), Some(key), outcome, Utc::now(), Utc::now())
        .entry(entry)
        .by("planner", "w")
        .detail(json!({"n": outcome.as_str()}))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_keeps_one_execution_and_the_effect_wins_over_slot_taken() {
    let db = testkit::TestDb::new().await;
    let mut c = db.pool.acquire().await.unwrap();
    // A stalled handler records slot_taken first, the reclaiming one publishes.
    assert!(insert_execution(&mut c, &rec("1-0", TAKEN)).await.unwrap());
    assert!(insert_execution(&mut c, &rec("1-0", Outcome::Published))
        .await
        .unwrap());
    // The other order: the published row stays.
    assert!(insert_execution(&mut c, &rec("2-0", Outcome::Published))
        .await
        .unwrap());
    assert!(!insert_execution(&mut c, &rec("2-0", TAKEN)).await.unwrap());
    // A plain redelivery of a handled entry adds nothing.
    assert!(!insert_execution(&mut c, &rec("2-0", Outcome::Published))
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

/// The states are `text` columns: sqlx's derive with `type_name = "text"`
/// must decode every spelling the CHECK constraints allow, and refuse others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn states_decode_from_text_columns() {
    let db = testkit::TestDb::new().await;
    let slots: Vec<SlotState> = sqlx::query_scalar(
        "SELECT unnest(ARRAY['claimed', 'publishing', 'published', 'skipped', 'failed']::text[])",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        slots,
        [
            SlotState::Claimed,
            SlotState::Publishing,
            SlotState::Published,
            SlotState::Skipped,
            SlotState::Failed
        ]
    );
    assert!(slots.iter().all(|s| json!(s) == s.as_str()));
    let drafts: Vec<DraftStatus> = sqlx::query_scalar(
        "SELECT unnest(ARRAY['draft', 'ready', 'publishing', 'published', 'failed']::text[])",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        drafts,
        [
            DraftStatus::Draft,
            DraftStatus::Ready,
            DraftStatus::Publishing,
            DraftStatus::Published,
            DraftStatus::Failed
        ]
    );
    assert!(drafts.iter().all(|s| json!(s) == s.as_str()));
    let none: Option<SlotState> = sqlx::query_scalar("SELECT NULL::text")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(none, None);
    assert!(sqlx::query_scalar::<_, SlotState>("SELECT 'planned'::text")
        .fetch_one(&db.pool)
        .await
        .is_err());
    // A real column, written by the gate and read back.
    let key: slotgate::slot::SlotKey = "a:2026-01-01:1".parse().unwrap();
    let mut c = db.pool.acquire().await.unwrap();
    let id = slotgate::store::gate_insert(
        &mut c,
        &key,
        SlotState::Skipped,
        Some("operator"),
        "w",
        None,
        Utc::now(),
    )
    .await
    .unwrap();
    assert!(id.is_some());
    let row = slotgate::store::get_slot(&mut c, &key)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(row.state, SlotState::Skipped);
    assert!(!row.is_open());
}
