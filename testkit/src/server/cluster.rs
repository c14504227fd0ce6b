//! A Redis Cluster of one owner (a test, the chaos suite, the bench): N
//! masters with R replicas each, every node a `redis-server` of Debian's
//! package on loopback, joined by `redis-cli --cluster create`; killed and
//! removed on drop.
//!
//! The node timeout is short (1 s), so a killed master's replica takes
//! over within a few seconds: what a test of a failover waits for.

use super::{pick_port, redis_cli, spawn_redis, temp_dir, Failover, ServerError};
use crate::process::Proc;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// How long a cluster has to form, or to heal after a failover.
const SETTLE_WITHIN: Duration = Duration::from_secs(60);

/// One node of an [`OwnedCluster`].
pub struct ClusterNode {
    /// Its client port (the cluster bus is port + 10000).
    pub port: u16,
    /// The server process.
    pub proc: Proc,
}

/// A running Redis Cluster on 127.0.0.1; every node killed on drop.
pub struct OwnedCluster {
    /// Every node, masters first as created (roles change on failover:
    /// ask [`OwnedCluster::master_ports`]).
    pub nodes: Vec<ClusterNode>,
    /// Ports of the nodes this owner killed.
    killed: Vec<u16>,
    /// Nodes started again so far ([`OwnedCluster::restart`]).
    restarts: usize,
    dir: PathBuf,
}

/// A free port whose cluster bus port (+10000) is free too.
fn pick_cluster_port() -> u16 {
    loop {
        let p = pick_port();
        if std::net::TcpListener::bind(("127.0.0.1", p + 10000)).is_ok() {
            return p;
        }
    }
}

/// Starts node `i` of a cluster in `dir` on `port`. Its cluster state
/// lives in `nodes-<port>.conf` there, so a node started again on the same
/// port ([`OwnedCluster::restart`]) comes back as the same node.
fn spawn_node(dir: &std::path::Path, name: &str, port: u16) -> Result<Proc, ServerError> {
    let port_s = port.to_string();
    let conf = format!("nodes-{port}.conf");
    spawn_redis(
        name,
        dir,
        &[
            "--port",
            &port_s,
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            &conf,
            "--cluster-node-timeout",
            "1000",
            // A replica takes over even if it lagged (tests kill
            // masters under load on purpose).
            "--cluster-replica-validity-factor",
            "0",
        ],
    )
}

impl OwnedCluster {
    /// Starts `masters` masters with `replicas` replicas each and waits
    /// until every node reports `cluster_state:ok`; panics if it cannot (a
    /// test's set-up).
    pub fn start(masters: usize, replicas: usize) -> OwnedCluster {
        Self::launch(masters, replicas).unwrap_or_else(|e| panic!("throwaway Redis Cluster: {e}"))
    }

    /// [`OwnedCluster::start`], returning what went wrong.
    pub fn launch(masters: usize, replicas: usize) -> Result<OwnedCluster, ServerError> {
        let dir = temp_dir("redis-cluster")?;
        let mut nodes = Vec::new();
        for i in 0..masters * (1 + replicas) {
            let port = pick_cluster_port();
            let proc = spawn_node(&dir, &format!("node-{i}"), port)?;
            nodes.push(ClusterNode { port, proc });
        }
        let cluster = OwnedCluster {
            nodes,
            killed: Vec::new(),
            restarts: 0,
            dir,
        };
        for n in &cluster.nodes {
            cluster.wait(&format!("node {} answering", n.port), || {
                redis_cli(n.port, &["PING"]).is_ok_and(|o| o.trim() == "PONG")
            })?;
        }
        let addrs: Vec<String> = cluster
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let mut args = vec!["--cluster", "create"];
        args.extend(addrs.iter().map(String::as_str));
        let replicas_s = replicas.to_string();
        args.extend(["--cluster-replicas", &replicas_s, "--cluster-yes"]);
        redis_cli(cluster.nodes[0].port, &args)?;
        cluster.wait_healthy()?;
        Ok(cluster)
    }

    /// Polls `ok` until it holds, within [`SETTLE_WITHIN`].
    fn wait(&self, what: &str, ok: impl Fn() -> bool) -> Result<(), ServerError> {
        super::poll_until(&format!("the cluster: {what}"), SETTLE_WITHIN, ok)
    }

    /// Waits until every live node says `cluster_state:ok`, every hash
    /// slot has a master, and no node this owner killed is still taken for
    /// a master (after a kill, the others need a node timeout to notice
    /// and a replica must have taken over).
    pub fn wait_healthy(&self) -> Result<(), ServerError> {
        self.wait("cluster_state:ok on every live node", || {
            let masters = self.master_ports();
            self.killed.iter().all(|k| !masters.contains(k))
                && self.live_ports().iter().all(|p| {
                    redis_cli(*p, &["CLUSTER", "INFO"]).is_ok_and(|i| {
                        i.contains("cluster_state:ok") && i.contains("cluster_slots_ok:16384")
                    })
                })
        })
    }

    /// Ports of the nodes whose process still runs.
    pub fn live_ports(&self) -> Vec<u16> {
        self.nodes
            .iter()
            .map(|n| n.port)
            .filter(|p| !self.killed.contains(p))
            .collect()
    }

    /// Ports of the nodes that are masters now (from a live node's
    /// `CLUSTER NODES`, failed ones left out).
    pub fn master_ports(&self) -> Vec<u16> {
        let Some(port) = self.live_ports().first().copied() else {
            return Vec::new();
        };
        let table = redis_cli(port, &["CLUSTER", "NODES"]).unwrap_or_default();
        let mut out: Vec<u16> = table
            .lines()
            .filter(|l| {
                let flags = l.split_whitespace().nth(2).unwrap_or("");
                flags.contains("master") && !flags.contains("fail")
            })
            .filter_map(|l| {
                let addr = l.split_whitespace().nth(1)?;
                addr.split('@').next()?.rsplit(':').next()?.parse().ok()
            })
            .collect();
        out.sort();
        out
    }

