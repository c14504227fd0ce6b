//! How far this worker's clock is from Postgres's: measured at start and
//! every so often, logged when it is off, and shown by `planner status`.
//! Here rather than in `clock`, which knows nothing of Postgres.

use crate::clock::{SharedClock, Skew};

/// Measures `clock` against Postgres's: the better of two round trips (the
/// first may include connecting).
pub(super) async fn measure_skew(
    pool: &sqlx::PgPool,
    clock: &SharedClock,
) -> Result<Skew, crate::store::StoreError> {
    let mut best: Option<Skew> = None;
    for _ in 0..2 {
        let t0 = clock.now();
        let db = crate::store::db_now(pool).await?;
        let t1 = clock.now();
        let rtt = t1 - t0;
        let mid = t0 + rtt / 2;
        let m = Skew {
            skew_ms: (mid - db).num_milliseconds(),
            rtt_ms: rtt.num_milliseconds(),
        };
        if best.is_none_or(|b| m.rtt_ms < b.rtt_ms) {
            best = Some(m);
        }
    }
    Ok(best.expect("measured at least once"))
}
