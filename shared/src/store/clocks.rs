//! `worker_clock`: each worker's measured offset from Postgres's clock, so
//! `planner status` can name a worker whose clock is off.

use super::StoreError;
use sqlx::postgres::PgPool;
use std::time::Duration;

// ---------------------------------------------------------------- clocks

/// A duration as whole milliseconds, for `$n * interval '1 millisecond'`.
pub(super) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// One worker's last clock measurement against Postgres.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerClock {
    /// The worker measured.
    pub worker_id: String,
    /// The worker's clock minus Postgres's.
    pub skew_ms: i64,
    /// The measurement's round trip; the skew is known to within half.
    pub rtt_ms: i64,
    /// How long ago (Postgres's clock) it was measured.
    pub age_ms: i64,
    /// The worker's [`crate::config::Config::fingerprint`] (`None` from a
    /// worker older than the column).
    pub config: Option<String>,
}

/// Stores a worker's measured clock offset.
pub async fn record_worker_clock(
    pool: &PgPool,
    worker: &str,
    skew_ms: i64,
    rtt_ms: i64,
    config: &str,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO worker_clock (worker_id, skew_ms, rtt_ms, measured_at, config) VALUES ($1, $2, $3, clock_timestamp(), $4)
         ON CONFLICT (worker_id) DO UPDATE SET skew_ms = $2, rtt_ms = $3, measured_at = clock_timestamp(), config = $4",
    )
    .bind(worker)
    .bind(skew_ms)
    .bind(rtt_ms)
    .bind(config)
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
    let rows: Vec<(String, i64, i64, i64, Option<String>)> = sqlx::query_as(
        "SELECT worker_id, skew_ms, rtt_ms,
                (extract(epoch FROM clock_timestamp() - measured_at) * 1000)::bigint, config
           FROM worker_clock
          WHERE measured_at > clock_timestamp() - $1 * interval '1 millisecond'
          ORDER BY worker_id",
    )
    .bind(millis(within))
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(worker_id, skew_ms, rtt_ms, age_ms, config)| WorkerClock {
            worker_id,
            skew_ms,
            rtt_ms,
            age_ms,
            config,
        })
        .collect())
}
