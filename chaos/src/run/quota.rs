//! A kind's quota row held by another session at its burst, so its slots
//! are open while the workers wait: `quota-held` (the row locked a while)
//! and `stall-burst` (locked while a thousand copies of its slots are
//! added, more than a worker may hold back).

use super::{Harness, Injection};
use crate::model::{Expect, Fault};
use anyhow::Result;
use std::collections::HashSet;
use std::time::{Duration, Instant};

/// Another session holds `kind`'s quota row of the day locked for at
/// least `hold_ms`, and until a slotgate backend was seen waiting on it
/// (at most 15 s). Verified: that wait.
pub(super) async fn hold(h: &Harness, kind: usize, hold_ms: u64) -> Result<Injection> {
    let _session = h.stack.pg_sessions.read().await;
    let name = h.sc.kinds[kind].name.clone();
    let (tx, started) = lock(h, &name).await?;
    let affected = open_of(h, &name, hold_ms);
    let waiter = hold_until_waited(h, tx, started, hold_ms).await?;
    Ok(Injection::new(
        affected,
        format!(
            "held the quota row of {name} for {:?} (a slotgate backend waited on it: {waiter})",
            started.elapsed()
        ),
        waiter,
    ))
}

/// Another session holds `kind`'s quota row while `copies` deliveries
/// of its open slots (round robin) are added with one pipeline, then
/// lets go after `hold_ms` once a slotgate backend waited on it.
/// Verified: a backend waited, every copy was accepted, and no running
/// worker's peak RSS reached 100 MiB while it held them back.
pub(super) async fn stall_burst(
    h: &Harness,
    kind: usize,
    hold_ms: u64,
    copies: u32,
) -> Result<Injection> {
    let _session = h.stack.pg_sessions.read().await;
    let name = h.sc.kinds[kind].name.clone();
    let (tx, started) = lock(h, &name).await?;
    let mut open: Vec<String> = open_of(h, &name, hold_ms).into_iter().collect();
    open.sort();
    if open.is_empty() {
        open = h
            .plan
            .iter()
            .filter(|p| p.slot.starts_with(&format!("{name}:")))
            .map(|p| p.slot.clone())
            .collect();
    }
    let mut pipe = redis::pipe();
    for i in 0..copies as usize {
        pipe.cmd("XADD")
            .arg(h.stack.ready())
            .arg("*")
            .arg("slot")
            .arg(&open[i % open.len()])
            .arg("caller")
            .arg(Fault::StallBurst.caller());
    }
    let mut c = h.stack.redis.clone();
    let ids: Vec<String> = pipe.query_async(&mut c).await?;
    h.added(
        Fault::StallBurst,
        Expect::Any,
        ids.iter()
            .enumerate()
            .map(|(i, id)| (Some(id.clone()), Some(open[i % open.len()].clone()))),
    );
    let waiter = hold_until_waited(h, tx, started, hold_ms).await?;
    let peak = h.workers_peak_rss_mib();
    Ok(Injection::new(
        open.into_iter().collect(),
        format!(
            "held the quota row of {name} for {:?} with {} copies added (a slotgate backend waited: {waiter}); workers' peak RSS {peak:.0} MiB",
            started.elapsed(),
            ids.len()
        ),
        waiter && ids.len() == copies as usize && peak < 100.0,
    ))
}

/// The open slots of kind `name` due within `hold_ms`: those the held row
/// keeps waiting.
fn open_of(h: &Harness, name: &str, hold_ms: u64) -> HashSet<String> {
    h.open_due_within(Some(Duration::from_millis(hold_ms)))
        .into_iter()
        .filter(|k| k.starts_with(&format!("{name}:")))
        .collect()
}

/// Locks `kind`'s quota row of the day in a transaction of its own
/// (a row with nothing used is the same state as no row).
async fn lock(
    h: &Harness,
    kind: &str,
) -> Result<(sqlx::Transaction<'static, sqlx::Postgres>, Instant)> {
    let day = &h.stack.day;
    sqlx::query(
        "INSERT INTO daily_quota (kind, day, used) VALUES ($1, $2::date, 0) ON CONFLICT DO NOTHING",
    )
    .bind(kind)
    .bind(day)
    .execute(&h.stack.kit.pool)
    .await?;
    let mut tx = h.stack.kit.pool.begin().await?;
    sqlx::query("SELECT used FROM daily_quota WHERE kind = $1 AND day = $2::date FOR UPDATE")
        .bind(kind)
        .bind(day)
        .fetch_one(&mut *tx)
        .await?;
    Ok((tx, Instant::now()))
}

/// Keeps `tx` (and its lock) open for at least `hold_ms` from `started`
/// and until a slotgate backend was seen waiting on a lock (at most
/// 15 s), then rolls it back. Whether one was seen.
async fn hold_until_waited(
    h: &Harness,
    tx: sqlx::Transaction<'static, sqlx::Postgres>,
    started: Instant,
    hold_ms: u64,
) -> Result<bool> {
    let mut waiter = false;
    while started.elapsed() < Duration::from_secs(15) {
        if !waiter {
            let n: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND application_name = 'slotgate' AND wait_event_type = 'Lock'",
            )
            .bind(&h.stack.db_name)
            .fetch_one(&h.stack.kit.pool)
            .await?;
            waiter = n > 0;
        }
        if waiter && started.elapsed() >= Duration::from_millis(hold_ms) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tx.rollback().await?;
    Ok(waiter)
}
