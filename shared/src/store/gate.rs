//! The gate, once, for both delivery paths: set-based statements for a
//! batch of deliveries, of which a single delivery is a batch of one. A
//! batch costs the same few statements whatever its size.

use super::executions::{insert_executions, ExecutionRecord};
use super::plan::key_columns;
use super::quota::{take_quotas, QuotaUnit};
use super::StoreError;
use crate::outcome::{Outcome, SkipReason, SlotState};
use crate::slot::SlotKey;
use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::postgres::PgPool;

// ---------------------------------------------------------------- the gate, set-based
//
// One gate for both delivery paths: a single delivery is a batch of one.
// A batch is one transaction of three statements whatever its size:
//
//   1. GATE          the planned, on-time slots without a gate row get the
//                    oldest ready drafts of their kind (one windowed
//                    `FOR UPDATE SKIP LOCKED` pick per kind), and each
//                    paired slot's gate row is inserted in its final form
//                    (record-only: `published`; webhook: `publishing`
//                    under this worker's claim) with its draft bound, in
//                    (kind, day, slot) order;
//   2. EXECUTION_UPSERT  the execution rows of the record-only slots;
//   3. QUOTA_TAKE    the cap's units, one grouped upsert in (kind, day)
//                    order, just before the commit.
//
// Why the draft is picked before the gate row is written: a gate row
// written once costs one heap tuple and one entry per index; written as
// `claimed` and then updated with its draft it cost two of each, and that
// update was the largest single cost of a record-only batch (measured with
// auto_explain in a 2-worker burst: 60 ms of 160 for 216 slots;
// docs/BENCHMARKS.md). A slot whose insert meets a row written meanwhile by
// a concurrent delivery (`ON CONFLICT DO NOTHING`) keeps its picked draft
// `ready`; the lock on it ends with the transaction. Drafts are then taken
// oldest-first among those no other gate transaction holds, as with any
// `SKIP LOCKED` pick.
//
// Lock order: the process's turn first (`GateTurn`, in memory, before
// BEGIN; given back after GATE); then drafts, picked with SKIP LOCKED (never waiting) or,
// before a slot is recorded as having no ready draft, waiting for them
// while holding nothing else (`DraftPick`); then
// gate rows in (kind, day, slot) order; quota rows last, in (kind, day)
// order. A transaction holding a quota row never waits for a gate row, and
// gate and quota rows are each taken in one global order, so two batches
// may wait on each other but cannot deadlock.

