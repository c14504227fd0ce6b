//! A Redis Sentinel deployment of one owner (a test, the chaos suite): a
//! primary and one replica (`--replicaof`), watched by three Sentinels
//! (`redis-server <conf> --sentinel`, quorum 2), every process Debian's
//! `redis-server` on loopback; killed and removed on drop.
//!
//! `down-after-milliseconds` is 1 s and `failover-timeout` 5 s, so a
//! killed primary is replaced by its replica within a few seconds: what a
//! test of a failover waits for. Passwords are optional: the data nodes'
//! (`requirepass` + `masterauth`, and `sentinel auth-pass` for the
//! Sentinels to reach them) and the Sentinels' own (`requirepass` +
//! `sentinel sentinel-pass` between themselves), since slotgate takes the
//! two apart. With [`Transport::Tls`] every process speaks only TLS
//! (`--port 0`), with a certificate of a CA the deployment makes, and the
//! Sentinels and the replica reach the data nodes over TLS too
//! (`tls-replication yes`): what a `rediss+sentinel://` URL talks to.

use super::{
    find_exe, pick_port, redis_cli_auth, spawn_redis, temp_dir, CliTarget, ErrorReplies, Failover,
    ServerError,
};
use crate::process::Proc;
use crate::tls::TestCa;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How long the deployment has to form, or to fail over.
const SETTLE_WITHIN: Duration = Duration::from_secs(60);

/// The name the Sentinels monitor the primary under.
pub const PRIMARY_NAME: &str = "slotgate";

/// Passwords of an [`OwnedSentinel`]; `None` leaves that side open.
#[derive(Debug, Clone, Default)]
pub struct SentinelAuth {
    /// The data nodes' `requirepass` (and the replica's `masterauth`).
    pub data: Option<String>,
    /// The Sentinels' own `requirepass`.
    pub sentinel: Option<String>,
}

/// How the deployment's processes are reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Transport {
    /// Plain TCP.
    #[default]
    Plain,
    /// TLS only, with certificates of a CA of the deployment's own
    /// ([`OwnedSentinel::ca`]).
    Tls,
}

/// One data node (primary or replica: roles change on failover).
pub struct DataNode {
    /// The node's port on 127.0.0.1.
    pub port: u16,
    /// The node's process (stopped on drop).
    pub proc: Proc,
    /// Starts on this port (each log kept apart).
    starts: u32,
}

/// A primary, a replica and three Sentinels on 127.0.0.1; every process
/// killed on drop.
pub struct OwnedSentinel {
    /// The two data nodes, the first primary as started.
    pub nodes: Vec<DataNode>,
    /// The Sentinels' ports.
    pub sentinel_ports: Vec<u16>,
    sentinels: Vec<Proc>,
    /// Ports of data nodes this owner killed (and has not restarted).
    killed: Vec<u16>,
    auth: SentinelAuth,
    /// The CA whose certificates the processes serve, on [`Transport::Tls`].
    tls: Option<TestCa>,
    dir: PathBuf,
}

/// `key` of a redis-cli reply printed as alternating key and value lines
/// (`SENTINEL MASTER`, `INFO` is `key:value` and handled by [`info_field`]).
fn pair_value(reply: &str, key: &str) -> Option<String> {
    let lines: Vec<&str> = reply.lines().map(str::trim).collect();
    lines
        .chunks(2)
        .find(|kv| kv.first() == Some(&key))
        .and_then(|kv| kv.get(1).map(|v| (*v).to_owned()))
}

/// `field:value` of an `INFO` reply.
pub fn info_field(info: &str, field: &str) -> Option<String> {
    info.lines()
        .find_map(|l| l.trim().strip_prefix(&format!("{field}:")))
        .map(str::to_owned)
}

impl OwnedSentinel {
    /// Starts the deployment with no passwords; panics if it cannot (a
    /// test's set-up).
    pub fn start() -> OwnedSentinel {
        Self::launch(SentinelAuth::default())
            .unwrap_or_else(|e| panic!("throwaway Redis Sentinel: {e}"))
    }

    /// Starts a primary, a replica and three Sentinels with `auth`, and
    /// waits until every Sentinel sees the primary, the replica and the
    /// two other Sentinels, and the replica is in sync.
    pub fn launch(auth: SentinelAuth) -> Result<OwnedSentinel, ServerError> {
        Self::launch_with(auth, Transport::Plain)
    }

