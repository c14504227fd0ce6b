//! The notice outbox (`notice`): events written with the outcome they
//! report, read and settled by the leader's sender (`crate::notice` says
//! what they are). A slot's `failed` and `missed_deadline` events are
//! written by a trigger on `publish_slot` (migration
//! `20261207000001_notice.sql`); this file writes the others.

use super::{insert_execution, ExecutionRecord, StoreError};
use crate::notice::{Event, Notice};
use crate::slot::SlotKey;
use chrono::{DateTime, NaiveDate, Utc};
use sqlx::{Connection, PgConnection, PgPool};
use std::time::Duration;

/// How a send ended, as the outbox keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sent {
    /// The receiver answered 2xx: never sent again.
    Delivered,
    /// `[notify] events` does not name it: never sent.
    Filtered,
    /// It failed; sent again after `after`, with `error` kept for people.
    Retry {
        /// Backoff before the next send.
        after: Duration,
        /// What went wrong (status or transport error, no secret).
        error: String,
    },
    /// It failed its last attempt; `error` kept, never sent again.
    GaveUp {
        /// What went wrong the last time.
        error: String,
    },
}

/// Writes a dead-lettered delivery's execution row and, in the same
/// transaction, its `slot.dead_lettered` event. `false` (and no event)
/// when the entry already has its row: a redelivery tells nobody twice.
pub async fn record_dead_letter(
    conn: &mut PgConnection,
    rec: &ExecutionRecord,
) -> Result<bool, StoreError> {
    let mut tx = conn.begin().await?;
    let fresh = insert_execution(&mut tx, rec).await?;
    if fresh {
        sqlx::query(
            "INSERT INTO notice (event, kind, day, slot, slot_key, outcome, reason)
             VALUES ($1, $2, $3, $4, $5, $6, $7)",
        )
        .bind(Event::DeadLettered.as_str())
        .bind(rec.key.as_ref().map(|k| k.kind.as_str()))
        .bind(rec.key.as_ref().map(|k| k.day))
        .bind(rec.key.as_ref().map(|k| k.slot_no as i32))
        .bind(&rec.slot_key)
        .bind(rec.outcome.as_str())
        .bind(rec.outcome.reason())
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;
    Ok(fresh)
}

/// Writes `kind`'s `runway.low` event for `runs_dry_on`, once: `false`
/// when that kind and day were told already.
pub async fn record_runway_low(
    pool: &PgPool,
    kind: &str,
    runs_dry_on: NaiveDate,
) -> Result<bool, StoreError> {
    let r = sqlx::query(
        "INSERT INTO notice (event, kind, runs_dry_on) VALUES ($1, $2, $3)
         ON CONFLICT (kind, runs_dry_on) WHERE event = 'runway.low' DO NOTHING",
    )
    .bind(Event::RunwayLow.as_str())
    .bind(kind)
    .bind(runs_dry_on)
    .execute(pool)
    .await?;
    Ok(r.rows_affected() == 1)
}

#[derive(sqlx::FromRow)]
struct NoticeRow {
    id: i64,
    msg_id: String,
    event: String,
    kind: Option<String>,
    day: Option<NaiveDate>,
    slot: Option<i32>,
    slot_key: Option<String>,
    outcome: Option<String>,
    reason: Option<String>,
    runs_dry_on: Option<NaiveDate>,
    created_at: DateTime<Utc>,
    attempts: i32,
    db_now: DateTime<Utc>,
}

/// Pending notices whose time has come, and Postgres's clock when they
/// were read (each send's `webhook-timestamp` is taken from it).
#[derive(Debug, Clone)]
pub struct DueNotices {
    /// Postgres's `clock_timestamp()` at the read; `None` when none is due.
    pub db_now: Option<DateTime<Utc>>,
    /// Oldest first.
    pub notices: Vec<Notice>,
}

/// Up to `limit` pending notices whose time has come (Postgres's clock),
/// oldest first. A row whose `event` this build does not know (a newer
/// release wrote it) is left pending for that release — by the query, not
/// after it, so such rows never fill the `limit` and hold back the rest.
pub async fn due_notices(pool: &PgPool, limit: i64) -> Result<DueNotices, StoreError> {
    let known: Vec<&str> = Event::ALL.iter().map(|e| e.as_str()).collect();
    let rows: Vec<NoticeRow> = sqlx::query_as(
        "SELECT id, msg_id, event, kind, day, slot, slot_key, outcome, reason, runs_dry_on,
                created_at, attempts, clock_timestamp() AS db_now
           FROM notice WHERE state = 'pending' AND next_at <= clock_timestamp()
                AND event = ANY($2)
          ORDER BY id LIMIT $1",
    )
    .bind(limit)
    .bind(&known)
    .fetch_all(pool)
    .await?;
    let db_now = rows.first().map(|r| r.db_now);
    let notices = rows
        .into_iter()
        .filter_map(|r| {
            let slot_key = r.slot_key.or_else(|| {
                Some(
                    SlotKey {
                        kind: r.kind.clone()?,
                        day: r.day?,
                        slot_no: u32::try_from(r.slot?).ok()?,
                    }
                    .to_string(),
                )
            });
            Some(Notice {
                id: r.id,
                msg_id: r.msg_id,
                event: Event::parse(&r.event)?,
                kind: r.kind,
                day: r.day,
                slot: r.slot,
                slot_key,
                outcome: r.outcome,
                reason: r.reason,
                runs_dry_on: r.runs_dry_on,
                created_at: r.created_at,
                attempts: r.attempts,
            })
        })
        .collect();
    Ok(DueNotices { db_now, notices })
}

/// Records how the send of notice `id` ended.
pub async fn settle_notice(pool: &PgPool, id: i64, sent: &Sent) -> Result<(), StoreError> {
    let q = match sent {
        Sent::Delivered => sqlx::query(
            "UPDATE notice SET state = 'sent', attempts = attempts + 1,
                    sent_at = clock_timestamp(), last_error = NULL WHERE id = $1",
        )
        .bind(id),
        Sent::Filtered => {
            sqlx::query("UPDATE notice SET state = 'filtered' WHERE id = $1").bind(id)
        }
        Sent::Retry { after, error } => sqlx::query(
            "UPDATE notice SET attempts = attempts + 1, last_error = $2,
                    next_at = clock_timestamp() + $3 * interval '1 microsecond'
              WHERE id = $1",
        )
        .bind(id)
        .bind(crate::untrusted::truncate(error))
        .bind(i64::try_from(after.as_micros()).unwrap_or(i64::MAX)),
        Sent::GaveUp { error } => sqlx::query(
            "UPDATE notice SET state = 'gave_up', attempts = attempts + 1, last_error = $2
              WHERE id = $1",
        )
        .bind(id)
        .bind(crate::untrusted::truncate(error)),
    };
    q.execute(pool).await?;
    Ok(())
}
