//! `publish_slot`, one row at a time: the gate row of a slot, takeovers,
//! heartbeats, fenced finishes and the operator's verbs. The set-based
//! gate both delivery paths take is in `gate`; these statements are the
//! ones that touch a slot already gated or settle it without a claim.

use super::clocks::millis;
use super::StoreError;
use crate::outcome::{Reason, Recorded, SkipReason, SlotState};
use crate::slot::SlotKey;
use chrono::{DateTime, NaiveDate, Utc};
use serde_json::Value;
use sqlx::postgres::PgPool;
use sqlx::{PgConnection, Row};
use std::time::Duration;

/// The gate row of a slot.
#[derive(Debug, Clone, PartialEq)]
pub struct SlotRow {
    /// The row id, which fenced finishes name.
    pub id: i64,
    /// The slot's kind.
    pub kind: String,
    /// The slot's local day.
    pub day: NaiveDate,
    /// The slot's number within the day.
    pub slot: i32,
    /// Where the slot is: claimed or publishing (open), or settled.
    pub state: SlotState,
    /// The draft bound to it, once picked.
    pub post_id: Option<i64>,
    /// The worker that owns (or last owned) the claim.
    pub claimed_by: String,
    /// Bumped on every takeover; a finish with an older attempt is refused.
    pub attempt: i32,
    /// When an open claim may be taken over unless its owner heartbeats.
    pub claim_expires_at: Option<DateTime<Utc>>,
    /// Why it was skipped or failed.
    pub reason: Option<Reason>,
}

impl SlotRow {
    /// The slot key the row guards.
    pub fn key(&self) -> SlotKey {
        SlotKey::new(self.kind.clone(), self.day, self.slot as u32)
    }
    /// `claimed`/`publishing`: the publish outcome is not known yet.
    pub fn is_open(&self) -> bool {
        self.state.is_open()
    }
    /// The row's state with its reason.
    pub fn recorded(&self) -> Recorded {
        Recorded {
            state: self.state,
            reason: self.reason.clone(),
        }
    }
}

const SLOT_COLS: &str =
    "id, kind, day, slot, state, post_id, claimed_by, attempt, claim_expires_at, reason";

fn slot_row(r: &sqlx::postgres::PgRow) -> Result<SlotRow, StoreError> {
    Ok(SlotRow {
        id: r.try_get("id")?,
        kind: r.try_get("kind")?,
        day: r.try_get("day")?,
        slot: r.try_get("slot")?,
        state: r.try_get("state")?,
        post_id: r.try_get("post_id")?,
        claimed_by: r.try_get("claimed_by")?,
        attempt: r.try_get("attempt")?,
        claim_expires_at: r.try_get("claim_expires_at")?,
        reason: r.try_get("reason")?,
    })
}

// ---------------------------------------------------------------- the gate

/// The gate: inserts the slot's row unless one exists. `Some(id)` only for
/// the one delivery that got in; at READ COMMITTED a concurrent duplicate
/// waits for the winner's commit and then gets `None`.
///
/// A skip is taken with its reason; a claim has none.
///
/// A claim (`claim_expires_at` given) lasts `claim_expires_at - now`,
/// counted on Postgres's clock from the moment the row is written.
#[allow(clippy::too_many_arguments)]
pub async fn gate_insert(
    conn: &mut PgConnection,
    key: &SlotKey,
    state: SlotState,
    reason: Option<SkipReason>,
    worker: &str,
    claim_expires_at: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
) -> Result<Option<i64>, StoreError> {
    sqlx::query_scalar(
        "INSERT INTO publish_slot (day, slot, kind, state, reason, claimed_by, attempt, claim_expires_at, created_at, updated_at)
         VALUES ($1, $2, $3, $4, $5, $6, 1, clock_timestamp() + ($7 - $8), $8, $8)
         ON CONFLICT (day, slot, kind) DO NOTHING
         RETURNING id",
    )
    .bind(key.day)
    .bind(key.slot_no as i32)
    .bind(&key.kind)
    .bind(state.as_str())
    .bind(reason.map(SkipReason::as_str))
    .bind(worker)
    .bind(claim_expires_at)
    .bind(now)
    .fetch_optional(conn)
    .await
}