    /// [`OwnedSentinel::launch`], every process reached over `transport`.
    pub fn launch_with(
        auth: SentinelAuth,
        transport: Transport,
    ) -> Result<OwnedSentinel, ServerError> {
        let dir = temp_dir("redis-sentinel")?;
        let tls = (transport == Transport::Tls).then(|| TestCa::new(&dir, "ca"));
        let mut s = OwnedSentinel {
            nodes: Vec::new(),
            sentinel_ports: Vec::new(),
            sentinels: Vec::new(),
            killed: Vec::new(),
            auth,
            tls,
            dir,
        };
        let primary = pick_port();
        s.nodes.push(DataNode {
            port: primary,
            proc: s.spawn_data(primary, None, 0)?,
            starts: 1,
        });
        let replica = pick_port();
        s.nodes.push(DataNode {
            port: replica,
            proc: s.spawn_data(replica, Some(primary), 0)?,
            starts: 1,
        });
        s.wait("the replica in sync with the primary", || {
            s.data_cli(replica, &["INFO", "replication"])
                .is_ok_and(|i| info_field(&i, "master_link_status").as_deref() == Some("up"))
        })?;
        let exe = find_exe(&["redis-server"]).ok_or_else(|| ServerError::Missing {
            what: "redis-server".into(),
            package: "redis-server".into(),
        })?;
        for i in 0..3 {
            let port = pick_port();
            let conf = s.dir.join(format!("sentinel-{port}.conf"));
            let mut text = format!(
                "{listen}\nbind 127.0.0.1\ndir {dir}\n\
                 sentinel monitor {PRIMARY_NAME} 127.0.0.1 {primary} 2\n\
                 sentinel down-after-milliseconds {PRIMARY_NAME} 1000\n\
                 sentinel failover-timeout {PRIMARY_NAME} 5000\n\
                 sentinel parallel-syncs {PRIMARY_NAME} 1\n",
                listen = s.listen(port).join("\n"),
                dir = s.dir.display()
            );
            if let Some(p) = &s.auth.data {
                text += &format!("sentinel auth-pass {PRIMARY_NAME} {p}\n");
            }
            if let Some(p) = &s.auth.sentinel {
                text += &format!("requirepass {p}\nsentinel sentinel-pass {p}\n");
            }
            std::fs::write(&conf, text)?;
            let conf_s = conf.to_str().expect("utf-8 path").to_owned();
            let proc = Proc::spawn(
                &format!("sentinel-{i}"),
                &exe,
                &[&conf_s, "--sentinel"],
                &[],
                &s.dir,
            );
            s.sentinels.push(proc);
            s.sentinel_ports.push(port);
        }
        s.wait(
            "every Sentinel sees the primary, its replica and the other two",
            || {
                s.sentinel_ports.iter().all(|p| {
                    s.sentinel_cli(*p, &["SENTINEL", "MASTER", PRIMARY_NAME])
                        .is_ok_and(|m| {
                            pair_value(&m, "num-slaves").as_deref() == Some("1")
                                && pair_value(&m, "num-other-sentinels").as_deref() == Some("2")
                                && pair_value(&m, "flags").as_deref() == Some("master")
                        })
                })
            },
        )?;
        Ok(s)
    }

    fn spawn_data(
        &self,
        port: u16,
        replica_of: Option<u16>,
        start: u32,
    ) -> Result<Proc, ServerError> {
        let flags: Vec<String> = self
            .listen(port)
            .iter()
            .filter_map(|l| l.split_once(' '))
            .flat_map(|(k, v)| [format!("--{k}"), v.to_owned()])
            .collect();
        let mut args: Vec<&str> = flags.iter().map(String::as_str).collect();
        let of = replica_of.map(|p| p.to_string());
        if let Some(of) = &of {
            args.extend(["--replicaof", "127.0.0.1", of]);
        }
        if let Some(p) = &self.auth.data {
            args.extend(["--requirepass", p, "--masterauth", p]);
        }
        let name = format!("data-{port}-{start}");
        spawn_redis(&name, &self.dir, &args)
    }

    /// The configuration lines that make a process listen on `port`:
    /// `port <port>`, or on TLS `port 0` and the `tls-*` lines (each
    /// `name value`; `redis-server` takes them as `--name value` too).
    fn listen(&self, port: u16) -> Vec<String> {
        let Some(ca) = &self.tls else {
            return vec![format!("port {port}")];
        };
        let path = |p: &Path| p.to_str().expect("utf-8 path").to_owned();
        vec![
            "port 0".into(),
            format!("tls-port {port}"),
            format!("tls-cert-file {}", path(&ca.server_cert)),
            format!("tls-key-file {}", path(&ca.server_key)),
            format!("tls-ca-cert-file {}", path(&ca.ca)),
            "tls-auth-clients no".into(),
            "tls-replication yes".into(),
        ]
    }

    /// The CA that signed the processes' certificate, on [`Transport::Tls`]
    /// (what a client trusts: `SLOTGATE_REDIS_CA`).
    pub fn ca(&self) -> Option<&Path> {
        self.tls.as_ref().map(|c| c.ca.as_path())
    }

