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
//! Each set-up is testkit's: the run's `StackBuilder` starts it, and its
//! fail-overs are the servers' own.

use crate::model::Fault;

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