/// The pick of a kind without rotation: the first `n` entries of index
/// `draft_pick_priority` (priority, then age, then id), locked as they are
/// read. The hot path: every kind that does not say `rotate_by`.
macro_rules! plain_pick {
    ($lock:literal) => { concat!("pick AS (
        SELECT want.kind, array_agg(d.id ORDER BY d.priority DESC, d.ready_at, d.id) AS ids
          FROM want CROSS JOIN LATERAL (
               SELECT x.id, x.priority, x.ready_at FROM draft x
                WHERE x.kind = want.kind AND x.status = 'ready' AND x.ready_at <= statement_timestamp()
                ORDER BY x.priority DESC, x.ready_at, x.id
                LIMIT want.n
                  ", $lock, ") d
         GROUP BY want.kind)") };
}

/// The pick of a `rotate_by = "category"` kind: its ready drafts ranked by
/// their turn within their category (priority, age, id), then by when the
/// category last published (never first, from `draft_category_out`), then
/// the category's name; the first `n` are locked. So a day takes one of
/// each category before a second of any, least recently published first.
///
/// The fast pick (`SKIP LOCKED`) considers only drafts whose turn is at
/// most `n` — only they can be among the first `n` — so the last-publish
/// look-up (one index probe) runs for at most `n` drafts per category,
/// not for every ready draft. That shortcut may come up short when other
/// transactions hold or just published those drafts; a slot left without
/// a draft is never recorded by this pick but goes the one-delivery way,
/// whose waiting pick (`Wait`) considers every ready draft of the kind
/// (measured: a burst of 12 slots over a cap of 5 recorded
/// `no_ready_draft` with drafts left when the waiting pick was cut short
/// too). Numbering the turns reads the kind's ready drafts either way,
/// which is why only rotating kinds run this pick: a batch's rotating
/// slots go through their own statement in the same transaction
/// ([`gate_batch`]), and a fleet without `rotate_by` never runs it.
macro_rules! rotating_pick {
    ($lock:literal, $turns:literal) => { concat!("pick AS (
        SELECT want.kind,
               array_agg(d.id ORDER BY d.turn, d.last_out NULLS FIRST, d.category NULLS FIRST,
                                       d.priority DESC, d.ready_at, d.id) AS ids
          FROM want CROSS JOIN LATERAL (
               SELECT x.id, r.turn, r.last_out, r.category, r.priority, r.ready_at
                 FROM (SELECT t.id, t.turn, t.category, t.priority, t.ready_at,
                              CASE WHEN t.category IS NULL
                                   THEN (SELECT max(p.published_at) FROM draft p
                                          WHERE p.kind = want.kind AND p.status = 'published'
                                            AND p.category IS NULL)
                                   ELSE (SELECT max(p.published_at) FROM draft p
                                          WHERE p.kind = want.kind AND p.status = 'published'
                                            AND p.category = t.category)
                              END AS last_out
                         FROM (SELECT d.id, d.category, d.priority, d.ready_at,
                                      row_number() OVER (PARTITION BY d.category
                                                         ORDER BY d.priority DESC, d.ready_at, d.id) AS turn
                                 FROM draft d
                                WHERE d.kind = want.kind AND d.status = 'ready'
                                  AND d.ready_at <= statement_timestamp()) t
                        ", $turns, ") r
                 -- The locked row must still be ready: a draft another
                 -- transaction published after this statement's snapshot
                 -- is re-read when its lock is granted, and only a
                 -- condition on x itself is checked again (without it,
                 -- one draft was bound to two slots).
                 JOIN draft x ON x.id = r.id AND x.status = 'ready'
                ORDER BY r.turn, r.last_out NULLS FIRST, r.category NULLS FIRST,
                         r.priority DESC, r.ready_at, r.id
                LIMIT want.n
                  ", $lock, ") d
         GROUP BY want.kind)") };
}

/// Statement 1 ($1–$7 the batch's columns: kind, day, slot, exempt,
/// deadline ms, record-only, slot key; $8 the worker, $9 its clock,
/// $10 the claim's expiry on that clock), with the draft pick (a `pick`
/// CTE: [`plain_pick!`] or [`rotating_pick!`], each with its locking clause,
/// see [`DraftPick`]) as the macro's argument. Returns one row per slot it
/// decided — gated with its draft (`gate_id` set), or planned, on time and
/// without a gate row but left without a ready draft (`gate_id` NULL).
/// Slots in neither were left untouched.
///
/// A record-only slot's row carries no title or body: nothing is sent, and
/// a post's body (often tens of kilobytes, TOASTed) would otherwise be
/// decompressed, sent and decoded once per slot for nothing.
macro_rules! gate_statement {
    ($pick:expr) => { concat!("WITH i AS (
        SELECT DISTINCT ON (kind, day, slot) *
          FROM UNNEST($1::text[], $2::date[], $3::int[], $4::bool[], $5::bigint[], $6::bool[], $7::text[])
               WITH ORDINALITY AS i(kind, day, slot, exempt, deadline_ms, record_only, slot_key, n)
         ORDER BY kind, day, slot, n),
     c AS (
        SELECT i.*, p.nominal_at, p.due_at,
               row_number() OVER (PARTITION BY i.kind ORDER BY i.day, i.slot) AS r
          FROM i CROSS JOIN LATERAL (
               SELECT p.nominal_at, p.due_at FROM planned_slot p
                WHERE p.kind = i.kind AND p.day = i.day AND p.slot = i.slot
               OFFSET 0) p
         WHERE (i.exempt OR statement_timestamp() <= p.due_at + i.deadline_ms * interval '1 millisecond')
           AND ", no_gate_row!("i"), "),
     want AS (SELECT kind, count(*) AS n FROM c GROUP BY kind),
     ", $pick, ",
     pair AS (
        SELECT c.*, pick.ids[c.r] AS post_id,
               CASE WHEN pick.ids[c.r] IS NOT NULL THEN nextval('publish_slot_id_seq') END AS gate_id,
               'record-only://' || c.kind || '/' || pick.ids[c.r] AS synth_url
          FROM c LEFT JOIN pick ON pick.kind = c.kind),
     ins AS (
        INSERT INTO publish_slot (id, day, slot, kind, state, post_id, claimed_by, attempt,
                                  claim_expires_at, response, created_at, updated_at)
        SELECT gate_id, day, slot, kind, CASE WHEN record_only THEN 'published' ELSE 'publishing' END,
               post_id, $8, 1,
               CASE WHEN record_only THEN NULL ELSE clock_timestamp() + ($10 - $9) END,
               CASE WHEN record_only THEN jsonb_build_object('url', synth_url, 'record_only', true) END,
               $9, $9
          FROM pair
         WHERE post_id IS NOT NULL
         ORDER BY kind, day, slot
        ON CONFLICT (day, slot, kind) DO NOTHING
        RETURNING id),
     bound AS (
        UPDATE draft
           SET slot_key = pair.slot_key,
               status = CASE WHEN pair.record_only THEN 'published' ELSE 'publishing' END,
               url = CASE WHEN pair.record_only THEN pair.synth_url END,
               published_at = CASE WHEN pair.record_only THEN $9 END
          FROM pair
         WHERE draft.id = pair.post_id AND pair.gate_id = ANY (ARRAY(SELECT id FROM ins))
        RETURNING (pair.n - 1)::int AS idx, pair.gate_id, draft.id AS post_id, draft.url,
                  CASE WHEN NOT pair.record_only THEN draft.title END AS title,
                  CASE WHEN NOT pair.record_only THEN draft.body END AS body,
                  draft.cms_id, pair.nominal_at, pair.due_at)
SELECT * FROM bound
UNION ALL
SELECT (n - 1)::int, NULL, NULL, NULL, NULL, NULL, NULL, nominal_at, due_at FROM pair WHERE post_id IS NULL") };
}

/// How `GATE` locks the drafts it picks.
///
/// `SkipLocked` never waits, so concurrent batches of one kind take
/// different drafts side by side; but a draft it skips may belong to a
/// transaction that will not keep it (a delivery whose slot a concurrent
/// one gated first, or a batch its cap rolls back). "No ready draft" from
/// that pick is therefore only a hint: before the slot is *recorded* as
/// `no_ready_draft` the gate asks again with `Wait`, which waits for those
/// transactions to end and sees what they left. `Wait` is safe from
/// deadlock because `GATE` is the first statement of its transaction: a
/// waiting pick holds nothing another transaction could be waiting for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DraftPick {
    /// `FOR UPDATE SKIP LOCKED`: the fast pick, for every first try.
    SkipLocked,
    /// `FOR UPDATE`: the exact pick, before a slot is recorded as having
    /// no ready draft.
    Wait,
}

impl DraftPick {
    /// The gate statement with this lock, for rotating kinds' slots or the
    /// others'.
    fn statement(self, rotate: bool) -> &'static str {
        match (self, rotate) {
            (DraftPick::SkipLocked, false) => {
                gate_statement!(plain_pick!("FOR UPDATE SKIP LOCKED"))
            }
            (DraftPick::Wait, false) => gate_statement!(plain_pick!("FOR UPDATE")),
            (DraftPick::SkipLocked, true) => gate_statement!(rotating_pick!(
                "FOR UPDATE OF x SKIP LOCKED",
                "WHERE t.turn <= want.n"
            )),
            (DraftPick::Wait, true) => {
                gate_statement!(rotating_pick!("FOR UPDATE OF x", "WHERE true"))
            }
        }
    }
}

/// The turn a process's gate transactions take for their `GATE`
/// statement: one at a time per [`GateTurn`] (one per worker process,
/// shared by its clones of the executor).
///
/// Why: concurrent gate transactions of one kind all start their `SKIP
/// LOCKED` pick at the kind's head and step over the drafts the others
/// hold or have just taken — 5.0 index entries read per draft locked in a
/// 2-worker burst. A worker's windows span every kind, so its own
/// concurrent gates contended on every kind. Taking turns inside a
/// process leaves only the processes to contend, while each transaction's
/// other statements (execution rows, quota, commit) still overlap the next
/// gate: Postgres spent about a tenth less CPU per slot and record-only
/// bursts ran 10–40 % faster (docs/benchmarks-archive.md, 2026-12-06
/// 19:20). Serializing whole transactions, or the statement across
/// processes, left a core idle and ran a fifth slower (the entry before).
///
/// Deadlock-free: the turn is taken before the transaction begins, so a
/// task waiting for it holds no row lock and no connection; the holder's
/// statement may wait only on transactions past their own turn, which
/// never wait for it again.
#[derive(Debug, Clone, Default)]
pub struct GateTurn(std::sync::Arc<tokio::sync::Mutex<()>>);

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
    /// The kind picks by `rotate_by = "category"`: the category published
    /// least recently first, then priority, age and id within it.
    pub rotate: bool,
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
    /// The draft's title, so the publish needs no second read (empty for
    /// a settled claim: a record-only slot sends nothing).
    pub title: String,
    /// The draft's body, likewise (empty when settled).
    pub body: String,
    /// The post's id at the CMS, for a draft mirrored from WordPress.
    pub cms_id: Option<i64>,
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
    /// Indexes of slots planned, on time and without a gate row that found
    /// no ready draft; nothing was written for them, and the caller decides
    /// them (`no_ready_draft` or `quota_full`).
    pub no_draft: Vec<i32>,
}

