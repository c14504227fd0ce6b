//! `daily_quota`: units of each kind's daily cap, taken with conditional
//! upserts so concurrent slots can never overshoot the cap.

use super::StoreError;
use chrono::NaiveDate;
use sqlx::PgConnection;
use std::collections::HashSet;

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
    /// The kind whose cap is taken from.
    pub kind: String,
    /// The kind's local day the cap counts.
    pub day: NaiveDate,
    /// The kind's `daily_cap`, stated by the caller so the statement needs
    /// no config.
    pub cap: u32,
}

/// Takes one unit of the cap per element of `units`, in one conditional
/// upsert per statement (`QUOTA_TAKE`): concurrent slots of a kind and
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