/// Settles a slot as `skipped/<reason>` with its one execution row, in
/// the caller's transaction: the gate row first ([`gate_insert`]), and
/// `record()` only if this caller took it (so a duplicate builds no
/// record). `false`: the slot had a gate row already and nothing was
/// written. The worker's gate (paused, missed
/// deadline, no draft, cap full) and the reconciler (missed deadline)
/// settle a skip through this one pair.
pub async fn settle_skipped(
    conn: &mut PgConnection,
    key: &SlotKey,
    reason: SkipReason,
    worker: &str,
    now: DateTime<Utc>,
    record: impl FnOnce() -> super::ExecutionRecord,
) -> Result<bool, StoreError> {
    let taken = gate_insert(
        conn,
        key,
        SlotState::Skipped,
        Some(reason),
        worker,
        None,
        now,
    )
    .await?
    .is_some();
    if taken {
        super::insert_execution(conn, &record()).await?;
    }
    Ok(taken)
}

/// Takes a slot's gate row as `skipped/<reason>` on the planner's behalf
/// (an operator's skip, a slot whose time was removed), inside the
/// caller's transaction: `Ok(id)` when taken, `Err(row)` with the gate row
/// that was there first (`None` only if it vanished meanwhile).
pub async fn gate_skip(
    conn: &mut PgConnection,
    key: &SlotKey,
    reason: SkipReason,
    now: DateTime<Utc>,
) -> Result<Result<i64, Option<SlotRow>>, StoreError> {
    match gate_insert(
        conn,
        key,
        SlotState::Skipped,
        Some(reason),
        "planner",
        None,
        now,
    )
    .await?
    {
        Some(id) => Ok(Ok(id)),
        None => Ok(Err(get_slot(conn, key).await?)),
    }
}

/// The gate row of a slot, if any.
pub async fn get_slot(
    conn: &mut PgConnection,
    key: &SlotKey,
) -> Result<Option<SlotRow>, StoreError> {
    sqlx::query(&format!(
        "SELECT {SLOT_COLS} FROM publish_slot WHERE day = $1 AND slot = $2 AND kind = $3"
    ))
    .bind(key.day)
    .bind(key.slot_no as i32)
    .bind(&key.kind)
    .fetch_optional(conn)
    .await?
    .as_ref()
    .map(slot_row)
    .transpose()
}

/// Takes over an open slot whose claim expired by Postgres's clock:
/// `attempt + 1`, same draft, a fresh claim of `visibility`. Conditional on
/// the attempt seen, so of two workers racing to take over only one
/// succeeds.
///
/// A claim of `worker` itself is taken over even while it lives: the caller
/// has checked that no publish of this process holds it, so it was left by
/// an earlier run under the same worker id (restarted) and nobody else can
/// be using it.
pub async fn take_over(
    conn: &mut PgConnection,
    id: i64,
    attempt_seen: i32,
    worker: &str,
    now: DateTime<Utc>,
    visibility: Duration,
) -> Result<Option<SlotRow>, StoreError> {
    sqlx::query(&format!(
        "UPDATE publish_slot
            SET claimed_by = $3, attempt = attempt + 1,
                claim_expires_at = clock_timestamp() + $5 * interval '1 millisecond', updated_at = $4
          WHERE id = $1 AND attempt = $2 AND state IN ('claimed', 'publishing')
            AND (claim_expires_at IS NULL OR claim_expires_at < clock_timestamp() OR claimed_by = $3)
          RETURNING {SLOT_COLS}"
    ))
    .bind(id)
    .bind(attempt_seen)
    .bind(worker)
    .bind(now)
    .bind(millis(visibility))
    .fetch_optional(conn)
    .await?
    .as_ref()
    .map(slot_row)
    .transpose()
}

