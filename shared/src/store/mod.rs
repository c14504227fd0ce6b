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
//!
//! One file per table or step: `plan`, `slots` (the gate row, one at a
//! time), `gate` (the set-based gate of both delivery paths), `quota`,
//! `drafts`, `executions`, `exemptions` (`exemption_request`: the
//! operator's word that a slot may run off schedule), `pause` (`kind_pause`,
//! and the per-delivery read of a slot's plan), `clocks`, `leader`,
//! `report`, `forecast` (the read-only snapshot of `planner forecast`),
//! `retention` (the statements of `planner prune`), `numbering`
//! (slot numbers kept across schedule edits), `replication` (whether the
//! server takes writes, and whether a commit waits for a standby),
//! `notices` (the outbox of operator notices).
//! Everything is re-exported here, so callers say `store::name`.

/// "This slot has no gate row yet", for the row named `$t` (columns `day`,
/// `slot`, `kind`): one probe of the unique index `(day, slot, kind)`, the
/// same in every statement that asks it.
///
/// Why the probe is spelt this way: a table filled during a burst still has
/// the statistics of an empty one, and Postgres then rates the unique index
/// and `publish_slot_kind_day` alike. Where the outer row's kind is tied to
/// another column (`q.kind = w.kind`), it chose `publish_slot_kind_day` and
/// filtered on `slot`, reading every gate row of the kind and day once per
/// slot probed: the reconciler's read of 40,000 due slots took 5.5 s
/// instead of 0.13 s, and in a 40,000-slot burst it ran into the 10 s
/// statement timeout pass after pass, a core of the machine each time.
/// `kind || ''` leaves only the unique index usable (by its `(day, slot)`
/// prefix, at most one row per kind), and `OFFSET 0` keeps the probe a
/// per-row lookup rather than a join planned on those statistics.
macro_rules! no_gate_row {
    ($t:literal) => {
        concat!(
            "NOT EXISTS (SELECT 1 FROM publish_slot s WHERE s.day = ",
            $t,
            ".day AND s.slot = ",
            $t,
            ".slot AND s.kind || '' = ",
            $t,
            ".kind OFFSET 0)"
        )
    };
}

/// "This gate row is still held by the worker `$w` at the attempt its
/// input row asked for", for gate rows `s` of `publish_slot` and an input
/// `i(id, attempt)` of many claims: the claim fence, the same in every
/// statement that renews or settles a batch's claims.
///
/// Why it is spelt this way: the gate rows are found by primary key only
/// (`id = ANY (ARRAY(…))`, and `state || ''` so the fence no longer matches
/// the predicate of `publish_slot_open`). With the statistics of a table
/// filled during the day Postgres walked every open claim of the worker
/// once per row (EXPLAIN ANALYZE, 20,000 open claims, 32 rows: 83 ms; by
/// key 0.7 ms).
///
/// A statement with this fence is planned for its own rows on every call
/// (sqlx's `persistent(false)`), never from a cached plan: the plan
/// Postgres caches for a prepared statement after its fifth run is made
/// for ten input rows, and for those it joins the gate rows found by key
/// to the input by scanning the whole input once per gate row. That is
/// quadratic: a finish of 256 rows took 26–45 ms against 6–11 ms planned
/// for its rows, planning included (EXPLAIN ANALYZE, 40,000 open claims;
/// about the same at 52 rows). Found by key per input row instead (`s.id =
/// i.id` alone), an un-analyzed table's estimates chose a scan of the whole
/// table.
macro_rules! claim_still_held {
    ($w:literal) => {
        concat!(
            "s.id = ANY (ARRAY(SELECT id FROM i)) AND s.id = i.id AND s.claimed_by = ",
            $w,
            " AND s.attempt = i.attempt AND s.state || '' IN ('claimed', 'publishing')"
        )
    };
}

mod clocks;
mod drafts;
mod executions;
mod exemptions;
mod forecast;
mod gate;
mod leader;
mod notices;
mod numbering;
mod pause;
mod plan;
mod quota;
mod replication;
mod report;
mod retention;
mod slots;

pub use clocks::*;
pub use drafts::*;
pub use executions::*;
pub use exemptions::*;
pub use forecast::*;
pub use gate::*;
pub use leader::*;
pub use notices::*;
pub use numbering::*;
pub use pause::*;
pub use plan::*;
pub use quota::*;
pub use replication::*;
pub use report::*;
pub use retention::*;
pub use slots::*;

use crate::session::Session;
use chrono::{DateTime, Utc};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use std::str::FromStr;

/// Every store function fails with sqlx's own error: callers tell a stall
/// (SQLSTATE 55P03, 57014) or a lost connection from it directly, and a
/// wrapper would only hide that.
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
/// no TLS: production URLs should say `verify-full` (docs/production.md, "TLS").
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

/// Opens a pool (see `pool_of`).
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
