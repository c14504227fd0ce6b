//! `execution`: one row per handled delivery, written by one statement
//! ([`EXECUTION_UPSERT`]) for every path, so the rule that an effect wins
//! over a `slot_taken` of the same entry is stated once.

use super::StoreError;
use crate::outcome::SlotState;
use crate::outcome::{Outcome, Reason};
use crate::slot::SlotKey;
use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::PgConnection;

/// One row of `execution`. Built with [`ExecutionRecord::new`] and the
/// setters below, so every path fills the row the same way and the
/// outcome and its reason can never disagree.
#[derive(Debug, Clone, PartialEq)]
pub struct ExecutionRecord {
    /// As received (truncated to 200 characters).
    pub slot_key: String,
    /// The parsed key; `None` when the delivery named no valid slot (its
    /// row still records what arrived).
    pub key: Option<SlotKey>,
    /// The stream entry handled; unique, so a redelivery of a recorded
    /// entry writes no second row. `None` for rows no delivery made
    /// (operator verbs).
    pub entry_id: Option<String>,
    /// Who enqueued the delivery (`manual` for an operator's verb).
    pub caller: String,
    /// The worker that wrote the row (`planner` for an operator's verb).
    pub worker_id: String,
    /// The leader epoch the worker had seen, to tell deliveries of
    /// different tenures apart in an investigation.
    pub leader_epoch: Option<i64>,
    /// What happened, stored as the `outcome` and `reason` columns.
    pub outcome: Outcome,
    /// Evidence for people: the webhook's answer, the error, the counts.
    pub detail: Value,
    /// When the slot was due, for lag figures; `None` without a valid key.
    pub due_at: Option<DateTime<Utc>>,
    /// When the worker took the delivery up.
    pub started_at: DateTime<Utc>,
    /// When the outcome was decided.
    pub finished_at: DateTime<Utc>,
}

impl ExecutionRecord {
    /// The one constructor: `outcome` of the delivery of `slot_key` (as
    /// received; `key` when it parsed and names a configured slot). The
    /// rest defaults to empty (no entry, caller, worker, epoch, due time;
    /// detail `{}`) and is set with the setters.
    pub fn new(
        slot_key: impl Into<String>,
        key: Option<SlotKey>,
        outcome: Outcome,
        started_at: DateTime<Utc>,
        finished_at: DateTime<Utc>,
    ) -> Self {
        ExecutionRecord {
            slot_key: slot_key.into(),
            key,
            entry_id: None,
            caller: String::new(),
            worker_id: String::new(),
            leader_epoch: None,
            outcome,
            detail: Value::Object(Default::default()),
            due_at: None,
            started_at,
            finished_at,
        }
    }
    /// The stream entry delivered (none for an operator's or the
    /// reconciler's record): a redelivery of it writes no second row.
    pub fn entry(mut self, entry_id: impl Into<String>) -> Self {
        self.entry_id = Some(entry_id.into());
        self
    }
    /// Who asked (`caller`: planner, manual, reconciler, …) and who wrote
    /// the row (`worker_id`).
    pub fn by(mut self, caller: impl Into<String>, worker_id: impl Into<String>) -> Self {
        self.caller = caller.into();
        self.worker_id = worker_id.into();
        self
    }
    /// The leader epoch the writer held, if it writes as the leader.
    pub fn epoch(mut self, epoch: Option<i64>) -> Self {
        self.leader_epoch = epoch;
        self
    }
    /// Evidence for people (the webhook's answer, the error, the counts).
    pub fn detail(mut self, detail: Value) -> Self {
        self.detail = detail;
        self
    }
    /// The slot's planned due time, when known.
    pub fn due(mut self, due_at: Option<DateTime<Utc>>) -> Self {
        self.due_at = due_at;
        self
    }
}

// ---------------------------------------------------------------- executions

/// The execution upsert: one row per record, from parallel arrays. The one
/// statement that writes `execution` on the delivery paths.
///
/// One entry can be handled twice at once: its worker stalls (or retries
/// after a store error) while another worker reclaims it. The stalled one
/// then finds the slot held by the other and records `slot_taken`; the
/// other publishes. The entry's one row must say what happened to the slot,
/// so an effectful outcome replaces a `slot_taken` of the same entry (the
/// replaced detail is kept under `superseded`), never the reverse.
const EXECUTION_UPSERT: &str = "INSERT INTO execution (slot_key, kind, day, slot, entry_id, caller, worker_id, leader_epoch,
                            outcome, reason, detail, due_at, started_at, finished_at)
     SELECT * FROM UNNEST($1::text[], $2::text[], $3::date[], $4::int[], $5::text[], $6::text[], $7::text[],
                          $8::bigint[], $9::text[], $10::text[], $11::jsonb[], $12::timestamptz[],
                          $13::timestamptz[], $14::timestamptz[])
     ON CONFLICT (entry_id) WHERE entry_id IS NOT NULL DO UPDATE
        SET worker_id = EXCLUDED.worker_id, leader_epoch = EXCLUDED.leader_epoch,
            outcome = EXCLUDED.outcome, reason = EXCLUDED.reason,
            detail = EXCLUDED.detail || jsonb_build_object('superseded', execution.detail),
            started_at = EXCLUDED.started_at, finished_at = EXCLUDED.finished_at
      WHERE execution.reason = 'slot_taken' AND EXCLUDED.reason IS DISTINCT FROM 'slot_taken'";