    /// `redis-cli` to a data node, with the data password; an error reply
    /// is an error.
    pub fn data_cli(&self, port: u16, args: &[&str]) -> Result<String, ServerError> {
        self.cli(port, self.auth.data.as_deref(), args)
    }

    /// `redis-cli` to a Sentinel, with the Sentinels' password; an error
    /// reply is an error.
    pub fn sentinel_cli(&self, port: u16, args: &[&str]) -> Result<String, ServerError> {
        self.cli(port, self.auth.sentinel.as_deref(), args)
    }

    fn cli(&self, port: u16, password: Option<&str>, args: &[&str]) -> Result<String, ServerError> {
        let to = CliTarget {
            port,
            password,
            ca: self.ca(),
        };
        redis_cli_auth(to, ErrorReplies::Fail, args)
    }

    /// Polls `ok` until it holds, within [`SETTLE_WITHIN`].
    fn wait(&self, what: &str, ok: impl Fn() -> bool) -> Result<(), ServerError> {
        super::poll_until(
            &format!("the Sentinel deployment: {what}"),
            SETTLE_WITHIN,
            ok,
        )
    }

    /// The primary's port as the first Sentinel that answers names it
    /// (`SENTINEL GET-MASTER-ADDR-BY-NAME`).
    pub fn named_primary(&self) -> Option<u16> {
        self.sentinel_ports.iter().find_map(|p| {
            let out = self
                .sentinel_cli(*p, &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", PRIMARY_NAME])
                .ok()?;
            out.lines().nth(1)?.trim().parse().ok()
        })
    }

    /// `ROLE` of the data node on `port` (`master`, `slave`), if it answers.
    pub fn role(&self, port: u16) -> Option<String> {
        let out = self.data_cli(port, &["ROLE"]).ok()?;
        out.lines().next().map(|l| l.trim().to_owned())
    }

    /// `kill -9` of the data node the Sentinels name as the primary
    /// (verified: the exit status says SIGKILL); its port.
    pub fn kill_9_primary(&mut self) -> u16 {
        let port = self.named_primary().expect("a Sentinel names a primary");
        let n = self
            .nodes
            .iter_mut()
            .find(|n| n.port == port)
            .unwrap_or_else(|| panic!("no data node on {port}"));
        if let Err(st) = n.proc.kill_9() {
            panic!("the primary on {port} had exited by itself: {st}");
        }
        self.killed.push(port);
        port
    }

    /// Waits until a Sentinel names a primary other than `old` and that
    /// server answers `ROLE` master; its port.
    pub fn wait_failed_over(&self, old: u16) -> Result<u16, ServerError> {
        let found = std::cell::Cell::new(None);
        self.wait(&format!("a primary other than {old}"), || {
            let Some(p) = self.named_primary().filter(|p| *p != old) else {
                return false;
            };
            let ok = self.role(p).as_deref() == Some("master");
            if ok {
                found.set(Some(p));
            }
            ok
        })?;
        Ok(found.get().expect("set when the wait ended"))
    }

    /// `kill -9` of the primary the Sentinels name, then the replica
    /// elected (a Sentinel names it, it answers `ROLE` master) and written
    /// to by a client (its write calls grew within 30 s: slotgate carried
    /// on there). The killed node stays down: its restart is the caller's
    /// next step ([`Election::failover`] reports both).
    pub fn kill_and_elect(&mut self) -> Election {
        let started = Instant::now();
        let old = self.kill_9_primary();
        let elected = self.wait_failed_over(old);
        let wrote = elected.as_ref().ok().and_then(|new| {
            let base = self.write_calls(*new)?;
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                let now = self.write_calls(*new).unwrap_or(base);
                if now > base {
                    return Some(now - base);
                }
                if Instant::now() > deadline {
                    return None;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        Election {
            old,
            elected,
            wrote,
            took: started.elapsed(),
        }
    }

    /// Starts a manual failover (`SENTINEL FAILOVER`) with the primary
    /// kept alive; returns the primary's port. The Sentinels name the
    /// promoted replica within a second or two; they reconfigure the old
    /// primary as its replica only later (about 10 s), and until then it
    /// still answers `ROLE` master.
    pub fn start_failover(&self) -> Result<u16, ServerError> {
        let old = self.named_primary().ok_or_else(|| ServerError::Step {
            step: "SENTINEL GET-MASTER-ADDR-BY-NAME".into(),
            detail: "no Sentinel names a primary".into(),
        })?;
        self.sentinel_cli(
            self.sentinel_ports[0],
            &["SENTINEL", "FAILOVER", PRIMARY_NAME],
        )?;
        Ok(old)
    }

    /// Starts the killed data node on `port` again, empty (the Sentinels
    /// turn it into a replica of the current primary); waits until it is
    /// one, in sync.
    pub fn restart(&mut self, port: u16) -> Result<(), ServerError> {
        let i = self
            .nodes
            .iter()
            .position(|n| n.port == port)
            .unwrap_or_else(|| panic!("no data node on {port}"));
        let start = self.nodes[i].starts;
        let proc = self.spawn_data(port, None, start)?;
        self.nodes[i].proc = proc;
        self.nodes[i].starts += 1;
        self.killed.retain(|p| *p != port);
        self.wait(&format!("{port} back as a replica in sync"), || {
            self.role(port).as_deref() == Some("slave")
                && self
                    .data_cli(port, &["INFO", "replication"])
                    .is_ok_and(|i| info_field(&i, "master_link_status").as_deref() == Some("up"))
        })
    }

    /// `redis+sentinel://[:<data password>@]127.0.0.1:<s1>,…/<name>`
    /// (`rediss+sentinel://` on TLS): a `REDIS_URL` for slotgate (the
    /// Sentinels' password goes in `SLOTGATE_REDIS_SENTINEL_PASSWORD`, the
    /// CA in `SLOTGATE_REDIS_CA`).
    pub fn url(&self) -> String {
        self.url_with_password(self.auth.data.as_deref())
    }

    /// [`OwnedSentinel::url`] with another data password (or none).
    pub fn url_with_password(&self, password: Option<&str>) -> String {
        let auth = password.map(|p| format!(":{p}@")).unwrap_or_default();
        let hosts: Vec<String> = self
            .sentinel_ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        let scheme = if self.tls.is_some() {
            "rediss+sentinel"
        } else {
            "redis+sentinel"
        };
        format!("{scheme}://{auth}{}/{PRIMARY_NAME}", hosts.join(","))
    }

    /// Client calls of the commands slotgate writes with (scripts and
    /// the write commands, those run by scripts included) on the data node
    /// at `port`, from `INFO commandstats`. A primary gets none from
    /// replication, so on one every call counted is a client's.
    pub fn write_calls(&self, port: u16) -> Option<u64> {
        const WRITES: &[&str] = &[
            "evalsha",
            "eval",
            "zadd",
            "zrem",
            "xadd",
            "xack",
            "xdel",
            "xtrim",
            "xclaim",
            "xautoclaim",
            "xreadgroup",
            "set",
            "del",
            "hset",
            "hdel",
            "pexpire",
            "rename",
            "xgroup|create",
            "xgroup|createconsumer",
            "xgroup|setid",
        ];
        let stats = self.data_cli(port, &["INFO", "commandstats"]).ok()?;
        Some(
            stats
                .lines()
                .filter_map(|l| {
                    let (name, rest) = l.trim().strip_prefix("cmdstat_")?.split_once(':')?;
                    if !WRITES.contains(&name) {
                        return None;
                    }
                    rest.strip_prefix("calls=")?
                        .split(',')
                        .next()?
                        .parse::<u64>()
                        .ok()
                })
                .sum(),
        )
    }

    /// Ports of the data nodes whose process runs.
    pub fn live_ports(&self) -> Vec<u16> {
        self.nodes
            .iter()
            .map(|n| n.port)
            .filter(|p| !self.killed.contains(p))
            .collect()
    }
}

/// What [`OwnedSentinel::kill_and_elect`] saw.
#[derive(Debug)]
pub struct Election {
    /// The killed primary's port.
    pub old: u16,
    /// The port of the replica the Sentinels elected.
    pub elected: Result<u16, ServerError>,
    /// Write calls a client made to it after the election (none within
    /// 30 s: `None`).
    pub wrote: Option<u64>,
    /// From the kill to the first write there.
    pub took: Duration,
}

impl Election {
    /// The whole fail-over, once the killed node's restart ended `back`.
    pub fn failover(&self, back: &Result<(), ServerError>) -> Failover {
        let old = self.old;
        let what = format!(
            "kill -9 primary {old}; {} after {:.1?}; {}; node {old} restarted: {}",
            match &self.elected {
                Ok(new) => format!("the Sentinels elected {new}"),
                Err(e) => format!("no new primary: {e}"),
            },
            self.took,
            match self.wrote {
                Some(n) => format!("slotgate wrote to it (+{n} write call(s))"),
                None => "slotgate did not write to it within 30 s".to_owned(),
            },
            match back {
                Ok(()) => "back as a replica".to_owned(),
                Err(e) => format!("not back: {e}"),
            }
        );
        Failover {
            what,
            verified: self.elected.is_ok() && self.wrote.is_some() && back.is_ok(),
        }
    }
}

impl Drop for OwnedSentinel {
    fn drop(&mut self) {
        for s in &mut self.sentinels {
            let _ = s.kill_9();
        }
        for n in &mut self.nodes {
            let _ = n.proc.kill_9();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