    /// The port of the master that serves `key` now.
    pub fn master_of(&self, key: &str) -> Option<u16> {
        let port = *self.live_ports().first()?;
        let slot: u16 = redis_cli(port, &["CLUSTER", "KEYSLOT", key])
            .ok()?
            .trim()
            .parse()
            .ok()?;
        // `CLUSTER SLOTS` in redis-cli's plain output: one value a line,
        // each range as start, end, then its master's ip and port.
        let slots = redis_cli(port, &["CLUSTER", "SLOTS"]).ok()?;
        let lines: Vec<&str> = slots.lines().map(str::trim).collect();
        let mut i = 0;
        while i + 3 < lines.len() {
            if let (Ok(start), Ok(end)) = (lines[i].parse::<u16>(), lines[i + 1].parse::<u16>()) {
                if (start..=end).contains(&slot) && lines[i + 2] == "127.0.0.1" {
                    return lines[i + 3].parse().ok();
                }
            }
            i += 1;
        }
        None
    }

    /// `kill -9` of the node on `port` (verified): the cluster must fail
    /// over to one of its replicas.
    pub fn kill_9(&mut self, port: u16) {
        let n = self
            .nodes
            .iter_mut()
            .find(|n| n.port == port)
            .unwrap_or_else(|| panic!("no cluster node on {port}"));
        if let Err(st) = n.proc.kill_9() {
            panic!("cluster node {port} had exited by itself: {st}");
        }
        self.killed.push(port);
    }

    /// Starts the node on `port` again after [`OwnedCluster::kill_9`], with
    /// the same arguments and its own `nodes-<port>.conf`: it rejoins as
    /// the same node, and a master that was failed over comes back as a
    /// replica of its successor, so a failover can be injected again.
    /// Returns once it answers and says it is a replica with its link to
    /// the master up, and the cluster is healthy again (within
    /// `SETTLE_WITHIN`).
    pub fn restart(&mut self, port: u16) -> Result<(), ServerError> {
        let i = self
            .nodes
            .iter()
            .position(|n| n.port == port)
            .ok_or_else(|| ServerError::Step {
                step: format!("restarting cluster node {port}"),
                detail: "no such node".into(),
            })?;
        if !self.killed.contains(&port) {
            return Err(ServerError::Step {
                step: format!("restarting cluster node {port}"),
                detail: "it was not killed".into(),
            });
        }
        self.restarts += 1;
        // A log of its own: the killed run's log stays for a post-mortem.
        let name = format!("node-{i}-restart-{}", self.restarts);
        self.nodes[i].proc = spawn_node(&self.dir, &name, port)?;
        self.killed.retain(|k| *k != port);
        self.wait(&format!("node {port} back as a replica"), || {
            redis_cli(port, &["INFO", "replication"])
                .is_ok_and(|r| r.contains("role:slave") && r.contains("master_link_status:up"))
        })?;
        self.wait_healthy()
    }

    /// `kill -9` of the master serving `key`, verified by a replica of it
    /// having taken over (the cluster healthy, the key's master another
    /// node), then the node started again on its port, where it rejoins as
    /// a replica, so the fault can recur.
    pub fn fail_over(&mut self, key: &str) -> Result<Failover, ServerError> {
        let old = self.master_of(key).ok_or_else(|| ServerError::Step {
            step: "CLUSTER SLOTS".into(),
            detail: format!("no master serves {key}"),
        })?;
        let started = Instant::now();
        self.kill_9(old);
        let healthy = self.wait_healthy();
        let took = started.elapsed();
        let new = self.master_of(key);
        let back = self.restart(old);
        let verified = healthy.is_ok() && new.is_some_and(|n| n != old) && back.is_ok();
        let what = format!(
            "kill -9 master {old} of {key}; {} after {took:.1?}; node {old} restarted: {}",
            match (&healthy, new) {
                (Ok(()), Some(n)) if n != old => format!("replica {n} took over"),
                (Ok(()), n) => format!("healthy but the master is {n:?}"),
                (Err(e), _) => format!("not healthy: {e}"),
            },
            match &back {
                Ok(()) => "back as a replica".to_owned(),
                Err(e) => format!("not back: {e}"),
            }
        );
        Ok(Failover { what, verified })
    }

    /// Every node as seed URLs, comma-separated: a `REDIS_URL` for
    /// slotgate.
    pub fn url(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("redis://127.0.0.1:{}/", n.port))
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// Commands the Redis server on `port` ran since its last `CONFIG
/// RESETSTAT`, from `INFO commandstats`, leaving out what tooling and the
/// cluster's own housekeeping ask (`info`, `config`, `cluster`, `ping`):
/// a bench's measure of the work slotgate gave that server.
pub fn command_calls(port: u16) -> u64 {
    let stats = redis_cli(port, &["INFO", "commandstats"]).unwrap_or_default();
    stats
        .lines()
        .filter(|l| l.starts_with("cmdstat_"))
        .filter(|l| {
            !["info", "config", "cluster", "ping"].iter().any(|skip| {
                l.starts_with(&format!("cmdstat_{skip}:"))
                    || l.starts_with(&format!("cmdstat_{skip}|"))
            })
        })
        .filter_map(|l| {
            l.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

impl Drop for OwnedCluster {
    fn drop(&mut self) {
        for n in &mut self.nodes {
            let _ = n.proc.kill_9();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
