//! `leader_epoch`: the fencing epoch a new leader takes.

use super::StoreError;
use sqlx::postgres::PgPool;

// ---------------------------------------------------------------- leader

/// Takes the next fencing epoch. Gaps are fine; repeats never happen.
pub async fn next_epoch(pool: &PgPool) -> Result<i64, StoreError> {
    sqlx::query_scalar("UPDATE leader_epoch SET epoch = epoch + 1 WHERE id RETURNING epoch")
        .fetch_one(pool)
        .await
}
