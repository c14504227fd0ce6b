//! Statement-level guarantees of the store.

use chrono::Utc;
use serde_json::json;
use slotgate::outcome::SlotState;
use slotgate::outcome::{Outcome, SkipReason};
use slotgate::store::{insert_execution, DraftStatus, ExecutionRecord};

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
        Some(slotgate::outcome::SkipReason::Operator),
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

/// A person with psql can write any text into a `reason` column (it has no
/// CHECK). Every typed read keeps it as stored, as `Reason::Unknown`,
/// instead of failing the read or taking it for a reason it is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reason_written_by_hand_is_read_back_as_stored() {
    use slotgate::outcome::{Reason, Recorded};
    let db = testkit::TestDb::new().await;
    let mut c = db.pool.acquire().await.unwrap();
    let key: slotgate::slot::SlotKey = "a:2026-01-01:1".parse().unwrap();
    assert!(insert_execution(&mut c, &rec("1-0", TAKEN)).await.unwrap());
    slotgate::store::gate_skip(&mut c, &key, SkipReason::Operator, Utc::now())
        .await
        .unwrap()
        .unwrap();
    for table in ["execution", "publish_slot"] {
        sqlx::query(&format!(
            "UPDATE {table} SET reason = 'Slot_Taken (by hand)'"
        ))
        .execute(&db.pool)
        .await
        .unwrap();
    }
    let by_hand = Some(Reason::Unknown("Slot_Taken (by hand)".into()));
    let recorded = slotgate::store::entry_outcome(&db.pool, "1-0")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        recorded,
        Recorded {
            state: SlotState::Skipped,
            reason: by_hand.clone()
        }
    );
    assert_eq!(recorded.outcome(), None);
    let totals = slotgate::store::execution_totals(&db.pool, &["a".into()], &[key.day])
        .await
        .unwrap();
    assert_eq!(totals, vec![(recorded, 1)]);
    let row = slotgate::store::get_slot(&mut c, &key)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(row.reason, by_hand);
    let latest = slotgate::store::latest_executions(&db.pool, 1)
        .await
        .unwrap();
    assert_eq!(latest[0].reason, by_hand);
}
