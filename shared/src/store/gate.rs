//! The gate, once, for both delivery paths: set-based statements for a
//! batch of deliveries, of which a single delivery is a batch of one. A
//! batch costs the same few statements whatever its size.

use super::executions::{insert_executions, ExecutionRecord};
use super::quota::{take_quotas, QuotaUnit};
use super::slots::SlotState;
use super::StoreError;
use crate::outcome::Outcome;
use crate::slot::SlotKey;
use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::postgres::PgPool;
use std::collections::HashMap;

// ---------------------------------------------------------------- the gate, set-based
//
// One gate for both delivery paths: a single delivery is a batch of one.
// A batch is one transaction of at most four statements whatever its size:
//
//   1. GATE_INSERT   the gate rows, one INSERT from UNNEST in (kind, day,
//                    slot) order, only for planned slots on time;
//   2. DRAFT_BIND    per kind, the oldest ready drafts in one windowed
//                    `FOR UPDATE SKIP LOCKED` pick, bound to the gated
//                    slots in order; gated slots left without a draft lose
//                    their gate row again (in the same statement);
//   3. EXECUTION_UPSERT  the execution rows of the record-only slots;
//   4. QUOTA_TAKE    the cap's units, one grouped upsert in (kind, day)
//                    order, just before the commit.
//
// Lock order: gate rows first, in (kind, day, slot) order; drafts are
// picked with SKIP LOCKED and never wait; quota rows last, in (kind, day)
// order. A transaction holding a quota row never waits for a gate row, and
// gate and quota rows are each taken in one global order, so two batches
// may wait on each other but cannot deadlock.

/// Statement 1: the gate rows of the planned, on-time slots of a batch.
/// Returns each new row with its input index and the plan's times.
const GATE_INSERT: &str = "WITH i AS (
        SELECT DISTINCT ON (kind, day, slot) *
          FROM UNNEST($1::text[], $2::date[], $3::int[], $4::bool[], $5::bigint[], $6::bool[])
               WITH ORDINALITY AS i(kind, day, slot, exempt, deadline_ms, record_only, n)
         ORDER BY kind, day, slot, n),
     ins AS (
        INSERT INTO publish_slot (day, slot, kind, state, claimed_by, attempt,
                                  claim_expires_at, created_at, updated_at)
        SELECT i.day, i.slot, i.kind, 'claimed', $7, 1,
               CASE WHEN i.record_only THEN $8 ELSE clock_timestamp() + ($9 - $8) END, $8, $8
          FROM i JOIN planned_slot p ON p.kind = i.kind AND p.day = i.day AND p.slot = i.slot
         WHERE i.exempt OR statement_timestamp() <= p.due_at + i.deadline_ms * interval '1 millisecond'
         ORDER BY i.kind, i.day, i.slot
        ON CONFLICT (day, slot, kind) DO NOTHING
        RETURNING id, kind, day, slot)
SELECT (i.n - 1)::int AS idx, ins.id, p.nominal_at, p.due_at
  FROM ins
  JOIN i ON i.kind = ins.kind AND i.day = ins.day AND i.slot = ins.slot
  JOIN planned_slot p ON p.kind = ins.kind AND p.day = ins.day AND p.slot = ins.slot
 ORDER BY i.n";

