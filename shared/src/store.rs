//! Postgres: the source of truth. One function per statement, so every
//! round trip on the hot path is visible here and nowhere else.
//!
//! Functions that must run inside a caller's transaction take
//! `&mut PgConnection` (pass `&mut *tx`); the rest take the pool.
//!
//! Two clocks: what is only *recorded* (created_at, started_at, …) comes from
//! the caller's injected clock; what is *judged* — whether a claim has
//! lapsed, whether a slot missed its starting deadline, whether a draft is
//! ready — uses Postgres's own clock (`clock_timestamp()`), the one clock all
//! workers share. A worker whose clock runs ahead can then never treat
//! another's live claim as lapsed.

use crate::session::Session;
use crate::slot::{PlannedSlot, SlotKey};
use chrono::{DateTime, NaiveDate, Utc};
use serde_json::Value;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::{PgConnection, Row};
use std::collections::{HashMap, HashSet};
use std::str::FromStr;
use std::time::Duration;

pub type StoreError = sqlx::Error;

/// The connection options and pool of every slotgate pool. Connections are
/// not pinged before use (that would double the round trips of every
/// delivery); a dead connection surfaces as an error and the worker retries
/// the delivery with backoff. Every session gets `session`'s timeouts and
/// keepalives in its startup message; `--pg-pool-size` replaces
/// `max_connections`.
///
/// TLS comes from the URL, which sqlx parses: `sslmode=verify-full` (verify
/// the chain and the host name), `verify-ca`, `require` (encrypt, verify
/// nothing), and `sslrootcert=PATH` for the CA to trust. Without `sslmode`
/// sqlx uses `prefer`, which falls back to plaintext when the server offers
/// no TLS: production URLs should say `verify-full` (README, "TLS").
fn pool_of(
    url: &str,
    max_connections: u32,
    session: &Session,
) -> Result<(PgPoolOptions, PgConnectOptions), StoreError> {
    let opts = PgConnectOptions::from_str(&known_parameters(url))?
        .application_name("slotgate")
        .options(session.startup_options());
    let pool = PgPoolOptions::new()
        .max_connections(session.pool_size.unwrap_or(max_connections))
        .acquire_timeout(session.acquire_timeout)
        .test_before_acquire(false);
    Ok((pool, opts))
}

/// The connect parameters sqlx understands; sqlx logs any other one *with
/// its value* ("ignoring unrecognized connect parameter"), which would put a
/// libpq-only secret such as `sslpassword` into the log.
const PG_PARAMETERS: &[&str] = &[
    "sslmode",
    "ssl-mode",
    "sslrootcert",
    "ssl-root-cert",
    "ssl-ca",
    "sslcert",
    "ssl-cert",
    "sslkey",
    "ssl-key",
    "statement-cache-capacity",
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "password",
    "application_name",
    "options",
];

/// `url` without the query parameters sqlx would ignore; each one dropped
/// is logged by name only.
fn known_parameters(url: &str) -> String {
    let Ok(mut parsed) = reqwest::Url::parse(url) else {
        return url.to_owned();
    };
    if parsed.query().is_none() {
        return url.to_owned();
    }
    let pairs: Vec<(String, String)> = parsed
        .query_pairs()
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    let (kept, dropped): (Vec<_>, Vec<_>) = pairs
        .into_iter()
        .partition(|(k, _)| PG_PARAMETERS.contains(&k.as_str()));
    if dropped.is_empty() {
        return url.to_owned();
    }
    for (k, _) in &dropped {
        tracing::warn!(parameter = %k, "ignoring a DATABASE_URL parameter slotgate's Postgres client does not support");
    }
    if kept.is_empty() {
        parsed.set_query(None);
    } else {
        parsed.query_pairs_mut().clear().extend_pairs(kept);
    }
    parsed.into()
}

/// Opens a pool (see [`pool_of`]).
pub async fn connect(
    url: &str,
    max_connections: u32,
    session: &Session,
) -> Result<PgPool, StoreError> {
    let (pool, opts) = pool_of(url, max_connections, session)?;
    pool.connect_with(opts).await
}

