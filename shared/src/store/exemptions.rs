//! `exemption_request`: the operator's word, in Postgres, that a slot may
//! run outside the planner's schedule. The stream's `caller` and `early`
//! fields are claims anyone with Redis write access can make; a claim is
//! honoured only where a request row backs it (see
//! `executor::Exemption`).

use super::StoreError;
use crate::slot::SlotKey;
use sqlx::postgres::PgPool;

/// Who asked for the exemption, as the delivery's `caller` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Requester {
    /// `planner trigger`, `retry`, `dead replay`, the console: exempt from
    /// `starting_deadline`; with `early`, may also run before its time.
    Manual,
    /// `planner backfill`: exempt from `starting_deadline`.
    Backfill,
}

impl Requester {
    /// The caller name deliveries carry and the table stores.
    pub fn as_str(self) -> &'static str {
        match self {
            Requester::Manual => "manual",
            Requester::Backfill => "backfill",
        }
    }

    /// The requester a delivery's `caller` claims to be, if any.
    pub fn claimed_by(caller: &str) -> Option<Requester> {
        match caller {
            "manual" => Some(Requester::Manual),
            "backfill" => Some(Requester::Backfill),
            _ => None,
        }
    }
}

/// What the request rows of one slot grant a requester.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Granted {
    /// At least one request: the starting deadline does not apply.
    pub deadline: bool,
    /// A request with `early`: the slot may run before its time.
    pub early: bool,
}

/// Records requests for `keys` by `requester` (`early`: to run before the
/// slot's time), `by` naming the command. Written before the delivery is
/// put on the stream, so a worker never sees the delivery without it.
pub async fn request_exemptions(
    pool: &PgPool,
    keys: &[SlotKey],
    requester: Requester,
    early: bool,
    by: &str,
) -> Result<(), StoreError> {
    if keys.is_empty() {
        return Ok(());
    }
    let kinds: Vec<&str> = keys.iter().map(|k| k.kind.as_str()).collect();
    let days: Vec<chrono::NaiveDate> = keys.iter().map(|k| k.day).collect();
    let slots: Vec<i32> = keys.iter().map(|k| k.slot_no as i32).collect();
    sqlx::query(
        "INSERT INTO exemption_request (kind, day, slot, caller, early, requested_by)
         SELECT k, d, s, $4, $5, $6 FROM unnest($1::text[], $2::date[], $3::int[]) AS u(k, d, s)",
    )
    .bind(&kinds)
    .bind(&days)
    .bind(&slots)
    .bind(requester.as_str())
    .bind(early)
    .bind(by)
    .execute(pool)
    .await
    .map(|_| ())
}

/// What the requests for `key` by `requester` grant.
pub async fn exemption_granted(
    pool: &PgPool,
    key: &SlotKey,
    requester: Requester,
) -> Result<Granted, StoreError> {
    let (any, early): (bool, bool) = sqlx::query_as(
        "SELECT count(*) > 0, coalesce(bool_or(early), false) FROM exemption_request
         WHERE kind = $1 AND day = $2 AND slot = $3 AND caller = $4",
    )
    .bind(&key.kind)
    .bind(key.day)
    .bind(key.slot_no as i32)
    .bind(requester.as_str())
    .fetch_one(pool)
    .await?;
    Ok(Granted {
        deadline: any,
        early,
    })
}