/// A row of `GATE`: a gated slot (`gate_id` set, with its draft) or a slot
/// left without a ready draft.
#[derive(sqlx::FromRow)]
struct GateRow {
    idx: i32,
    gate_id: Option<i64>,
    post_id: Option<i64>,
    url: Option<String>,
    title: Option<String>,
    body: Option<String>,
    cms_id: Option<i64>,
    nominal_at: DateTime<Utc>,
    due_at: DateTime<Utc>,
}

/// The gate for a batch (see the statements above): one transaction that
/// decides the plain slots of `slots` and leaves the rest untouched.
/// `slots` must be sorted by (kind, day, slot) and their entries distinct.
/// `None`: a cap could not cover the batch, and nothing was written.
///
/// A claim (webhook slot) lasts `expires - now`, counted on Postgres's
/// clock from the moment its gate row is written; the deadline and draft
/// readiness are judged on Postgres's clock too. `now` is only recorded.
/// The `GATE` statements run in the process's `turn` ([`GateTurn`]).
#[allow(clippy::too_many_arguments)]
pub async fn gate_batch(
    pool: &PgPool,
    turn: &GateTurn,
    slots: &[BatchSlot],
    worker: &str,
    epoch: Option<i64>,
    now: DateTime<Utc>,
    expires: DateTime<Utc>,
    pick: DraftPick,
) -> Result<Option<BatchGate>, StoreError> {
    let t0 = std::time::Instant::now();
    // Written once per slot: bound for the drafts, reused for the records.
    let key_texts: Vec<String> = slots.iter().map(|b| b.key.to_string()).collect();
    // Taken before the transaction begins (see `GateTurn`), given back
    // once the `GATE` statements are done.
    let my_turn = turn.0.lock().await;
    let mut tx = pool.begin().await?;
    // Rotating kinds' slots run their own pick (see `rotating_pick!`):
    // the plain slots first, then the rotating ones, in one transaction.
    // They never share a kind, so neither statement waits for a draft the
    // other locked; and the `Wait` pick, which may wait, gates one slot.
    let mut rows = Vec::new();
    for rotate in [false, true] {
        let part: Vec<usize> = (0..slots.len())
            .filter(|&i| slots[i].rotate == rotate)
            .collect();
        if part.is_empty() {
            continue;
        }
        let (kinds, days, nos) = key_columns(part.iter().map(|&i| &slots[i].key));
        let got: Vec<GateRow> = sqlx::query_as(pick.statement(rotate))
            .bind(&kinds)
            .bind(&days)
            .bind(&nos)
            .bind(part.iter().map(|&i| slots[i].exempt).collect::<Vec<_>>())
            .bind(
                part.iter()
                    .map(|&i| slots[i].deadline_ms)
                    .collect::<Vec<_>>(),
            )
            .bind(
                part.iter()
                    .map(|&i| slots[i].record_only)
                    .collect::<Vec<_>>(),
            )
            .bind(
                part.iter()
                    .map(|&i| key_texts[i].as_str())
                    .collect::<Vec<_>>(),
            )
            .bind(worker)
            .bind(now)
            .bind(expires)
            .fetch_all(&mut *tx)
            .await?;
        // The statement's index is into `part`; back to `slots`.
        rows.extend(got.into_iter().map(|mut g| {
            g.idx = part[g.idx as usize] as i32;
            g
        }));
    }
    drop(my_turn);
    // Batch order (the statement returns its rows as they come), which is
    // the (kind, day, slot) order the callers sorted the batch in.
    rows.sort_by_key(|g| g.idx);
    let mut out = BatchGate::default();
    let mut records = Vec::new();
    let mut units = Vec::new();
    let finished_at = now + chrono::Duration::from_std(t0.elapsed()).unwrap_or_default();
    for g in rows {
        let b = &slots[g.idx as usize];
        let (Some(gate_id), Some(post_id)) = (g.gate_id, g.post_id) else {
            out.no_draft.push(g.idx);
            continue;
        };
        if b.record_only {
            records.push(
                ExecutionRecord::new(
                    key_texts[g.idx as usize].clone(),
                    Some(b.key.clone()),
                    Outcome::Published,
                    b.started_at,
                    finished_at,
                )
                .entry(b.entry_id.as_str())
                .by(b.caller.as_str(), worker)
                .epoch(epoch)
                .detail(serde_json::json!({ "url": g.url.unwrap_or_default() }))
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
            gate_id,
            post_id,
            title: g.title.unwrap_or_default(),
            body: g.body.unwrap_or_default(),
            cms_id: g.cms_id,
            nominal_at: g.nominal_at,
            due_at: g.due_at,
            settled: b.record_only,
        });
    }
    if out.claims.is_empty() {
        tx.commit().await?;
        return Ok(Some(out));
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
/// A `skipped` finish (`draft_withdrawn`: the CMS no longer had the draft
/// ready) releases its draft (`draft`, unbound); `published` and `failed`
/// keep it. Per row: whether the fence held.
///
/// The gate rows are found by primary key only (the fence is
/// `store::claim_still_held!`, which says why). What only a rare row
/// needs runs after it, and only then: the daily cap's units of `skipped`
/// rows given back ([`RELEASE_UNITS`]) and the lookup of rows whose fence
/// failed ([`SETTLED_EARLIER`]). Inside this statement, planned on every
/// call, they cost every finish their planning and their joins: about a
/// third of the finish's Postgres time in a webhook burst
/// (docs/benchmarks-archive.md, 2026-12-08 00:45).
const FINISH_SLOTS: &str = concat!("WITH i AS (
        SELECT * FROM UNNEST($1::bigint[], $2::int[], $3::bigint[], $4::text[], $5::text[], $6::jsonb[], $7::text[])
               WITH ORDINALITY AS i(id, attempt, post_id, state, reason, response, url, n)),
     upd AS (
        UPDATE publish_slot s
           SET state = i.state, reason = i.reason, response = i.response,
               claim_expires_at = NULL, updated_at = $9
          FROM i
         WHERE ", claim_still_held!("$8"), "
        RETURNING s.id),
     drafts AS (
        UPDATE draft d
           SET status = CASE WHEN i.state = 'skipped' THEN 'draft' ELSE i.state END,
               slot_key = CASE WHEN i.state = 'skipped' THEN NULL ELSE d.slot_key END,
               url = COALESCE(i.url, d.url),
               published_at = CASE WHEN i.state = 'published' THEN $9 ELSE d.published_at END
          FROM i JOIN upd ON upd.id = i.id
         WHERE d.id = i.post_id)
SELECT upd.id IS NOT NULL AS fenced
  FROM i LEFT JOIN upd ON upd.id = i.id
 ORDER BY i.n");

/// After [`FINISH_SLOTS`], for the `skipped` rows whose fence held (gate
/// row ids `$1`): each slot's unit of its day's cap given back, as the
/// gate took it.
const RELEASE_UNITS: &str = "UPDATE daily_quota q SET used = q.used - r.n
  FROM (SELECT s.kind, s.day, count(*)::int AS n
          FROM publish_slot s
         WHERE s.id = ANY ($1::bigint[])
         GROUP BY s.kind, s.day) r
 WHERE q.kind = r.kind AND q.day = r.day AND q.used >= r.n";

/// After [`FINISH_SLOTS`], for the rows whose fence failed (gate row ids
/// `$1`, attempts `$2`): those found settled by this worker at the same
/// attempt — an earlier try of this very finish committed and only its
/// answer was lost. A lookup by key per row (`LATERAL … OFFSET 0`; as
/// `EXISTS` it was planned as a hashed subplan over a scan of the whole
/// table).
const SETTLED_EARLIER: &str = "SELECT i.id
  FROM UNNEST($1::bigint[], $2::int[]) AS i(id, attempt)
  JOIN LATERAL (
       SELECT s.id FROM publish_slot s
        WHERE s.id = i.id AND s.claimed_by = $3 AND s.attempt = i.attempt
          AND s.state NOT IN ('claimed', 'publishing')
       OFFSET 0) e ON true";

/// One finished publish for [`finish_batch`].
#[derive(Debug, Clone)]
pub struct BatchFinish {
    /// The gate row and the claim's attempt (the fence).
    pub id: i64,
    /// The claim's attempt: the finish applies only while it still holds.
    pub attempt: i32,
    /// The draft published, which takes the same state.
    pub post_id: i64,
    /// `Published`, `Failed(_)` or `Skipped(DraftWithdrawn)`: the gate row's and the draft's new state
    /// ([`SlotState::from`]) and the row's reason.
    pub outcome: Outcome,
    /// The CMS's answer, kept on the gate row for operators.
    pub response: Option<Value>,
    /// Where the CMS published it.
    pub url: Option<String>,
    /// The execution when the fence holds.
    pub record: ExecutionRecord,
    /// Whether the claim's heartbeat had already found it taken over: a
    /// word in the execution recorded when the fence does not hold
    /// (`record` as `skipped`/`slot_taken`, detail `claim_lost`), which is
    /// made only then — a lost claim is rare.
    pub heartbeat_saw_loss: bool,
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

/// Records finished publishes in one transaction: `FINISH_SLOTS`, fenced
/// on each claim; `RELEASE_UNITS` when a fenced row is `skipped` and
/// `SETTLED_EARLIER` when a fence failed (both rare); then the execution
/// rows. A single delivery's finish is a batch of one. Rows are updated in `id`
/// order is not guaranteed, but no two finishes touch the same claim, so
/// two of them never wait on each other. Returns one [`Finished`] per row.
pub async fn finish_batch(
    pool: &PgPool,
    rows: &[BatchFinish],
    worker: &str,
    now: DateTime<Utc>,
) -> Result<Vec<Finished>, StoreError> {
    let mut tx = pool.begin().await?;
    // Planned for its rows on every call (`store::claim_still_held!`).
    let fenced: Vec<bool> = sqlx::query_scalar(FINISH_SLOTS)
        .persistent(false)
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
    // The fenced `skipped` rows give their units back; the unfenced ones
    // are looked up. Both are rare.
    let skipped: Vec<i64> = (rows.iter().zip(&fenced))
        .filter(|(r, fenced)| **fenced && SlotState::from(r.outcome) == SlotState::Skipped)
        .map(|(r, _)| r.id)
        .collect();
    let unfenced: Vec<&BatchFinish> = (rows.iter().zip(&fenced))
        .filter(|(_, fenced)| !**fenced)
        .map(|(r, _)| r)
        .collect();
    if !skipped.is_empty() {
        sqlx::query(RELEASE_UNITS)
            .bind(&skipped)
            .execute(&mut *tx)
            .await?;
    }
    let earlier: Vec<i64> = if unfenced.is_empty() {
        Vec::new()
    } else {
        // Planned for its rows, as the fence's statements.
        sqlx::query_scalar(SETTLED_EARLIER)
            .persistent(false)
            .bind(unfenced.iter().map(|r| r.id).collect::<Vec<_>>())
            .bind(unfenced.iter().map(|r| r.attempt).collect::<Vec<_>>())
            .bind(worker)
            .fetch_all(&mut *tx)
            .await?
    };
    let finished: Vec<Finished> = (rows.iter().zip(fenced))
        .map(|(r, fenced)| match fenced {
            true => Finished::Recorded,
            false if earlier.contains(&r.id) => Finished::Earlier,
            false => Finished::Lost,
        })
        .collect();
    let records: Vec<ExecutionRecord> = rows
        .iter()
        .zip(&finished)
        .filter_map(|(r, f)| match f {
            Finished::Recorded => Some(r.record.clone()),
            Finished::Lost => Some(ExecutionRecord {
                outcome: Outcome::Skipped(SkipReason::SlotTaken),
                detail: serde_json::json!({"claim_lost": true, "attempt": r.attempt,
                                           "heartbeat_saw_loss": r.heartbeat_saw_loss}),
                ..r.record.clone()
            }),
            Finished::Earlier => None,
        })
        .collect();
    insert_executions(&mut tx, &records).await?;
    tx.commit().await?;
    Ok(finished)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::plan::tests::{a_burst_under_way, burst_day, probes_the_unique_index};
    use crate::store::slots::tests::many_open_claims;

    /// `slots` through the gate's fast pick in a turn of their own, under
    /// worker "w", each webhook claim lasting `claim`; the caps must
    /// cover them.
    async fn gate_fast(pool: &PgPool, slots: &[BatchSlot], claim: chrono::Duration) -> BatchGate {
        let now = Utc::now();
        let turn = GateTurn::default();
        let pick = DraftPick::SkipLocked;
        gate_batch(pool, &turn, slots, "w", None, now, now + claim, pick)
            .await
            .unwrap()
            .expect("the caps cover the batch")
    }

    /// A record-only slot's claim comes back without its draft's text (it
    /// sends nothing; a post's body is often tens of kilobytes, TOASTed);
    /// a webhook slot's carries title and body, so its publish needs no
    /// second read. Both drafts are bound and published alike.
    #[tokio::test]
    async fn only_a_claim_that_calls_carries_its_drafts_text() {
        let db = testkit::TestDb::new().await;
        let day = burst_day();
        let body = "<p>body</p>".repeat(1_000);
        for kind in ["quiet", "loud"] {
            sqlx::query(
                "INSERT INTO planned_slot (kind, day, slot, nominal_at, due_at, jitter_ms, source)
                 VALUES ($1, $2, 1, now() - interval '1 min', now() - interval '1 min', 0, 'plan')",
            )
            .bind(kind)
            .bind(day)
            .execute(&db.pool)
            .await
            .unwrap();
            sqlx::query(
                "INSERT INTO draft (kind, title, body, ready_at) VALUES ($1, $1 || ' title', $2, now() - interval '1 hour')",
            )
            .bind(kind)
            .bind(&body)
            .execute(&db.pool)
            .await
            .unwrap();
        }
        let slot = |kind: &str, record_only: bool| BatchSlot {
            key: SlotKey::new(kind, day, 1),
            entry_id: format!("{kind}-0"),
            caller: "planner".into(),
            exempt: true,
            deadline_ms: 60_000,
            cap: 10,
            started_at: Utc::now(),
            record_only,
            rotate: false,
        };
        // (kind, day, slot) order: "loud" before "quiet".
        let slots = [slot("loud", false), slot("quiet", true)];
        let gate = gate_fast(&db.pool, &slots, chrono::Duration::seconds(30)).await;
        assert!(gate.no_draft.is_empty(), "{gate:?}");
        let [loud, quiet] = &gate.claims[..] else {
            panic!("two claims: {gate:?}")
        };
        assert!(!loud.settled && quiet.settled, "{gate:?}");
        // Lengths, not the texts: a failure should not print 11 kB.
        assert_eq!(
            (loud.title.as_str(), loud.body.len(), loud.body == body),
            ("loud title", body.len(), true)
        );
        assert_eq!((quiet.title.as_str(), quiet.body.len()), ("", 0));
        let states: Vec<(String, String)> =
            sqlx::query_as("SELECT kind, status FROM draft ORDER BY kind")
                .fetch_all(&db.pool)
                .await
                .unwrap();
        assert_eq!(
            states,
            [
                ("loud".to_owned(), "publishing".to_owned()),
                ("quiet".to_owned(), "published".to_owned())
            ]
        );
    }

    /// The gate's own probe for an existing gate row goes through the
    /// unique index on a burst's unanalyzed tables, like the reconciler's
    /// (`store::no_gate_row!`).
    #[tokio::test]
    async fn the_gate_probes_for_a_gate_row_on_the_unique_index_in_a_burst() {
        let db = a_burst_under_way().await;
        let keys: Vec<SlotKey> = (3601..3633)
            .map(|s| SlotKey::new("k3", burst_day(), s))
            .collect();
        let n = keys.len();
        let (kinds, days, nos) = key_columns(&keys);
        let plan: Vec<String> = sqlx::query_scalar(&format!(
            "EXPLAIN {}",
            DraftPick::SkipLocked.statement(false)
        ))
        .bind(&kinds)
        .bind(&days)
        .bind(&nos)
        .bind(vec![false; n])
        .bind(vec![60_000i64; n])
        .bind(vec![true; n])
        .bind(keys.iter().map(SlotKey::to_string).collect::<Vec<_>>())
        .bind("w")
        .bind(Utc::now())
        .bind(Utc::now() + chrono::Duration::seconds(30))
        .fetch_all(&db.pool)
        .await
        .unwrap();
        probes_the_unique_index(&plan);
    }

    /// A batch that mixes a rotating kind with a plain one runs the two
    /// picks in one transaction and maps each row back to its own slot:
    /// the plain kind takes its oldest drafts, the rotating one one draft
    /// per category, and every claim names a draft of its own slot's kind.
    #[tokio::test]
    async fn a_mixed_batch_gates_each_kind_by_its_own_pick() {
        let db = testkit::TestDb::new().await;
        let day = Utc::now().date_naive();
        sqlx::query(
            "INSERT INTO planned_slot (kind, day, slot, nominal_at, due_at, jitter_ms, source)
             SELECT k, $1, s, now() - interval '1 min', now() - interval '1 min', 0, 'plan'
               FROM unnest(ARRAY['blog', 'news']) k, generate_series(1, 2) s",
        )
        .bind(day)
        .execute(&db.pool)
        .await
        .unwrap();
        // blog: three drafts, oldest first. news: two of sport, then one
        // of arts, each older than the next.
        let mut ids = Vec::new();
        for (kind, cat, age) in [
            ("blog", None, 9),
            ("blog", None, 8),
            ("blog", None, 7),
            ("news", Some("sport"), 6),
            ("news", Some("sport"), 5),
            ("news", Some("arts"), 4),
        ] {
            let id: i64 = sqlx::query_scalar(
                "INSERT INTO draft (kind, title, body, status, ready_at, category)
                 VALUES ($1, 't', '', 'ready', now() - $3 * interval '1 min', $2) RETURNING id",
            )
            .bind(kind)
            .bind(cat)
            .bind(age)
            .fetch_one(&db.pool)
            .await
            .unwrap();
            ids.push(id);
        }
        let slot = |kind: &str, no: u32, rotate: bool| BatchSlot {
            key: SlotKey::new(kind, day, no),
            entry_id: format!("{kind}-{no}"),
            caller: "test".into(),
            exempt: false,
            deadline_ms: 3_600_000,
            cap: 5,
            started_at: Utc::now(),
            record_only: true,
            rotate,
        };
        let slots = [
            slot("blog", 1, false),
            slot("blog", 2, false),
            slot("news", 1, true),
            slot("news", 2, true),
        ];
        let out = gate_fast(&db.pool, &slots, chrono::Duration::zero()).await;
        let mut got: Vec<(i32, i64)> = out.claims.iter().map(|c| (c.idx, c.post_id)).collect();
        got.sort_unstable();
        // blog's slots: its two oldest; news's: one of each category (both
        // never published: by name, arts then sport's oldest), not sport's
        // second.
        assert_eq!(got, [(0, ids[0]), (1, ids[1]), (2, ids[5]), (3, ids[3])]);
    }

    /// The two statements with the claim fence are planned for their own
    /// rows on every call, never kept prepared: the plan Postgres would
    /// cache after five runs joins a batch quadratically
    /// (`store::claim_still_held!`). Run past that point on one
    /// connection, neither is among its prepared statements, while the
    /// finish's other statement (the execution rows) is.
    #[tokio::test]
    async fn the_fenced_batch_statements_are_planned_for_their_rows_each_time() {
        let db = many_open_claims().await;
        let one = sqlx::postgres::PgPoolOptions::new()
            .max_connections(1)
            .connect(&db.url)
            .await
            .unwrap();
        let now = Utc::now();
        for run in 0..7i64 {
            let ids: Vec<i64> = (1 + run * 64..1 + (run + 1) * 64).collect();
            let claims: Vec<(i64, i32)> = ids.iter().map(|i| (*i, 1)).collect();
            let held = crate::store::extend_claims(
                &one,
                &claims,
                "w",
                now,
                std::time::Duration::from_secs(30),
            )
            .await
            .unwrap();
            assert_eq!(held.len(), ids.len());
            let rows: Vec<BatchFinish> = ids
                .iter()
                .map(|&id| BatchFinish {
                    id,
                    attempt: 1,
                    post_id: id,
                    outcome: Outcome::Published,
                    response: None,
                    url: Some(format!("https://cms.test/{id}")),
                    record: ExecutionRecord::new(
                        format!("k:2030-01-15:{id}"),
                        None,
                        Outcome::Published,
                        now,
                        now,
                    )
                    .entry(format!("e-{id}").as_str())
                    .by("test", "w"),
                    heartbeat_saw_loss: false,
                })
                .collect();
            let finished = finish_batch(&one, &rows, "w", now).await.unwrap();
            assert!(
                finished.iter().all(|f| *f == Finished::Recorded),
                "{finished:?}"
            );
        }
        let prepared: Vec<String> =
            sqlx::query_scalar("SELECT statement FROM pg_prepared_statements")
                .fetch_all(&one)
                .await
                .unwrap();
        assert!(
            prepared.iter().any(|s| s.contains("INSERT INTO execution")),
            "the connection keeps the other statements: {prepared:#?}"
        );
        let fenced: Vec<&String> = prepared
            .iter()
            .filter(|s| s.contains("UPDATE publish_slot s"))
            .collect();
        assert!(fenced.is_empty(), "kept prepared: {fenced:#?}");
    }

    /// A finish's rare rows, each told apart: a `skipped` row whose fence
    /// held gives its unit of the day's cap back (a published one keeps
    /// it); a row whose fence fails is `Earlier` when this worker settled
    /// it at that attempt (a retry of a finish whose answer was lost), and
    /// `Lost` when another worker holds it.
    #[tokio::test]
    async fn a_finish_gives_a_skipped_slots_unit_back_and_tells_an_earlier_commit_from_a_lost_claim(
    ) {
        let db = many_open_claims().await;
        let pool = &db.pool;
        sqlx::query(
            "INSERT INTO daily_quota (kind, day, used) VALUES ('k', DATE '2030-01-15', 10)",
        )
        .execute(pool)
        .await
        .unwrap();
        let now = Utc::now();
        let row = |id: i64, outcome: Outcome| BatchFinish {
            id,
            attempt: 1,
            post_id: id,
            outcome,
            response: None,
            url: None,
            record: ExecutionRecord::new(format!("k:2030-01-15:{id}"), None, outcome, now, now)
                .entry(format!("e-{id}").as_str())
                .by("test", "w"),
            heartbeat_saw_loss: false,
        };
        let withdrawn = Outcome::Skipped(SkipReason::DraftWithdrawn);
        let first = [row(1, Outcome::Published), row(2, withdrawn)];
        let got = finish_batch(pool, &first, "w", now).await.unwrap();
        assert_eq!(got, [Finished::Recorded, Finished::Recorded]);
        let used: i32 = sqlx::query_scalar("SELECT used FROM daily_quota WHERE kind = 'k'")
            .fetch_one(pool)
            .await
            .unwrap();
        assert_eq!(used, 9, "the skipped slot's unit, and only it, given back");
        sqlx::query("UPDATE publish_slot SET claimed_by = 'other' WHERE id = 3")
            .execute(pool)
            .await
            .unwrap();
        let again = [
            row(1, Outcome::Published),
            row(3, Outcome::Published),
            row(4, withdrawn),
        ];
        let got = finish_batch(pool, &again, "w", now).await.unwrap();
        assert_eq!(got, [Finished::Earlier, Finished::Lost, Finished::Recorded]);
        let used: i32 = sqlx::query_scalar("SELECT used FROM daily_quota WHERE kind = 'k'")
            .fetch_one(pool)
            .await
            .unwrap();
        assert_eq!(used, 8, "row 4's unit; none again for row 2");
    }

    /// `finish_batch` reaches its gate rows by primary key, also while the
    /// worker holds thousands of open claims in a table not yet analyzed:
    /// through `publish_slot_open` it walked every one of them per row.
    /// So does the lookup of rows whose fence failed (`SETTLED_EARLIER`).
    #[tokio::test]
    async fn the_finish_finds_its_gate_rows_by_key_among_many_open_claims() {
        let db = many_open_claims().await;
        let ids: Vec<i64> = (1000..1032).collect();
        let n = ids.len();
        let plan: Vec<String> = sqlx::query_scalar(&format!("EXPLAIN {FINISH_SLOTS}"))
            .bind(&ids)
            .bind(vec![1i32; n])
            .bind(&ids)
            .bind(vec!["published"; n])
            .bind(vec![None::<String>; n])
            .bind(vec![None::<Value>; n])
            .bind(vec![Some("https://cms.test/x"); n])
            .bind("w")
            .bind(Utc::now())
            .fetch_all(&db.pool)
            .await
            .unwrap();
        let plan = testkit::query_plan::text(&plan);
        let update = plan
            .split("Update on draft")
            .next()
            .expect("the gate rows' update comes first");
        assert!(update.contains("publish_slot_pkey"), "{plan}");
        assert!(!update.contains("publish_slot_open"), "{plan}");
        testkit::query_plan::assert_reads_by_index(&plan, "publish_slot", "publish_slot_pkey", &[]);
        let earlier: Vec<String> = sqlx::query_scalar(&format!("EXPLAIN {SETTLED_EARLIER}"))
            .bind(&ids)
            .bind(vec![1i32; n])
            .bind("w")
            .fetch_all(&db.pool)
            .await
            .unwrap();
        let earlier = testkit::query_plan::text(&earlier);
        testkit::query_plan::assert_reads_by_index(
            &earlier,
            "publish_slot",
            "publish_slot_pkey",
            &["publish_slot_open"],
        );
    }
}
