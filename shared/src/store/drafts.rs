//! `draft`: the texts slots publish, bound to a slot's key once picked.
//! The gate's own pick is set-based and lives in `gate`.

use super::StoreError;
use chrono::{DateTime, Utc};
use sqlx::postgres::PgPool;
use sqlx::{PgConnection, Row};

/// A draft's `status` (the `draft` CHECK constraint). A draft follows its
/// slot: `ready` until a slot picks it, then `publishing`, then the slot's
/// final `published` or `failed`; `draft` is never picked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, sqlx::Type, serde::Serialize)]
#[sqlx(type_name = "text", rename_all = "snake_case")]
#[serde(rename_all = "snake_case")]
pub enum DraftStatus {
    /// Written but not released for publishing; never picked.
    Draft,
    /// Waiting for a slot; picked oldest first once `ready_at` has passed.
    Ready,
    /// Bound to a slot whose publish call is in flight.
    Publishing,
    /// Published by its slot (or recorded, for a record-only kind).
    Published,
    /// Its slot's publish failed; an operator retries or abandons the slot.
    Failed,
}

impl DraftStatus {
    /// The stored spelling, as the SQL text writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            DraftStatus::Draft => "draft",
            DraftStatus::Ready => "ready",
            DraftStatus::Publishing => "publishing",
            DraftStatus::Published => "published",
            DraftStatus::Failed => "failed",
        }
    }
}

/// The statuses in their stored spelling, for parsing and error messages.
const DRAFT_STATUSES: [DraftStatus; 5] = [
    DraftStatus::Draft,
    DraftStatus::Ready,
    DraftStatus::Publishing,
    DraftStatus::Published,
    DraftStatus::Failed,
];

/// A status as an operator types it (`planner drafts list --status`): an
/// unknown word is refused naming the allowed ones, rather than matching
/// no draft.
impl std::str::FromStr for DraftStatus {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        DRAFT_STATUSES
            .into_iter()
            .find(|d| d.as_str() == s)
            .ok_or_else(|| {
                let all: Vec<&str> = DRAFT_STATUSES.iter().map(|d| d.as_str()).collect();
                format!("{s:?} is not a draft status (one of: {})", all.join(", "))
            })
    }
}

/// Padded, so tables can align it with `{:<11}`.
impl std::fmt::Display for DraftStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

/// A draft.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Draft {
    /// The row id: what a slot's `post_id` points at.
    pub id: i64,
    /// Only slots of this kind pick it.
    pub kind: String,
    /// Sent to the publish webhook.
    pub title: String,
    /// Sent to the publish webhook.
    pub body: String,
    /// Where it is in its life: ready to pick, bound to a slot while
    /// publishing, then published or failed.
    pub status: DraftStatus,
    /// Not picked before this time (Postgres's clock), so drafts can be
    /// queued ahead.
    pub ready_at: DateTime<Utc>,
    /// Picked before drafts of a lower priority, whatever their age
    /// (default 0; negative goes last).
    pub priority: i32,
    /// Its section, for kinds with `rotate_by = "category"`.
    pub category: Option<String>,
    /// When it was inserted or imported.
    pub created_at: DateTime<Utc>,
    /// When the CMS accepted it.
    pub published_at: Option<DateTime<Utc>>,
    /// Where the CMS published it (a `record-only://` URL when no webhook
    /// is configured).
    pub url: Option<String>,
    /// The slot it is bound to; once set, only that slot publishes it.
    pub slot_key: Option<String>,
    /// The post's id at the CMS, for a draft mirrored from WordPress.
    pub cms_id: Option<i64>,
}

const DRAFT_COLS: &str =
    "id, kind, title, body, status, ready_at, priority, category, created_at, published_at, url, slot_key, cms_id";

fn draft_row(r: &sqlx::postgres::PgRow) -> Result<Draft, StoreError> {
    Ok(Draft {
        id: r.try_get("id")?,
        kind: r.try_get("kind")?,
        title: r.try_get("title")?,
        body: r.try_get("body")?,
        status: r.try_get("status")?,
        ready_at: r.try_get("ready_at")?,
        priority: r.try_get("priority")?,
        category: r.try_get("category")?,
        created_at: r.try_get("created_at")?,
        published_at: r.try_get("published_at")?,
        url: r.try_get("url")?,
        slot_key: r.try_get("slot_key")?,
        cms_id: r.try_get("cms_id")?,
    })
}

// ---------------------------------------------------------------- drafts

/// Picks the next ready draft of a kind (highest priority, then oldest) (ready by Postgres's clock) and
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
                       ORDER BY priority DESC, ready_at, id LIMIT 1 FOR UPDATE SKIP LOCKED)
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

/// Returns a draft to `ready`, unbound (operator's `abandon --requeue-draft`).
pub async fn requeue_draft(conn: &mut PgConnection, id: i64) -> Result<(), StoreError> {
    sqlx::query("UPDATE draft SET status = 'ready', slot_key = NULL WHERE id = $1")
        .bind(id)
        .execute(conn)
        .await
        .map(|_| ())
}

/// One draft by id, `None` when there is no such row.
pub async fn get_draft(conn: &mut PgConnection, id: i64) -> Result<Option<Draft>, StoreError> {
    sqlx::query(&format!("SELECT {DRAFT_COLS} FROM draft WHERE id = $1"))
        .bind(id)
        .fetch_optional(conn)
        .await?
        .as_ref()
        .map(draft_row)
        .transpose()
}