/// Statement 2: drafts for the gated slots ($1 gate ids in batch order,
/// $2 kinds, $3 slot keys, $4 record-only, $5 the worker's clock). A
/// record-only slot is published on the spot with a synthesized URL; a
/// webhook slot is left `publishing` for the caller's call. Gated slots
/// that got no draft have their gate row removed again. Returns the
/// paired ones.
const DRAFT_BIND: &str = "WITH g AS (
        SELECT g.*, row_number() OVER (PARTITION BY g.kind ORDER BY g.n) AS r
          FROM UNNEST($1::bigint[], $2::text[], $3::text[], $4::bool[])
               WITH ORDINALITY AS g(id, kind, slot_key, record_only, n)),
     want AS (SELECT kind, count(*) AS n FROM g GROUP BY kind),
     pick AS (
        SELECT d.id, d.kind, row_number() OVER (PARTITION BY d.kind ORDER BY d.ready_at, d.id) AS r
          FROM want CROSS JOIN LATERAL (
               SELECT x.id, x.kind, x.ready_at FROM draft x
                WHERE x.kind = want.kind AND x.status = 'ready' AND x.ready_at <= statement_timestamp()
                ORDER BY x.ready_at, x.id
                LIMIT want.n
                  FOR UPDATE SKIP LOCKED) d),
     pair AS (
        SELECT g.id, g.slot_key, g.record_only, pick.id AS post_id,
               'record-only://' || g.kind || '/' || pick.id AS synth_url
          FROM g JOIN pick ON pick.kind = g.kind AND pick.r = g.r),
     bound AS (
        UPDATE draft
           SET slot_key = pair.slot_key,
               status = CASE WHEN pair.record_only THEN 'published' ELSE 'publishing' END,
               url = CASE WHEN pair.record_only THEN pair.synth_url END,
               published_at = CASE WHEN pair.record_only THEN $5 END
          FROM pair
         WHERE draft.id = pair.post_id
        RETURNING draft.id, draft.url, draft.title, draft.body),
     gated AS (
        UPDATE publish_slot
           SET post_id = pair.post_id,
               state = CASE WHEN pair.record_only THEN 'published' ELSE 'publishing' END,
               claim_expires_at = CASE WHEN pair.record_only THEN NULL ELSE publish_slot.claim_expires_at END,
               response = CASE WHEN pair.record_only
                               THEN jsonb_build_object('url', pair.synth_url, 'record_only', true) END,
               updated_at = $5
          FROM pair
         WHERE publish_slot.id = pair.id),
     undone AS (
        DELETE FROM publish_slot
         WHERE id IN (SELECT g.id FROM g WHERE NOT EXISTS (SELECT 1 FROM pair WHERE pair.id = g.id)))
SELECT pair.id AS gate_id, pair.post_id, bound.url, bound.title, bound.body
  FROM pair JOIN bound ON bound.id = pair.post_id";

/// One delivery for [`gate_batch`]; the caller has validated it.
#[derive(Debug, Clone)]
pub struct BatchSlot {
    /// The slot the delivery names.
    pub key: SlotKey,
    /// The stream entry, for its execution row.
    pub entry_id: String,
    /// Who enqueued it, for its execution row.
    pub caller: String,
    /// Exempt from `starting_deadline` (manual, backfill; or a single
    /// delivery whose caller judged the deadline already).
    pub exempt: bool,
    /// The kind's `starting_deadline`: a slot this late past its due time
    /// is not claimed.
    pub deadline_ms: i64,
    /// The kind's `daily_cap` on published slots.
    pub cap: u32,
    /// When the delivery was taken up, for its execution row.
    pub started_at: DateTime<Utc>,
    /// The kind has no publish URL: settle in the batch.
    pub record_only: bool,
}

/// A slot [`gate_batch`] settled (record-only) or claimed (webhook): the
/// index into its input, the gate row, the draft and the plan's times.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchClaim {
    /// Which input slot this is (0-based index into the batch).
    pub idx: i32,
    /// The `publish_slot` row now owning the slot.
    pub gate_id: i64,
    /// The draft bound to it.
    pub post_id: i64,
    /// The draft's title, so the publish needs no second read.
    pub title: String,
    /// The draft's body, likewise.
    pub body: String,
    /// The planned time before jitter.
    pub nominal_at: DateTime<Utc>,
    /// The planned delivery time, for lag figures.
    pub due_at: DateTime<Utc>,
    /// Published and recorded already (record-only).
    pub settled: bool,
}

/// What [`gate_batch`] decided. An index in neither list was left
/// untouched: its slot has a gate row already, or is not planned, or is
/// late.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BatchGate {
    /// The slots claimed or settled.
    pub claims: Vec<BatchClaim>,
    /// Indexes that got a gate row but no ready draft; the row was removed
    /// again, so the caller decides them (`no_ready_draft` or `quota_full`).
    pub no_draft: Vec<i32>,
}

#[derive(sqlx::FromRow)]
struct GateRow {
    idx: i32,
    id: i64,
    nominal_at: DateTime<Utc>,
    due_at: DateTime<Utc>,
}

#[derive(sqlx::FromRow)]
struct BoundRow {
    gate_id: i64,
    post_id: i64,
    url: Option<String>,
    title: String,
    body: String,
}

