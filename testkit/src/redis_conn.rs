//! A harness's own Redis connection over every topology a [`Stack`] can
//! have: one server's, a Cluster's (which follows `MOVED` and retries
//! through a failover by itself), or the primary's the Sentinels name
//! ([`FollowedPrimary`]). One type, so that a fault's or an assertion's
//! Redis commands are written once for all of them.
//!
//! [`Stack`]: crate::stack::Stack

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Value};
use std::sync::Arc;

/// See the module's doc.
#[derive(Clone)]
pub enum RedisConn {
    /// One server.
    Single(MultiplexedConnection),
    /// A Redis Cluster.
    Cluster(ClusterConnection),
    /// The primary of a Sentinel set-up.
    Sentinel(FollowedPrimary),
}

/// The Sentinel set-up's current primary, shared by every clone of the
/// harness's connection. A command holds it for reading while it runs; a
/// fail-over holds it for writing from the kill until the new primary is
/// elected, then points it there. So the harness's commands wait through a
/// failover and then go to the new primary, as a Cluster connection's do,
/// and none is sent to a dead or demoted server.
#[derive(Clone)]
pub struct FollowedPrimary(pub Arc<tokio::sync::RwLock<Primary>>);

/// A primary: its port and a connection to it.
pub struct Primary {
    /// Its port on loopback.
    pub port: u16,
    /// A connection to it.
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
