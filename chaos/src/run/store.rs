//! The stores going away under the workers: `redis-prefix-wipe` (every key
//! of the prefix deleted), `pg-terminate` (every slotgate session
//! terminated), and the topologies' failovers — `redis-master-failover`
//! (a Cluster master), `sentinel-failover` (the primary the Sentinels
//! name) and `pg-failover` (the Postgres primary, to its synchronous
//! standby). A quota row held locked is [`super::quota`].

use super::{Harness, Injection};
use anyhow::{bail, Context, Result};
use std::future::Future;
use std::time::{Duration, Instant};
use testkit::server::{Failover, ServerError};

/// [`crate::scenario::Ev::RedisWipe`].
pub(super) async fn wipe(h: &Harness) -> Result<Injection> {
    let affected = h.open_due_within(None);
    let n = h.stack.kit.wipe_prefix().await?;
    h.records.lock().unwrap().wipes.push(Instant::now());
    Ok(Injection::new(
        affected,
        format!("deleted {n} key(s) of prefix {}", h.stack.kit.redis.prefix),
        n > 0,
    ))
}

/// [`crate::scenario::Ev::PgTerminate`].
pub(super) async fn pg_terminate(h: &Harness) -> Result<Injection> {
    // The workers' own connections; retried until there was one
    // (a pool may be between connections).
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut tries = 0;
    Ok(loop {
        tries += 1;
        let affected = h.open_due_within(Some(Duration::from_secs(1)));
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = $1 AND application_name = 'slotgate' AND pid <> pg_backend_pid()",
        )
        .bind(&h.stack.db_name)
        .fetch_one(&h.stack.kit.pool)
        .await?;
        if n > 0 {
            break Injection::new(
                affected,
                format!("terminated {n} slotgate backend(s) (try {tries})"),
                true,
            );
        }
        if Instant::now() > deadline {
            bail!("no slotgate backend to terminate in 10 s ({tries} tries)");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    })
}

/// [`crate::scenario::Ev::RedisMasterFailover`]: the Cluster master
/// serving `partition`'s keys killed (see
/// [`testkit::server::OwnedCluster::fail_over`]).
pub(super) async fn cluster_failover(h: &Harness, partition: u16) -> Result<Injection> {
    // Replication is asynchronous: writes the killed master took
    // but had not passed on are gone, as in a wipe of its
    // shard. Entries the harness added before are judged as
    // after a wipe (handled, or dropped with it); slots are
    // judged as always (Postgres has them; the reconciler
    // queues them again).
    let key = h
        .stack
        .keys
        .part(partition % h.stack.keys.partitions())
        .ready();
    judged_as_wipe(h, h.stack.kit.cluster_fail_over(key)).await
}

/// [`crate::scenario::Ev::SentinelFailover`] (see
/// [`testkit::stack::Stack::sentinel_fail_over`]).
pub(super) async fn sentinel_failover(h: &Harness) -> Result<Injection> {
    // Replication is asynchronous here too: judged as after a
    // wipe, as a Cluster master's failover is.
    judged_as_wipe(h, h.stack.kit.sentinel_fail_over()).await
}

/// A Redis failover (`fail_over`, not started yet), recorded as a wipe
/// when it is done.
async fn judged_as_wipe(
    h: &Harness,
    fail_over: impl Future<Output = Result<Failover, ServerError>>,
) -> Result<Injection> {
    let affected = h.open_due_within(Some(Duration::from_secs(5)));
    let Failover { what, verified } = fail_over.await?;
    h.records.lock().unwrap().wipes.push(Instant::now());
    Ok(Injection::new(affected, what, verified))
}

/// `pg-failover`: the primary killed, the synchronous standby promoted
/// and the address moved (see [`testkit::server::PgPair::fail_over`]).
/// Verified when the server behind the address is out of recovery and a
/// worker committed an execution there after the switch (within 30 s):
/// the fleet carried on on the promoted server. No wipe is recorded: with
/// a synchronous standby no acknowledged commit is lost, and the judge
/// holds the run to that.
pub(super) async fn pg_failover(h: &Harness) -> Result<Injection> {
    let affected = h.open_due_within(Some(Duration::from_secs(5)));
    let what = {
        // After the harness's own held sessions let go, and before the
        // next one starts (see `Stack::pg_sessions`).
        let _all = h.stack.pg_sessions.write().await;
        h.stack.kit.pg_fail_over().await?
    };
    let pool = &h.stack.kit.pool;
    let deadline = Instant::now() + Duration::from_secs(30);
    // The harness's own pool reconnects through the moved address.
    let (in_recovery, floor) = loop {
        let r: Result<(bool, i64), _> = sqlx::query_as(
            "SELECT pg_is_in_recovery(), (SELECT coalesce(max(id), 0) FROM execution)",
        )
        .fetch_one(pool)
        .await;
        match r {
            Ok(v) => break v,
            Err(e) if Instant::now() > deadline => {
                return Err(e).context("reading the promoted server")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    };
    let switched = Instant::now();
    let mut after = None;
    while Instant::now() < deadline {
        let worker: Option<String> =
            sqlx::query_scalar("SELECT worker_id FROM execution WHERE id > $1 ORDER BY id LIMIT 1")
                .bind(floor)
                .fetch_optional(pool)
                .await
                .ok()
                .flatten();
        if let Some(w) = worker {
            after = Some(w);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(Injection::new(
        affected,
        format!(
            "{what}; {}; {}",
            if in_recovery {
                "the address leads to a server in recovery"
            } else {
                "the address leads to the promoted server"
            },
            match &after {
                Some(w) => format!(
                    "worker {w} committed an execution there {:.1?} after",
                    switched.elapsed()
                ),
                None => "no execution committed there within 30 s".to_owned(),
            }
        ),
        !in_recovery && after.is_some(),
    ))
}
