//! What `planner report` and `trigger --wait` read: slots with their gate
//! rows, drafts and executions.

use super::plan::key_row;
use super::StoreError;
use crate::outcome::SlotState;
use crate::outcome::{Reason, Recorded};
use crate::slot::SlotKey;
use chrono::{DateTime, NaiveDate, Utc};
use sqlx::postgres::PgPool;
use sqlx::{FromRow, Row};

// ---------------------------------------------------------------- reports

/// Gate rows of one kind in a day range: which slots already have an outcome
/// (or an open claim).
pub async fn gate_keys_in_range(
    pool: &PgPool,
    kind: &str,
    from: NaiveDate,
    to: NaiveDate,
) -> Result<Vec<SlotKey>, StoreError> {
    let rows = sqlx::query(
        "SELECT kind, day, slot FROM publish_slot WHERE kind = $1 AND day BETWEEN $2 AND $3",
    )
    .bind(kind)
    .bind(from)
    .bind(to)
    .fetch_all(pool)
    .await?;
    rows.iter().map(key_row).collect()
}

/// One planned slot with its gate row, draft and execution counts.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ReportRow {
    /// The slot key as operators type it.
    pub slot: String,
    /// The slot's kind.
    pub kind: String,
    /// The slot's position in the day's schedule.
    pub slot_no: i32,
    /// The scheduled time before jitter.
    pub nominal_at: DateTime<Utc>,
    /// When it was (or will be) delivered.
    pub due_at: DateTime<Utc>,
    /// The gate row's state; `None` while the slot has no gate row, which
    /// the report spells `planned` ([`ReportRow::state_str`]).
    #[serde(serialize_with = "planned_if_none")]
    pub state: Option<SlotState>,
    /// Why it was skipped or failed.
    pub reason: Option<Reason>,
    /// The draft bound to it.
    pub draft_id: Option<i64>,
    /// Where the draft was published.
    pub url: Option<String>,
    /// When a worker first took a delivery of it up (`not_due` attempts
    /// aside).
    pub started_at: Option<DateTime<Utc>>,
    /// `started_at` minus `due_at`: how late the slot ran.
    pub lag_ms: Option<i64>,
    /// Stream entries of the slot that were handled.
    pub deliveries: i64,
    /// Of those, the ones the gate turned away (`slot_taken`): the
    /// duplicates that would have been a second effect without it.
    pub duplicates_blocked: i64,
}

impl ReportRow {
    /// The state as reported: the gate state, or `planned`.
    pub fn state_str(&self) -> &'static str {
        self.state.map_or("planned", SlotState::as_str)
    }
}

fn planned_if_none<S: serde::Serializer>(
    state: &Option<SlotState>,
    s: S,
) -> Result<S::Ok, S::Error> {
    s.serialize_str(state.map_or("planned", SlotState::as_str))
}

/// The report rows of `(kind, day)` pairs, ordered by due time.
pub async fn report_rows(
    pool: &PgPool,
    kinds: &[String],
    days: &[NaiveDate],
) -> Result<Vec<ReportRow>, StoreError> {
    let rows = sqlx::query(
        "SELECT p.kind, p.day, p.slot, p.nominal_at, p.due_at,
                s.state, s.reason, s.post_id, d.url,
                e.first_start, e.deliveries, e.dups
           FROM planned_slot p
           JOIN UNNEST($1::text[], $2::date[]) AS q(k, d) ON p.kind = q.k AND p.day = q.d
           LEFT JOIN publish_slot s ON s.day = p.day AND s.slot = p.slot AND s.kind = p.kind
           LEFT JOIN draft d ON d.id = s.post_id
           LEFT JOIN LATERAL (
                SELECT min(x.started_at) FILTER (WHERE x.reason IS DISTINCT FROM 'not_due') AS first_start,
                       count(*) AS deliveries,
                       count(*) FILTER (WHERE x.outcome = 'skipped' AND x.reason = 'slot_taken') AS dups
                  FROM execution x
                 WHERE x.kind = p.kind AND x.day = p.day AND x.slot = p.slot AND x.entry_id IS NOT NULL) e ON true
          ORDER BY p.due_at, p.kind, p.slot",
    )
    .bind(kinds)
    .bind(days)
    .fetch_all(pool)
    .await?;
    rows.iter()
        .map(|r| {
            let kind: String = r.try_get("kind")?;
            let day: NaiveDate = r.try_get("day")?;
            let slot: i32 = r.try_get("slot")?;
            let due_at: DateTime<Utc> = r.try_get("due_at")?;
            let started_at: Option<DateTime<Utc>> = r.try_get("first_start")?;
            Ok(ReportRow {
                slot: SlotKey::new(kind.clone(), day, slot as u32).to_string(),
                kind,
                slot_no: slot,
                nominal_at: r.try_get("nominal_at")?,
                due_at,
                state: r.try_get("state")?,
                reason: r.try_get("reason")?,
                draft_id: r.try_get("post_id")?,
                url: r.try_get("url")?,
                started_at,
                lag_ms: started_at.map(|s| (s - due_at).num_milliseconds()),
                deliveries: r.try_get::<Option<i64>, _>("deliveries")?.unwrap_or(0),
                duplicates_blocked: r.try_get::<Option<i64>, _>("dups")?.unwrap_or(0),
            })
        })
        .collect()
}

/// Executions of `(kind, day)` pairs counted by outcome and reason.
pub async fn execution_totals(
    pool: &PgPool,
    kinds: &[String],
    days: &[NaiveDate],
) -> Result<Vec<(Recorded, i64)>, StoreError> {
    let rows = sqlx::query(
        "SELECT x.outcome AS state, x.reason, count(*)
           FROM execution x
           JOIN UNNEST($1::text[], $2::date[]) AS q(k, d) ON x.kind = q.k AND x.day = q.d
          GROUP BY 1, 2 ORDER BY 1, 2",
    )
    .bind(kinds)
    .bind(days)
    .fetch_all(pool)
    .await?;
    rows.iter()
        .map(|r| Ok((Recorded::from_row(r)?, r.try_get(2)?)))
        .collect()
}

/// The outcome and reason recorded for one stream entry, if it was handled
/// (`planner trigger --wait` follows its own delivery by entry id).
pub async fn entry_outcome(pool: &PgPool, entry_id: &str) -> Result<Option<Recorded>, StoreError> {
    sqlx::query_as("SELECT outcome AS state, reason FROM execution WHERE entry_id = $1")
        .bind(entry_id)
        .fetch_optional(pool)
        .await
}