/// The gate for a batch (see the statements above): one transaction that
/// decides the plain slots of `slots` and leaves the rest untouched.
/// `slots` must be sorted by (kind, day, slot) and their entries distinct.
/// `None`: a cap could not cover the batch, and nothing was written.
///
/// A claim (webhook slot) lasts `expires - now`, counted on Postgres's
/// clock from the moment its gate row is written; the deadline and draft
/// readiness are judged on Postgres's clock too. `now` is only recorded.
pub async fn gate_batch(
    pool: &PgPool,
    slots: &[BatchSlot],
    worker: &str,
    epoch: Option<i64>,
    now: DateTime<Utc>,
    expires: DateTime<Utc>,
) -> Result<Option<BatchGate>, StoreError> {
    let t0 = std::time::Instant::now();
    let mut tx = pool.begin().await?;
    let gates: Vec<GateRow> = sqlx::query_as(GATE_INSERT)
        .bind(
            slots
                .iter()
                .map(|b| b.key.kind.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(slots.iter().map(|b| b.key.day).collect::<Vec<_>>())
        .bind(
            slots
                .iter()
                .map(|b| b.key.slot_no as i32)
                .collect::<Vec<_>>(),
        )
        .bind(slots.iter().map(|b| b.exempt).collect::<Vec<_>>())
        .bind(slots.iter().map(|b| b.deadline_ms).collect::<Vec<_>>())
        .bind(slots.iter().map(|b| b.record_only).collect::<Vec<_>>())
        .bind(worker)
        .bind(now)
        .bind(expires)
        .fetch_all(&mut *tx)
        .await?;
    if gates.is_empty() {
        tx.commit().await?;
        return Ok(Some(BatchGate::default()));
    }
    let slot_of = |g: &GateRow| &slots[g.idx as usize];
    let bound: Vec<BoundRow> = sqlx::query_as(DRAFT_BIND)
        .bind(gates.iter().map(|g| g.id).collect::<Vec<_>>())
        .bind(
            gates
                .iter()
                .map(|g| slot_of(g).key.kind.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(
            gates
                .iter()
                .map(|g| slot_of(g).key.to_string())
                .collect::<Vec<_>>(),
        )
        .bind(
            gates
                .iter()
                .map(|g| slot_of(g).record_only)
                .collect::<Vec<_>>(),
        )
        .bind(now)
        .fetch_all(&mut *tx)
        .await?;
    let by_gate: HashMap<i64, BoundRow> = bound.into_iter().map(|b| (b.gate_id, b)).collect();
    let mut out = BatchGate::default();
    let mut records = Vec::new();
    let mut units = Vec::new();
    for g in gates {
        let b = &slots[g.idx as usize];
        let Some(d) = by_gate.get(&g.id) else {
            out.no_draft.push(g.idx);
            continue;
        };
        if b.record_only {
            let url = d.url.clone().unwrap_or_default();
            let finished_at = now + chrono::Duration::from_std(t0.elapsed()).unwrap_or_default();
            records.push(
                ExecutionRecord::new(
                    b.key.to_string(),
                    Some(b.key.clone()),
                    Outcome::Published,
                    b.started_at,
                    finished_at,
                )
                .entry(b.entry_id.as_str())
                .by(b.caller.as_str(), worker)
                .epoch(epoch)
                .detail(serde_json::json!({ "url": url }))
                .due(Some(g.due_at)),
            );
        }
        units.push(QuotaUnit {
            kind: b.key.kind.clone(),
            day: b.key.day,
            cap: b.cap,
        });
        out.claims.push(BatchClaim {
            idx: g.idx,
            gate_id: g.id,
            post_id: d.post_id,
            title: d.title.clone(),
            body: d.body.clone(),
            nominal_at: g.nominal_at,
            due_at: g.due_at,
            settled: b.record_only,
        });
    }
    insert_executions(&mut tx, &records).await?;
    if !take_quotas(&mut tx, &units).await? {
        tx.rollback().await?;
        return Ok(None);
    }
    tx.commit().await?;
    Ok(Some(out))
}

/// Statement 1 of [`finish_batch`]: the outcomes onto the gate rows, each
/// fenced on this worker's claim at its attempt, and onto their drafts.
/// Per row: whether the fence held, and whether the claim was found already
/// settled (an earlier try of this very transaction committed and only
/// its answer was lost). The final SELECT sees the rows as they were
/// before this statement.
const FINISH_SLOTS: &str = "WITH i AS (
        SELECT * FROM UNNEST($1::bigint[], $2::int[], $3::bigint[], $4::text[], $5::text[], $6::jsonb[], $7::text[])
               WITH ORDINALITY AS i(id, attempt, post_id, state, reason, response, url, n)),
     upd AS (
        UPDATE publish_slot s
           SET state = i.state, reason = i.reason, response = i.response,
               claim_expires_at = NULL, updated_at = $9
          FROM i
         WHERE s.id = i.id AND s.claimed_by = $8 AND s.attempt = i.attempt
           AND s.state IN ('claimed', 'publishing')
        RETURNING s.id),
     drafts AS (
        UPDATE draft d
           SET status = i.state, url = COALESCE(i.url, d.url),
               published_at = CASE WHEN i.state = 'published' THEN $9 ELSE d.published_at END
          FROM i JOIN upd ON upd.id = i.id
         WHERE d.id = i.post_id)
SELECT upd.id IS NOT NULL AS fenced,
       upd.id IS NULL AND EXISTS (
           SELECT 1 FROM publish_slot s
            WHERE s.id = i.id AND s.claimed_by = $8 AND s.attempt = i.attempt
              AND s.state NOT IN ('claimed', 'publishing')) AS earlier
  FROM i LEFT JOIN upd ON upd.id = i.id
 ORDER BY i.n";

/// One finished publish for [`finish_batch`].
#[derive(Debug, Clone)]
pub struct BatchFinish {
    /// The gate row and the claim's attempt (the fence).
    pub id: i64,
    /// The claim's attempt: the finish applies only while it still holds.
    pub attempt: i32,
    /// The draft published, which takes the same state.
    pub post_id: i64,
    /// `Published` or `Failed(_)`: the gate row's and the draft's new state
    /// ([`SlotState::from`]) and the row's reason.
    pub outcome: Outcome,
    /// The CMS's answer, kept on the gate row for operators.
    pub response: Option<Value>,
    /// Where the CMS published it.
    pub url: Option<String>,
    /// The execution when the fence holds.
    pub record: ExecutionRecord,
    /// The execution when it does not (`skipped`/`slot_taken`).
    pub lost: ExecutionRecord,
}

/// How [`finish_batch`] recorded one publish.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finished {
    /// The fence held: the outcome is recorded.
    Recorded,
    /// An earlier try had committed it already; nothing was written again.
    Earlier,
    /// The claim was taken over: the slot is untouched and `slot_taken`
    /// (claim lost) is recorded.
    Lost,
}

/// Records finished publishes in one transaction of two statements
/// (`FINISH_SLOTS`, then `EXECUTION_UPSERT`), each fenced on its claim;
/// a single delivery's finish is a batch of one. Rows are updated in `id`
/// order is not guaranteed, but no two finishes touch the same claim, so
/// two of them never wait on each other. Returns one [`Finished`] per row.
pub async fn finish_batch(
    pool: &PgPool,
    rows: &[BatchFinish],
    worker: &str,
    now: DateTime<Utc>,
) -> Result<Vec<Finished>, StoreError> {
    let mut tx = pool.begin().await?;
    let fences: Vec<(bool, bool)> = sqlx::query_as(FINISH_SLOTS)
        .bind(rows.iter().map(|r| r.id).collect::<Vec<_>>())
        .bind(rows.iter().map(|r| r.attempt).collect::<Vec<_>>())
        .bind(rows.iter().map(|r| r.post_id).collect::<Vec<_>>())
        .bind(
            rows.iter()
                .map(|r| SlotState::from(r.outcome).as_str())
                .collect::<Vec<_>>(),
        )
        .bind(rows.iter().map(|r| r.outcome.reason()).collect::<Vec<_>>())
        .bind(rows.iter().map(|r| r.response.clone()).collect::<Vec<_>>())
        .bind(rows.iter().map(|r| r.url.clone()).collect::<Vec<_>>())
        .bind(worker)
        .bind(now)
        .fetch_all(&mut *tx)
        .await?;
    let finished: Vec<Finished> = fences
        .into_iter()
        .map(|f| match f {
            (true, _) => Finished::Recorded,
            (false, true) => Finished::Earlier,
            (false, false) => Finished::Lost,
        })
        .collect();
    let records: Vec<ExecutionRecord> = rows
        .iter()
        .zip(&finished)
        .filter_map(|(r, f)| match f {
            Finished::Recorded => Some(r.record.clone()),
            Finished::Lost => Some(r.lost.clone()),
            Finished::Earlier => None,
        })
        .collect();
    insert_executions(&mut tx, &records).await?;
    tx.commit().await?;
    Ok(finished)
}