/// Writes executions in one statement (`EXECUTION_UPSERT`); returns how
/// many rows were written (a record whose entry already has its row is
/// not). The records' stream entries must be distinct.
pub async fn insert_executions(
    conn: &mut PgConnection,
    es: &[ExecutionRecord],
) -> Result<u64, StoreError> {
    if es.is_empty() {
        return Ok(0);
    }
    let r = sqlx::query(EXECUTION_UPSERT)
        .bind(
            es.iter()
                .map(|e| e.slot_key.chars().take(200).collect::<String>())
                .collect::<Vec<_>>(),
        )
        .bind(
            es.iter()
                .map(|e| e.key.as_ref().map(|k| k.kind.clone()))
                .collect::<Vec<_>>(),
        )
        .bind(
            es.iter()
                .map(|e| e.key.as_ref().map(|k| k.day))
                .collect::<Vec<_>>(),
        )
        .bind(
            es.iter()
                .map(|e| e.key.as_ref().map(|k| k.slot_no as i32))
                .collect::<Vec<_>>(),
        )
        .bind(es.iter().map(|e| e.entry_id.clone()).collect::<Vec<_>>())
        .bind(
            es.iter()
                .map(|e| e.caller.chars().take(64).collect::<String>())
                .collect::<Vec<_>>(),
        )
        .bind(es.iter().map(|e| e.worker_id.as_str()).collect::<Vec<_>>())
        .bind(es.iter().map(|e| e.leader_epoch).collect::<Vec<_>>())
        .bind(es.iter().map(|e| e.outcome.as_str()).collect::<Vec<_>>())
        .bind(es.iter().map(|e| e.outcome.reason()).collect::<Vec<_>>())
        .bind(es.iter().map(|e| e.detail.clone()).collect::<Vec<_>>())
        .bind(es.iter().map(|e| e.due_at).collect::<Vec<_>>())
        .bind(es.iter().map(|e| e.started_at).collect::<Vec<_>>())
        .bind(es.iter().map(|e| e.finished_at).collect::<Vec<_>>())
        .execute(conn)
        .await?;
    Ok(r.rows_affected())
}

/// Writes a delivery's one execution row (an [`insert_executions`] of
/// one). `false` when a row for the same stream entry already exists (a
/// redelivery of an already handled entry).
pub async fn insert_execution(
    conn: &mut PgConnection,
    e: &ExecutionRecord,
) -> Result<bool, StoreError> {
    Ok(insert_executions(conn, std::slice::from_ref(e)).await? == 1)
}

/// An execution as the console lists it and streams it.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct ExecutionSummary {
    /// The row's id (rising: the console's event stream follows it).
    pub id: i64,
    /// The slot key as received.
    pub slot_key: String,
    /// Who delivered it.
    pub caller: String,
    /// The worker that handled it.
    pub worker_id: String,
    /// `published`, `skipped` or `failed` (the final gate states' spellings).
    pub outcome: SlotState,
    /// The skip or failure reason.
    pub reason: Option<Reason>,
    /// When handling began.
    pub started_at: DateTime<Utc>,
    /// When the outcome was recorded.
    pub finished_at: DateTime<Utc>,
}

/// The latest `limit` executions, newest first.
pub async fn latest_executions(
    pool: &sqlx::PgPool,
    limit: i64,
) -> Result<Vec<ExecutionSummary>, StoreError> {
    sqlx::query_as(
        "SELECT id, slot_key, caller, worker_id, outcome, reason, started_at, finished_at
           FROM execution ORDER BY id DESC LIMIT $1",
    )
    .bind(limit)
    .fetch_all(pool)
    .await
}

/// The newest execution's id; `None` when there is none.
pub async fn last_execution_id(pool: &sqlx::PgPool) -> Result<Option<i64>, StoreError> {
    sqlx::query_scalar("SELECT max(id) FROM execution")
        .fetch_one(pool)
        .await
}

/// Up to `limit` executions after id `after`, oldest first.
pub async fn executions_after(
    pool: &sqlx::PgPool,
    after: i64,
    limit: i64,
) -> Result<Vec<ExecutionSummary>, StoreError> {
    sqlx::query_as(
        "SELECT id, slot_key, caller, worker_id, outcome, reason, started_at, finished_at
           FROM execution WHERE id > $1 ORDER BY id LIMIT $2",
    )
    .bind(after)
    .bind(limit)
    .fetch_all(pool)
    .await
}
