//! `--redis`: the Redis topology a run is set against, and what the
//! harness needs to reach it the way slotgate does.
//!
//! `standalone` is the server of `REDIS_URL`, one prefix of the run's own
//! on it. `cluster` is a Redis Cluster the run starts itself (testkit's
//! [`OwnedCluster`]: 3 masters with a replica each, on loopback), with the
//! queue split into [`CLUSTER_PARTITIONS`] hash-tagged partitions, so a
//! shard's failover (`redis-master-failover`) can be injected and every
//! other fault runs across shards. The choice is an enum of its own so a
//! further topology (Sentinel) is one more variant here, not a new flag.
//!
//! The harness's own connection ([`RedisConn`]) is one type over both, so
//! every fault's Redis commands are written once.

use crate::scenario::Fault;
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Value};

/// `--redis`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum RedisChoice {
    /// The Redis of `REDIS_URL`.
    #[default]
    Standalone,
    /// A 3-master Redis Cluster (a replica each) the run starts and stops.
    Cluster,
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
        }
    }

    /// Whether `fault` can happen on this topology: a master failover
    /// needs masters with replicas (a Cluster).
    pub fn applies(self, fault: Fault) -> bool {
        match fault {
            Fault::RedisMasterFailover => self == RedisChoice::Cluster,
            _ => true,
        }
    }
}

/// The harness's raw Redis connection: one server's, or a Cluster's
/// (which follows `MOVED` and retries through a failover by itself).
#[derive(Clone)]
pub enum RedisConn {
    Single(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl ConnectionLike for RedisConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            RedisConn::Single(c) => c.req_packed_command(cmd),
            RedisConn::Cluster(c) => c.req_packed_command(cmd),
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
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            RedisConn::Single(c) => c.get_db(),
            RedisConn::Cluster(c) => c.get_db(),
        }
    }
}