/// A pool that connects on first use: a worker started while Postgres is
/// down keeps retrying with backoff instead of crash-looping.
pub fn connect_lazy(
    url: &str,
    max_connections: u32,
    session: &Session,
) -> Result<PgPool, StoreError> {
    let (pool, opts) = pool_of(url, max_connections, session)?;
    Ok(pool.connect_lazy_with(opts))
}

/// Postgres's clock, now (`clock_timestamp()`, not the transaction's start).
pub async fn db_now(pool: &PgPool) -> Result<DateTime<Utc>, StoreError> {
    sqlx::query_scalar("SELECT clock_timestamp()")
        .fetch_one(pool)
        .await
}

/// The gate row of a slot.
#[derive(Debug, Clone, PartialEq)]
pub struct SlotRow {
    pub id: i64,
    pub kind: String,
    pub day: NaiveDate,
    pub slot: i32,
    pub state: String,
    pub post_id: Option<i64>,
    pub claimed_by: String,
    pub attempt: i32,
    pub claim_expires_at: Option<DateTime<Utc>>,
    pub reason: Option<String>,
}

impl SlotRow {
    pub fn key(&self) -> SlotKey {
        SlotKey::new(self.kind.clone(), self.day, self.slot as u32)
    }
    /// `claimed`/`publishing`: the publish outcome is not known yet.
    pub fn is_open(&self) -> bool {
        self.state == "claimed" || self.state == "publishing"
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

/// A draft.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Draft {
    pub id: i64,
    pub kind: String,
    pub title: String,
    pub body: String,
    pub status: String,
    pub ready_at: DateTime<Utc>,
    pub created_at: DateTime<Utc>,
    pub published_at: Option<DateTime<Utc>>,
    pub url: Option<String>,
    pub slot_key: Option<String>,
}

const DRAFT_COLS: &str =
    "id, kind, title, body, status, ready_at, created_at, published_at, url, slot_key";

fn draft_row(r: &sqlx::postgres::PgRow) -> Result<Draft, StoreError> {
    Ok(Draft {
        id: r.try_get("id")?,
        kind: r.try_get("kind")?,
        title: r.try_get("title")?,
        body: r.try_get("body")?,
        status: r.try_get("status")?,
        ready_at: r.try_get("ready_at")?,
        created_at: r.try_get("created_at")?,
        published_at: r.try_get("published_at")?,
        url: r.try_get("url")?,
        slot_key: r.try_get("slot_key")?,
    })
}

/// One row of `execution`.
#[derive(Debug, Clone, PartialEq)]
pub struct ExecutionRecord {
    /// As received (truncated to 200 characters).
    pub slot_key: String,
    pub key: Option<SlotKey>,
    pub entry_id: Option<String>,
    pub caller: String,
    pub worker_id: String,
    pub leader_epoch: Option<i64>,
    pub outcome: &'static str,
    pub reason: Option<&'static str>,
    pub detail: Value,
    pub due_at: Option<DateTime<Utc>>,
    pub started_at: DateTime<Utc>,
    pub finished_at: DateTime<Utc>,
}

/// A `(kind, day, slot)` row as a key.
fn key_row(r: &sqlx::postgres::PgRow) -> Result<SlotKey, StoreError> {
    Ok(SlotKey::new(
        r.try_get::<String, _>(0)?,
        r.try_get(1)?,
        r.try_get::<i32, _>(2)? as u32,
    ))
}

/// Keys as the three arrays an `UNNEST($1::text[], $2::date[], $3::int[])` takes.
fn key_columns(keys: &[SlotKey]) -> (Vec<&str>, Vec<NaiveDate>, Vec<i32>) {
    (
        keys.iter().map(|k| k.kind.as_str()).collect(),
        keys.iter().map(|k| k.day).collect(),
        keys.iter().map(|k| k.slot_no as i32).collect(),
    )
}

// ---------------------------------------------------------------- planning

/// Inserts planned slots; returns the keys that were new. Existing rows are
/// untouched, so due times never move and concurrent planners create each
/// slot once.
pub async fn insert_planned(
    conn: &mut PgConnection,
    slots: &[PlannedSlot],
    source: &str,
) -> Result<Vec<SlotKey>, StoreError> {
    if slots.is_empty() {
        return Ok(Vec::new());
    }
    let kinds: Vec<&str> = slots.iter().map(|s| s.key.kind.as_str()).collect();
    let days: Vec<NaiveDate> = slots.iter().map(|s| s.key.day).collect();
    let nos: Vec<i32> = slots.iter().map(|s| s.key.slot_no as i32).collect();
    let nominal: Vec<DateTime<Utc>> = slots.iter().map(|s| s.nominal_at).collect();
    let due: Vec<DateTime<Utc>> = slots.iter().map(|s| s.due_at).collect();
    let jitter: Vec<i64> = slots.iter().map(|s| s.jitter_ms).collect();
    let rows = sqlx::query(
        "INSERT INTO planned_slot (kind, day, slot, nominal_at, due_at, jitter_ms, source)
         SELECT k, d, s, n, du, j, $7
           FROM UNNEST($1::text[], $2::date[], $3::int[], $4::timestamptz[], $5::timestamptz[], $6::bigint[])
                AS t(k, d, s, n, du, j)
         ON CONFLICT (kind, day, slot) DO NOTHING
         RETURNING kind, day, slot",
    )
    .bind(&kinds)
    .bind(&days)
    .bind(&nos)
    .bind(&nominal)
    .bind(&due)
    .bind(&jitter)
    .bind(source)
    .fetch_all(conn)
    .await?;
    rows.iter().map(key_row).collect()
}

fn planned_row(r: &sqlx::postgres::PgRow) -> Result<PlannedSlot, StoreError> {
    Ok(PlannedSlot {
        key: SlotKey::new(
            r.try_get::<String, _>("kind")?,
            r.try_get("day")?,
            r.try_get::<i32, _>("slot")? as u32,
        ),
        nominal_at: r.try_get("nominal_at")?,
        due_at: r.try_get("due_at")?,
        jitter_ms: r.try_get("jitter_ms")?,
    })
}

/// The stored plan of one slot, with Postgres's clock at the time of reading:
/// the delivery's starting deadline is judged against the latter.
pub async fn get_planned_at(
    conn: &mut PgConnection,
    key: &SlotKey,
) -> Result<Option<(PlannedSlot, DateTime<Utc>)>, StoreError> {
    sqlx::query("SELECT kind, day, slot, nominal_at, due_at, jitter_ms, clock_timestamp() AS db_now FROM planned_slot WHERE kind = $1 AND day = $2 AND slot = $3")
        .bind(&key.kind)
        .bind(key.day)
        .bind(key.slot_no as i32)
        .fetch_optional(conn)
        .await?
        .as_ref()
        .map(|r| Ok((planned_row(r)?, r.try_get("db_now")?)))
        .transpose()
}

/// The stored plan of several slots, keyed like the input.
pub async fn get_planned_many(
    pool: &PgPool,
    keys: &[SlotKey],
) -> Result<Vec<PlannedSlot>, StoreError> {
    let (kinds, days, nos) = key_columns(keys);
    let rows = sqlx::query(
        "SELECT p.kind, p.day, p.slot, p.nominal_at, p.due_at, p.jitter_ms
           FROM planned_slot p
           JOIN UNNEST($1::text[], $2::date[], $3::int[]) AS t(k, d, s) ON p.kind = t.k AND p.day = t.d AND p.slot = t.s
          ORDER BY p.kind, p.day, p.slot",
    )
    .bind(&kinds)
    .bind(&days)
    .bind(&nos)
    .fetch_all(pool)
    .await?;
    rows.iter().map(planned_row).collect()
}

/// Planned slots that have no gate row yet and are due in their kind's
/// window `(since, now]`, oldest first. `windows` is (kind, since) per
/// kind: only those ranges are read (index `planned_slot_kind_due`), so the
/// cost is the slots due in the windows, not all history.
pub async fn unstarted_due(
    pool: &PgPool,
    windows: &[(String, DateTime<Utc>)],
    now: DateTime<Utc>,
    limit: i64,
) -> Result<Vec<PlannedSlot>, StoreError> {
    let (kinds, since): (Vec<&str>, Vec<DateTime<Utc>>) =
        windows.iter().map(|(k, t)| (k.as_str(), *t)).unzip();
    let rows = sqlx::query(
        "SELECT p.kind, p.day, p.slot, p.nominal_at, p.due_at, p.jitter_ms
           FROM UNNEST($1::text[], $2::timestamptz[]) AS w(kind, since)
           CROSS JOIN LATERAL (
                SELECT q.* FROM planned_slot q
                 WHERE q.kind = w.kind AND q.due_at > w.since AND q.due_at <= $3
                   AND NOT EXISTS (SELECT 1 FROM publish_slot s WHERE s.day = q.day AND s.slot = q.slot AND s.kind = q.kind)
                 ORDER BY q.due_at
                 LIMIT $4) p
          ORDER BY p.due_at
          LIMIT $4",
    )
    .bind(&kinds)
    .bind(&since)
    .bind(now)
    .bind(limit)
    .fetch_all(pool)
    .await?;
    rows.iter().map(planned_row).collect()
}

/// Of `keys`, those that still have no gate row.
pub async fn without_gate(pool: &PgPool, keys: &[SlotKey]) -> Result<Vec<SlotKey>, StoreError> {
    if keys.is_empty() {
        return Ok(Vec::new());
    }
    let (kinds, days, nos) = key_columns(keys);
    let rows = sqlx::query(
        "SELECT t.k, t.d, t.s FROM UNNEST($1::text[], $2::date[], $3::int[]) AS t(k, d, s)
          WHERE NOT EXISTS (SELECT 1 FROM publish_slot x WHERE x.day = t.d AND x.slot = t.s AND x.kind = t.k)",
    )
    .bind(&kinds)
    .bind(&days)
    .bind(&nos)
    .fetch_all(pool)
    .await?;
    rows.iter().map(key_row).collect()
}

// ---------------------------------------------------------------- the gate

/// The gate: inserts the slot's row unless one exists. `Some(id)` only for
/// the one delivery that got in; at READ COMMITTED a concurrent duplicate
/// waits for the winner's commit and then gets `None`.
///
/// A claim (`claim_expires_at` given) lasts `claim_expires_at - now`,
/// counted on Postgres's clock from the moment the row is written.
#[allow(clippy::too_many_arguments)]
pub async fn gate_insert(
    conn: &mut PgConnection,
    key: &SlotKey,
    state: &str,
    reason: Option<&str>,
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
    .bind(state)
    .bind(reason)
    .bind(worker)
    .bind(claim_expires_at)
    .bind(now)
    .fetch_optional(conn)
    .await
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
    state: &str,
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
    .bind(state)
    .bind(response)
    .bind(now)
    .execute(conn)
    .await
    .map(|_| ())
}

/// Extends a claim while a long call runs, to `visibility` from now on
/// Postgres's clock. Fenced: `false` when another worker has taken the slot
/// over.
pub async fn extend_claim(
    pool: &PgPool,
    id: i64,
    worker: &str,
    attempt: i32,
    now: DateTime<Utc>,
    visibility: Duration,
) -> Result<bool, StoreError> {
    let r = sqlx::query(
        "UPDATE publish_slot SET claim_expires_at = clock_timestamp() + $4 * interval '1 millisecond', updated_at = $5
          WHERE id = $1 AND claimed_by = $2 AND attempt = $3 AND state IN ('claimed', 'publishing')",
    )
    .bind(id)
    .bind(worker)
    .bind(attempt)
    .bind(millis(visibility))
    .bind(now)
    .execute(pool)
    .await?;
    Ok(r.rows_affected() == 1)
}

/// Records the publish outcome of a claimed slot. Fenced on
/// `(claimed_by, attempt)`: `false` (and nothing changed) when the claim was
/// lost to a takeover.
#[allow(clippy::too_many_arguments)]
pub async fn finish_slot(
    conn: &mut PgConnection,
    id: i64,
    worker: &str,
    attempt: i32,
    state: &str,
    reason: Option<&str>,
    response: Option<&Value>,
    now: DateTime<Utc>,
) -> Result<bool, StoreError> {
    let r = sqlx::query(
        "UPDATE publish_slot SET state = $4, reason = $5, response = $6, claim_expires_at = NULL, updated_at = $7
          WHERE id = $1 AND claimed_by = $2 AND attempt = $3 AND state IN ('claimed', 'publishing')",
    )
    .bind(id)
    .bind(worker)
    .bind(attempt)
    .bind(state)
    .bind(reason)
    .bind(response)
    .bind(now)
    .execute(conn)
    .await?;
    Ok(r.rows_affected() == 1)
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
    sqlx::query(&format!(
        "UPDATE publish_slot
            SET state = 'publishing', reason = NULL, claimed_by = 'manual',
                claim_expires_at = $4, updated_at = $4
          WHERE day = $1 AND slot = $2 AND kind = $3 AND state = 'failed' AND post_id IS NOT NULL
            AND reason IS DISTINCT FROM 'abandoned'
          RETURNING {SLOT_COLS}"
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

/// Operator abandon of a failed slot: it stays `failed`, reason `abandoned`.
/// Only once: a second abandon would release a second unit of the cap.
pub async fn abandon_failed(
    conn: &mut PgConnection,
    key: &SlotKey,
    now: DateTime<Utc>,
) -> Result<Option<SlotRow>, StoreError> {
    sqlx::query(&format!(
        "UPDATE publish_slot SET reason = 'abandoned', updated_at = $4
          WHERE day = $1 AND slot = $2 AND kind = $3 AND state = 'failed'
            AND reason IS DISTINCT FROM 'abandoned'
          RETURNING {SLOT_COLS}"
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

// ---------------------------------------------------------------- quota

/// Units of the cap in use (no lock: only to name a skip's reason).
pub async fn quota_used(
    conn: &mut PgConnection,
    kind: &str,
    day: NaiveDate,
) -> Result<i64, StoreError> {
    let used: Option<i32> =
        sqlx::query_scalar("SELECT used FROM daily_quota WHERE kind = $1 AND day = $2")
            .bind(kind)
            .bind(day)
            .fetch_optional(conn)
            .await?;
    Ok(used.map_or(0, i64::from))
}

/// Returns one unit (no draft was published under it).
pub async fn release_quota(
    conn: &mut PgConnection,
    kind: &str,
    day: NaiveDate,
) -> Result<(), StoreError> {
    sqlx::query("UPDATE daily_quota SET used = used - 1 WHERE kind = $1 AND day = $2 AND used > 0")
        .bind(kind)
        .bind(day)
        .execute(conn)
        .await
        .map(|_| ())
}

// ---------------------------------------------------------------- drafts

/// Picks the oldest ready draft of a kind (ready by Postgres's clock) and
/// binds it to a slot, in one statement: the pick is `FOR UPDATE SKIP
/// LOCKED`, so concurrent slots take different drafts. From here on the draft belongs to that slot's key. In
/// record-only mode (`record_only`) it is published on the spot with a
/// synthesized URL. Returns `(id, url)`.
pub async fn claim_draft(
    conn: &mut PgConnection,
    kind: &str,
    now: DateTime<Utc>,
    slot_key: &str,
    record_only: bool,
) -> Result<Option<(i64, Option<String>)>, StoreError> {
    sqlx::query_as(
        "UPDATE draft
            SET slot_key = $3,
                status = CASE WHEN $4 THEN 'published' ELSE 'publishing' END,
                url = CASE WHEN $4 THEN 'record-only://' || kind || '/' || id END,
                published_at = CASE WHEN $4 THEN $2 END
          WHERE id = (SELECT id FROM draft WHERE kind = $1 AND status = 'ready' AND ready_at <= statement_timestamp()
                       ORDER BY ready_at, id LIMIT 1 FOR UPDATE SKIP LOCKED)
          RETURNING id, url",
    )
    .bind(kind)
    .bind(now)
    .bind(slot_key)
    .bind(record_only)
    .fetch_optional(conn)
    .await
}

/// Rebinds a draft to its slot (operator retry): status back to `publishing`.
pub async fn rebind_draft(
    conn: &mut PgConnection,
    id: i64,
    slot_key: &str,
) -> Result<(), StoreError> {
    sqlx::query("UPDATE draft SET status = 'publishing', slot_key = $2 WHERE id = $1")
        .bind(id)
        .bind(slot_key)
        .execute(conn)
        .await
        .map(|_| ())
}

/// Sets a draft's final status after its slot's publish.
pub async fn finish_draft(
    conn: &mut PgConnection,
    id: i64,
    status: &str,
    url: Option<&str>,
    published_at: Option<DateTime<Utc>>,
) -> Result<(), StoreError> {
    sqlx::query("UPDATE draft SET status = $2, url = COALESCE($3, url), published_at = COALESCE($4, published_at) WHERE id = $1")
        .bind(id)
        .bind(status)
        .bind(url)
        .bind(published_at)
        .execute(conn)
        .await
        .map(|_| ())
}

/// Returns a draft to `ready`, unbound (operator's `abandon --requeue-draft`).
pub async fn requeue_draft(conn: &mut PgConnection, id: i64) -> Result<(), StoreError> {
    sqlx::query("UPDATE draft SET status = 'ready', slot_key = NULL WHERE id = $1")
        .bind(id)
        .execute(conn)
        .await
        .map(|_| ())
}

pub async fn get_draft(conn: &mut PgConnection, id: i64) -> Result<Option<Draft>, StoreError> {
    sqlx::query(&format!("SELECT {DRAFT_COLS} FROM draft WHERE id = $1"))
        .bind(id)
        .fetch_optional(conn)
        .await?
        .as_ref()
        .map(draft_row)
        .transpose()
}

pub async fn insert_draft(
    conn: &mut PgConnection,
    kind: &str,
    title: &str,
    body: &str,
    ready_at: DateTime<Utc>,
    now: DateTime<Utc>,
) -> Result<i64, StoreError> {
    sqlx::query_scalar("INSERT INTO draft (kind, title, body, status, ready_at, created_at) VALUES ($1, $2, $3, 'ready', $4, $5) RETURNING id")
        .bind(kind)
        .bind(title)
        .bind(body)
        .bind(ready_at)
        .bind(now)
        .fetch_one(conn)
        .await
}

pub async fn list_drafts(
    pool: &PgPool,
    kind: Option<&str>,
    status: Option<&str>,
) -> Result<Vec<Draft>, StoreError> {
    let rows = sqlx::query(&format!(
        "SELECT {DRAFT_COLS} FROM draft WHERE ($1::text IS NULL OR kind = $1) AND ($2::text IS NULL OR status = $2) ORDER BY id"
    ))
    .bind(kind)
    .bind(status)
    .fetch_all(pool)
    .await?;
    rows.iter().map(draft_row).collect()
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

/// Writes executions in one statement ([`EXECUTION_UPSERT`]); returns how
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
        .bind(es.iter().map(|e| e.outcome).collect::<Vec<_>>())
        .bind(es.iter().map(|e| e.reason).collect::<Vec<_>>())
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

/// Statement 4: the cap's units, one per slot, grouped by (kind, day) and
/// taken in that order ($1 kinds, $2 days, $3 caps). A group is taken only
/// whole; the rows returned are the groups that fit.
const QUOTA_TAKE: &str = "WITH want AS (
        SELECT kind, day, count(*)::int AS n, max(cap) AS cap
          FROM UNNEST($1::text[], $2::date[], $3::int[]) AS w(kind, day, cap)
         GROUP BY kind, day)
INSERT INTO daily_quota (kind, day, used)
SELECT kind, day, n FROM want WHERE n <= cap ORDER BY kind, day
ON CONFLICT (kind, day) DO UPDATE SET used = daily_quota.used + EXCLUDED.used
 WHERE daily_quota.used + EXCLUDED.used
       <= (SELECT w.cap FROM want w WHERE w.kind = EXCLUDED.kind AND w.day = EXCLUDED.day)";

/// One unit of a kind's daily cap, for [`take_quotas`].
#[derive(Debug, Clone)]
pub struct QuotaUnit {
    pub kind: String,
    pub day: NaiveDate,
    pub cap: u32,
}

/// Takes one unit of the cap per element of `units`, in one conditional
/// upsert per statement ([`QUOTA_TAKE`]): concurrent slots of a kind and
/// day serialize on its quota row, so the cap cannot be raced past.
/// `false` = some (kind, day) cannot cover its units; the caller rolls
/// back, since the groups that fit were taken.
pub async fn take_quotas(conn: &mut PgConnection, units: &[QuotaUnit]) -> Result<bool, StoreError> {
    if units.is_empty() {
        return Ok(true);
    }
    let groups: HashSet<(&str, NaiveDate)> =
        units.iter().map(|u| (u.kind.as_str(), u.day)).collect();
    let taken = sqlx::query(QUOTA_TAKE)
        .bind(units.iter().map(|u| u.kind.as_str()).collect::<Vec<_>>())
        .bind(units.iter().map(|u| u.day).collect::<Vec<_>>())
        .bind(
            units
                .iter()
                .map(|u| i32::try_from(u.cap).unwrap_or(i32::MAX))
                .collect::<Vec<_>>(),
        )
        .execute(conn)
        .await?;
    Ok(taken.rows_affected() == groups.len() as u64)
}

/// Takes one unit of the day's cap (a [`take_quotas`] of one). `false` =
/// the cap is used up.
pub async fn take_quota(
    conn: &mut PgConnection,
    kind: &str,
    day: NaiveDate,
    cap: u32,
) -> Result<bool, StoreError> {
    let unit = QuotaUnit {
        kind: kind.to_owned(),
        day,
        cap,
    };
    take_quotas(conn, std::slice::from_ref(&unit)).await
}

/// One delivery for [`gate_batch`]; the caller has validated it.
#[derive(Debug, Clone)]
pub struct BatchSlot {
    pub key: SlotKey,
    pub entry_id: String,
    pub caller: String,
    /// Exempt from `starting_deadline` (manual, backfill; or a single
    /// delivery whose caller judged the deadline already).
    pub exempt: bool,
    pub deadline_ms: i64,
    pub cap: u32,
    pub started_at: DateTime<Utc>,
    /// The kind has no publish URL: settle in the batch.
    pub record_only: bool,
}

/// A slot [`gate_batch`] settled (record-only) or claimed (webhook): the
/// index into its input, the gate row, the draft and the plan's times.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchClaim {
    pub idx: i32,
    pub gate_id: i64,
    pub post_id: i64,
    pub title: String,
    pub body: String,
    pub nominal_at: DateTime<Utc>,
    pub due_at: DateTime<Utc>,
    /// Published and recorded already (record-only).
    pub settled: bool,
}

/// What [`gate_batch`] decided. An index in neither list was left
/// untouched: its slot has a gate row already, or is not planned, or is
/// late.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BatchGate {
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
            records.push(ExecutionRecord {
                slot_key: b.key.to_string(),
                key: Some(b.key.clone()),
                entry_id: Some(b.entry_id.clone()),
                caller: b.caller.clone(),
                worker_id: worker.to_owned(),
                leader_epoch: epoch,
                outcome: "published",
                reason: None,
                detail: serde_json::json!({ "url": url }),
                due_at: Some(g.due_at),
                started_at: b.started_at,
                finished_at: now + chrono::Duration::from_std(t0.elapsed()).unwrap_or_default(),
            });
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
    pub attempt: i32,
    pub post_id: i64,
    /// `published` or `failed`.
    pub state: &'static str,
    pub reason: Option<&'static str>,
    pub response: Option<Value>,
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
/// ([`FINISH_SLOTS`], then [`EXECUTION_UPSERT`]), each fenced on its claim;
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
        .bind(rows.iter().map(|r| r.state).collect::<Vec<_>>())
        .bind(rows.iter().map(|r| r.reason).collect::<Vec<_>>())
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

// ---------------------------------------------------------------- clocks

/// A duration as whole milliseconds, for `$n * interval '1 millisecond'`.
fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// One worker's last clock measurement against Postgres.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerClock {
    pub worker_id: String,
    /// The worker's clock minus Postgres's.
    pub skew_ms: i64,
    pub rtt_ms: i64,
    /// How long ago (Postgres's clock) it was measured.
    pub age_ms: i64,
}

/// Stores a worker's measured clock offset.
pub async fn record_worker_clock(
    pool: &PgPool,
    worker: &str,
    skew_ms: i64,
    rtt_ms: i64,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO worker_clock (worker_id, skew_ms, rtt_ms, measured_at) VALUES ($1, $2, $3, clock_timestamp())
         ON CONFLICT (worker_id) DO UPDATE SET skew_ms = $2, rtt_ms = $3, measured_at = clock_timestamp()",
    )
    .bind(worker)
    .bind(skew_ms)
    .bind(rtt_ms)
    .execute(pool)
    .await
    .map(|_| ())
}

/// Forgets a worker's clock (it stopped).
pub async fn forget_worker_clock(pool: &PgPool, worker: &str) -> Result<(), StoreError> {
    sqlx::query("DELETE FROM worker_clock WHERE worker_id = $1")
        .bind(worker)
        .execute(pool)
        .await
        .map(|_| ())
}

/// Clocks measured within `within` (older rows belong to workers that died).
pub async fn worker_clocks(
    pool: &PgPool,
    within: Duration,
) -> Result<Vec<WorkerClock>, StoreError> {
    let rows: Vec<(String, i64, i64, i64)> = sqlx::query_as(
        "SELECT worker_id, skew_ms, rtt_ms,
                (extract(epoch FROM clock_timestamp() - measured_at) * 1000)::bigint
           FROM worker_clock
          WHERE measured_at > clock_timestamp() - $1 * interval '1 millisecond'
          ORDER BY worker_id",
    )
    .bind(millis(within))
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(worker_id, skew_ms, rtt_ms, age_ms)| WorkerClock {
            worker_id,
            skew_ms,
            rtt_ms,
            age_ms,
        })
        .collect())
}

// ---------------------------------------------------------------- leader

/// Takes the next fencing epoch. Gaps are fine; repeats never happen.
pub async fn next_epoch(pool: &PgPool) -> Result<i64, StoreError> {
    sqlx::query_scalar("UPDATE leader_epoch SET epoch = epoch + 1 WHERE id RETURNING epoch")
        .fetch_one(pool)
        .await
}

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
    pub slot: String,
    pub kind: String,
    pub slot_no: i32,
    pub nominal_at: DateTime<Utc>,
    pub due_at: DateTime<Utc>,
    pub state: String,
    pub reason: Option<String>,
    pub draft_id: Option<i64>,
    pub url: Option<String>,
    pub started_at: Option<DateTime<Utc>>,
    pub lag_ms: Option<i64>,
    pub deliveries: i64,
    pub duplicates_blocked: i64,
}

/// The report rows of `(kind, day)` pairs, ordered by due time.
pub async fn report_rows(
    pool: &PgPool,
    kinds: &[String],
    days: &[NaiveDate],
) -> Result<Vec<ReportRow>, StoreError> {
    let rows = sqlx::query(
        "SELECT p.kind, p.day, p.slot, p.nominal_at, p.due_at,
                COALESCE(s.state, 'planned') AS state, s.reason, s.post_id, d.url,
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
) -> Result<Vec<(String, Option<String>, i64)>, StoreError> {
    let rows = sqlx::query(
        "SELECT x.outcome, x.reason, count(*)
           FROM execution x
           JOIN UNNEST($1::text[], $2::date[]) AS q(k, d) ON x.kind = q.k AND x.day = q.d
          GROUP BY 1, 2 ORDER BY 1, 2",
    )
    .bind(kinds)
    .bind(days)
    .fetch_all(pool)
    .await?;
    rows.iter()
        .map(|r| Ok((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?)))
        .collect()
}

/// The outcome and reason recorded for one stream entry, if it was handled
/// (`planner trigger --wait` follows its own delivery by entry id).
pub async fn entry_outcome(
    pool: &PgPool,
    entry_id: &str,
) -> Result<Option<(String, Option<String>)>, StoreError> {
    let row = sqlx::query("SELECT outcome, reason FROM execution WHERE entry_id = $1")
        .bind(entry_id)
        .fetch_optional(pool)
        .await?;
    row.map(|r| Ok((r.try_get(0)?, r.try_get(1)?))).transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_parameters_are_dropped_before_sqlx_could_log_their_values() {
        assert_eq!(
            known_parameters(
                "postgres://u@h/d?sslmode=verify-full&sslpassword=x&sslrootcert=/ca.pem"
            ),
            "postgres://u@h/d?sslmode=verify-full&sslrootcert=%2Fca.pem"
        );
        assert_eq!(
            known_parameters("postgres://u@h/d?sslpassword=x"),
            "postgres://u@h/d"
        );
        assert_eq!(known_parameters("postgres://u@h/d"), "postgres://u@h/d");
    }
}