/// Binds a draft to a freshly claimed slot: `publishing` (the webhook call
/// comes next) or straight to `published` in record-only mode.
pub async fn set_slot_draft(
    conn: &mut PgConnection,
    id: i64,
    post_id: i64,
    state: SlotState,
    response: Option<&Value>,
    now: DateTime<Utc>,
) -> Result<(), StoreError> {
    sqlx::query(
        "UPDATE publish_slot
            SET post_id = $2, state = $3, response = $4, updated_at = $5,
                claim_expires_at = CASE WHEN $3 = 'published' THEN NULL ELSE claim_expires_at END
          WHERE id = $1",
    )
    .bind(id)
    .bind(post_id)
    .bind(state.as_str())
    .bind(response)
    .bind(now)
    .execute(conn)
    .await
    .map(|_| ())
}

/// The statement of [`extend_claims`] ($1 ids, $2 attempts, $3 the worker,
/// $4 visibility ms, $5 its clock).
const EXTEND_CLAIMS: &str = concat!(
    "WITH i AS (SELECT * FROM UNNEST($1::bigint[], $2::int[]) AS i(id, attempt))
         UPDATE publish_slot s
            SET claim_expires_at = clock_timestamp() + $4 * interval '1 millisecond', updated_at = $5
           FROM i
          WHERE ",
    claim_still_held!("$3"),
    "
         RETURNING s.id"
);

/// Extends the claims of `claims` (gate row id, attempt) by `visibility`
/// from Postgres's clock, each fenced on this worker at its attempt, in
/// one statement however many there are → the ids still held. A claim
/// missing from the answer was taken over (or settled) by someone else.
///
/// The rows are found by primary key only, through the same fence as
/// `finish_batch`'s (`store::claim_still_held!`).
pub async fn extend_claims(
    pool: &PgPool,
    claims: &[(i64, i32)],
    worker: &str,
    now: DateTime<Utc>,
    visibility: Duration,
) -> Result<Vec<i64>, StoreError> {
    if claims.is_empty() {
        return Ok(Vec::new());
    }
    // Planned for its claims on every call (`store::claim_still_held!`).
    let held = sqlx::query_scalar(EXTEND_CLAIMS)
        .persistent(false)
        .bind(claims.iter().map(|c| c.0).collect::<Vec<_>>())
        .bind(claims.iter().map(|c| c.1).collect::<Vec<_>>())
        .bind(worker)
        .bind(millis(visibility))
        .bind(now)
        .fetch_all(pool)
        .await?;
    Ok(held)
}

/// Open slots whose claim expired: their worker died or stalled. Expired by
/// both clocks, the caller's `now` and Postgres's: a caller whose clock runs
/// ahead sees no live claim as lapsed.
pub async fn expired_claims(
    pool: &PgPool,
    now: DateTime<Utc>,
    limit: i64,
) -> Result<Vec<SlotRow>, StoreError> {
    let rows = sqlx::query(&format!(
        "SELECT {SLOT_COLS} FROM publish_slot
          WHERE state IN ('claimed', 'publishing') AND claim_expires_at < LEAST($1, clock_timestamp())
          ORDER BY claim_expires_at LIMIT $2"
    ))
    .bind(now)
    .bind(limit)
    .fetch_all(pool)
    .await?;
    rows.iter().map(slot_row).collect()
}

/// Operator retry of a failed slot: reopens it with an already expired claim
/// held by `manual`, so the next delivery takes it over (`attempt + 1`) and
/// resumes it with the same draft and key. An abandoned slot is final: its
/// draft may have been requeued and published under another key since, so
/// retrying it could publish one draft twice.
pub async fn reopen_failed(
    conn: &mut PgConnection,
    key: &SlotKey,
    now: DateTime<Utc>,
) -> Result<Option<SlotRow>, StoreError> {
    update_failed(
        conn,
        "SET state = 'publishing', reason = NULL, claimed_by = 'manual',
             claim_expires_at = $4, updated_at = $4
          WHERE day = $1 AND slot = $2 AND kind = $3 AND state = 'failed' AND post_id IS NOT NULL
            AND reason IS DISTINCT FROM 'abandoned'",
        key,
        now,
    )
    .await
}

