//! `--redis` and `--postgres`: the stores a run is set against (the
//! topologies people buy), which fault kinds each can take, and what the
//! harness needs to reach them the way slotgate does.
//!
//! Redis: `standalone` is the server of `REDIS_URL`, one prefix of the
//! run's own on it. `cluster` is a Redis Cluster the run starts itself
//! (testkit's `OwnedCluster`: 3 masters with a replica each, on loopback),
//! with the queue split into [`CLUSTER_PARTITIONS`] hash-tagged partitions,
//! so a shard's failover (`redis-master-failover`) can be injected and
//! every other fault runs across shards. `sentinel` is a primary, a
//! replica and three Sentinels the run starts itself (testkit's
//! `OwnedSentinel`), slotgate given the `redis+sentinel://` URL, so a
//! failover of the primary (`sentinel-failover`) can be injected.
//!
//! Postgres: `single` is the server of `DATABASE_URL`; `pair` is a primary
//! with a synchronous streaming standby the run starts itself (testkit's
//! `PgPair`), reached through one proxy address that follows a failover
//! (`pg-failover`), as a virtual IP does.
//!
//! The harness's own Redis connection ([`RedisConn`]) is one type over
//! every topology, so every fault's Redis commands are written once.

use crate::model::Fault;
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Value};
use std::sync::Arc;

/// `--redis`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum RedisChoice {
    /// The Redis of `REDIS_URL`.
    #[default]
    Standalone,
    /// A 3-master Redis Cluster (a replica each) the run starts and stops.
    Cluster,
    /// A primary, a replica and three Sentinels the run starts and stops.
    Sentinel,
}

/// `--postgres`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum PgChoice {
    /// The Postgres of `DATABASE_URL`.
    #[default]
    Single,
    /// A primary with a synchronous standby the run starts and stops,
    /// behind one proxy address.
    Pair,
}

impl PgChoice {
    pub fn name(self) -> &'static str {
        match self {
            PgChoice::Single => "single",
            PgChoice::Pair => "pair",
        }
    }
}

/// The stores of a run: which fault kinds it can take.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stores {
    pub redis: RedisChoice,
    pub postgres: PgChoice,
}

impl Stores {
    /// Whether `fault` can happen on these stores: each failover needs
    /// the topology that has something to fail over to.
    pub fn applies(self, fault: Fault) -> bool {
        match fault {
            Fault::PgFailover => self.postgres == PgChoice::Pair,
            f => self.redis.applies(f),
        }
    }
}

/// `redis_partitions` of a run on a Cluster: one per master, so each
/// master serves a share of the queue and a failover hits one partition.
pub const CLUSTER_PARTITIONS: u16 = 3;

/// Masters and replicas per master of the run's own Cluster.
pub const CLUSTER_SHAPE: (usize, usize) = (3, 1);

impl RedisChoice {
    pub fn name(self) -> &'static str {
        match self {
            RedisChoice::Standalone => "standalone",
            RedisChoice::Cluster => "cluster",
            RedisChoice::Sentinel => "sentinel",
        }
    }

    /// Whether `fault` can happen on this topology: a Cluster master's
    /// failover needs a Cluster, a Sentinel failover Sentinels.
    pub fn applies(self, fault: Fault) -> bool {
        match fault {
            Fault::RedisMasterFailover => self == RedisChoice::Cluster,
            Fault::SentinelFailover => self == RedisChoice::Sentinel,
            _ => true,
        }
    }
}

/// The harness's raw Redis connection: one server's, a Cluster's (which
/// follows `MOVED` and retries through a failover by itself), or the
/// primary's the Sentinels name ([`FollowedPrimary`]).
#[derive(Clone)]
pub enum RedisConn {
    Single(MultiplexedConnection),
    Cluster(ClusterConnection),
    Sentinel(FollowedPrimary),
}

/// The Sentinel set-up's current primary, shared by every clone of the
/// harness's connection. A command holds it for reading while it runs;
/// `sentinel-failover` holds it for writing from the kill until the new
/// primary is elected, then points it there. So the harness's commands
/// wait through a failover and then go to the new primary, as a Cluster
/// connection's do, and none is sent to a dead or demoted server.
#[derive(Clone)]
pub struct FollowedPrimary(pub Arc<tokio::sync::RwLock<Primary>>);

/// A primary: its port and a connection to it.
pub struct Primary {
    pub port: u16,
    pub conn: MultiplexedConnection,
}

impl Primary {
    /// Connects to the data node on `port` (loopback).
    pub async fn connect(port: u16) -> redis::RedisResult<Primary> {
        let conn = redis::Client::open(format!("redis://127.0.0.1:{port}/"))?
            .get_multiplexed_async_connection()
            .await?;
        Ok(Primary { port, conn })
    }
}

impl ConnectionLike for RedisConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            RedisConn::Single(c) => c.req_packed_command(cmd),
            RedisConn::Cluster(c) => c.req_packed_command(cmd),
            RedisConn::Sentinel(p) => Box::pin(async move {
                let primary = p.0.read().await;
                let mut c = primary.conn.clone();
                c.req_packed_command(cmd).await
            }),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            RedisConn::Single(c) => c.req_packed_commands(cmd, offset, count),
            RedisConn::Cluster(c) => c.req_packed_commands(cmd, offset, count),
            RedisConn::Sentinel(p) => Box::pin(async move {
                let primary = p.0.read().await;
                let mut c = primary.conn.clone();
                c.req_packed_commands(cmd, offset, count).await
            }),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            RedisConn::Single(c) => c.get_db(),
            RedisConn::Cluster(c) => c.get_db(),
            // The Sentinel URL names no database: slotgate uses 0.
            RedisConn::Sentinel(_) => 0,
        }
    }
}