/// A draft to add: what `planner drafts add` and a JSON Lines line say.
#[derive(Debug, Clone)]
pub struct NewDraft<'a> {
    /// The kind it is published as.
    pub kind: &'a str,
    /// Sent to the CMS.
    pub title: &'a str,
    /// Sent to the CMS.
    pub body: &'a str,
    /// Not picked before this time.
    pub ready_at: DateTime<Utc>,
    /// Picked before drafts of a lower priority.
    pub priority: i32,
    /// Its section, for `rotate_by = "category"`.
    pub category: Option<&'a str>,
}

/// Adds a ready draft (`planner drafts add`; bulk imports use `COPY`);
/// returns its id.
pub async fn insert_draft(
    conn: &mut PgConnection,
    d: &NewDraft<'_>,
    now: DateTime<Utc>,
) -> Result<i64, StoreError> {
    sqlx::query_scalar("INSERT INTO draft (kind, title, body, status, ready_at, priority, category, created_at) VALUES ($1, $2, $3, 'ready', $4, $5, $6, $7) RETURNING id")
        .bind(d.kind)
        .bind(d.title)
        .bind(d.body)
        .bind(d.ready_at)
        .bind(d.priority)
        .bind(d.category)
        .bind(now)
        .fetch_one(conn)
        .await
}

/// Drafts filtered by kind and status (`None`: any), oldest first.
pub async fn list_drafts(
    pool: &PgPool,
    kind: Option<&str>,
    status: Option<DraftStatus>,
) -> Result<Vec<Draft>, StoreError> {
    let rows = sqlx::query(&format!(
        "SELECT {DRAFT_COLS} FROM draft WHERE ($1::text IS NULL OR kind = $1) AND ($2::text IS NULL OR status = $2) ORDER BY id"
    ))
    .bind(kind)
    .bind(status.map(DraftStatus::as_str))
    .fetch_all(pool)
    .await?;
    rows.iter().map(draft_row).collect()
}

/// The first `limit` ready drafts (of `kind`, or every kind) in the
/// pick's order: priority, then oldest ready, then id — what the console
/// lists as "next". (Rotation by category is the gate's, per kind; this
/// is the order within a category.)
pub async fn next_drafts(
    pool: &PgPool,
    kind: Option<&str>,
    limit: i64,
) -> Result<Vec<Draft>, StoreError> {
    let rows = sqlx::query(&format!(
        "SELECT {DRAFT_COLS} FROM draft WHERE status = 'ready' AND ($1::text IS NULL OR kind = $1)
          ORDER BY priority DESC, ready_at, id LIMIT $2"
    ))
    .bind(kind)
    .bind(limit)
    .fetch_all(pool)
    .await?;
    rows.iter().map(draft_row).collect()
}

/// What [`sync_cms_drafts`] changed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Synced {
    /// Posts seen for the first time: new ready drafts.
    pub added: u64,
    /// Known posts made ready again, or their title or date refreshed.
    pub updated: u64,
    /// Ready drafts whose post is no longer in the ready status (only when
    /// the listing was complete): now `draft`, never picked.
    pub unreadied: u64,
}

/// Mirrors a kind's ready CMS posts (`(cms id, title, ready at)`, the
/// post's `date_gmt`) into `draft`, in one transaction: each post is
/// upserted as a ready draft on `(kind, cms_id)`; one bound to a slot
/// (`publishing`), published or failed is left alone, so a post slotgate
/// published is never picked again. When `complete` (the listing held every
/// ready post), the kind's ready mirrored drafts missing from it become
/// `draft`.
pub async fn sync_cms_drafts(
    pool: &PgPool,
    kind: &str,
    posts: &[(i64, String, DateTime<Utc>)],
    complete: bool,
) -> Result<Synced, StoreError> {
    let mut tx = pool.begin().await?;
    let ids: Vec<i64> = posts.iter().map(|p| p.0).collect();
    let rows: Vec<(bool,)> = sqlx::query_as(
        "INSERT INTO draft (kind, title, body, status, ready_at, cms_id)
         SELECT $1, u.title, '', 'ready', u.ready_at, u.id
           FROM UNNEST($2::bigint[], $3::text[], $4::timestamptz[]) AS u(id, title, ready_at)
         ON CONFLICT (kind, cms_id) WHERE cms_id IS NOT NULL DO UPDATE
            SET title = EXCLUDED.title, ready_at = EXCLUDED.ready_at, status = 'ready'
          WHERE draft.status IN ('ready', 'draft')
            AND (draft.status, draft.title, draft.ready_at)
                IS DISTINCT FROM ('ready', EXCLUDED.title, EXCLUDED.ready_at)
         RETURNING (xmax = 0)",
    )
    .bind(kind)
    .bind(&ids)
    .bind(posts.iter().map(|p| p.1.clone()).collect::<Vec<_>>())
    .bind(posts.iter().map(|p| p.2).collect::<Vec<_>>())
    .fetch_all(&mut *tx)
    .await?;
    let added = rows.iter().filter(|r| r.0).count() as u64;
    let mut synced = Synced {
        added,
        updated: rows.len() as u64 - added,
        unreadied: 0,
    };
    if complete {
        synced.unreadied = sqlx::query(
            "UPDATE draft SET status = 'draft'
              WHERE kind = $1 AND cms_id IS NOT NULL AND status = 'ready' AND cms_id <> ALL ($2)",
        )
        .bind(kind)
        .bind(&ids)
        .execute(&mut *tx)
        .await?
        .rows_affected();
    }
    tx.commit().await?;
    Ok(synced)
}