/// Operator abandon of a failed slot: it stays `failed`, reason `abandoned`.
/// Only once: a second abandon would release a second unit of the cap.
pub async fn abandon_failed(
    conn: &mut PgConnection,
    key: &SlotKey,
    now: DateTime<Utc>,
) -> Result<Option<SlotRow>, StoreError> {
    update_failed(
        conn,
        "SET reason = 'abandoned', updated_at = $4
          WHERE day = $1 AND slot = $2 AND kind = $3 AND state = 'failed'
            AND reason IS DISTINCT FROM 'abandoned'",
        key,
        now,
    )
    .await
}

/// `UPDATE publish_slot <set_where> RETURNING` the row, binding the key as
/// `$1..$3` and `now` as `$4`: the operator verbs on a failed slot.
async fn update_failed(
    conn: &mut PgConnection,
    set_where: &str,
    key: &SlotKey,
    now: DateTime<Utc>,
) -> Result<Option<SlotRow>, StoreError> {
    sqlx::query(&format!(
        "UPDATE publish_slot {set_where} RETURNING {SLOT_COLS}"
    ))
    .bind(key.day)
    .bind(key.slot_no as i32)
    .bind(&key.kind)
    .bind(now)
    .fetch_optional(conn)
    .await?
    .as_ref()
    .map(slot_row)
    .transpose()
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A database where worker `w` holds 5,000 open claims (attempt 1, gate
    /// rows 1–5,000, each with its draft `publishing`), in tables not yet
    /// analyzed: where a statement that finds a batch's claims by anything
    /// but their key walks them all.
    pub(crate) async fn many_open_claims() -> testkit::TestDb {
        let db = testkit::TestDb::new().await;
        for sql in [
            "INSERT INTO draft (kind, title, status) SELECT 'k', 't' || g, 'publishing'
               FROM generate_series(1, 5000) g",
            "INSERT INTO publish_slot (day, slot, kind, state, post_id, claimed_by, attempt, claim_expires_at)
             SELECT DATE '2030-01-15', g, 'k', 'publishing', g, 'w', 1, now() + interval '30 s'
               FROM generate_series(1, 5000) g",
        ] {
            sqlx::query(sql).execute(&db.pool).await.unwrap();
        }
        db
    }

    /// The heartbeat reaches its claims by primary key, also while the
    /// worker holds thousands of open claims in a table not yet analyzed
    /// (as `finish_batch` does; through `publish_slot_open` a beat would
    /// walk every open claim once per claim renewed).
    #[tokio::test]
    async fn a_heartbeat_finds_its_claims_by_key_among_many_open_claims() {
        let db = many_open_claims().await;
        let ids: Vec<i64> = (1000..1032).collect();
        let plan: Vec<String> = sqlx::query_scalar(&format!("EXPLAIN {EXTEND_CLAIMS}"))
            .bind(&ids)
            .bind(vec![1i32; ids.len()])
            .bind("w")
            .bind(30_000i64)
            .bind(Utc::now())
            .fetch_all(&db.pool)
            .await
            .unwrap();
        testkit::query_plan::assert_reads_by_index(
            &testkit::query_plan::text(&plan),
            "publish_slot",
            "publish_slot_pkey",
            &["publish_slot_open"],
        );
        // And it renews exactly the claims it holds.
        sqlx::query("UPDATE publish_slot SET claimed_by = 'other' WHERE id = 1001")
            .execute(&db.pool)
            .await
            .unwrap();
        let claims: Vec<(i64, i32)> = ids.iter().map(|i| (*i, 1)).collect();
        let mut held = extend_claims(&db.pool, &claims, "w", Utc::now(), Duration::from_secs(30))
            .await
            .unwrap();
        held.sort();
        let want: Vec<i64> = ids.iter().copied().filter(|i| *i != 1001).collect();
        assert_eq!(held, want);
    }
}
