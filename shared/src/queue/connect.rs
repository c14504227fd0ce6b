//! How a process connects to Redis: the operator's options ([`RedisOptions`]),
//! the topology the URL names ([`Topology`]: one server, a Redis Cluster, or
//! a primary found through Sentinel) and the connection pool built from them,
//! TLS included ([`RedisPool`]).
//!
//! Every connection the queue uses comes from one [`RedisPool`], whatever the
//! topology, so every command keeps its deadline and its named error. Two
//! topologies need a pool manager of their own:
//! - **Cluster**: a pooled connection is a `ClusterConnection`, which routes
//!   each command by its key's hash slot and follows `MOVED`/`ASK` itself.
//!   It is pooled (not shared) because a worker's blocking wait on the bell
//!   would hold up every other command sent on a shared connection.
//! - **Sentinel**: a connection is opened to whichever server the Sentinels
//!   name as the primary, and checked each time it is taken from the pool:
//!   its server must answer `ROLE` master *and* still be the one the
//!   Sentinels name (asked at most every 100 ms). After a failover a live
//!   old primary keeps answering `master` for seconds, until the Sentinels
//!   reconfigure it, and drops whatever it took meanwhile; its connections
//!   are dropped instead of written to.

use redis::aio::ConnectionLike;
use std::time::Duration;

/// Which Redis topology `REDIS_URL` names (`--redis-mode`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum RedisMode {
    /// From the URL: `redis+sentinel://` (or `rediss+sentinel://`) is
    /// Sentinel, several comma-separated `redis://`/`rediss://` URLs are a
    /// Cluster's seed nodes, one URL is one server.
    #[default]
    Auto,
    /// One server (a primary with no failover, or a proxy in front of one).
    Standalone,
    /// A Redis Cluster; the URL(s) are seed nodes, the rest is discovered.
    Cluster,
    /// A primary found through Sentinel (`redis+sentinel://` URL).
    Sentinel,
}

/// How each process connects to Redis (flags of both binaries).
///
/// TLS: a `rediss://` URL is spoken over TLS, verified against the system
/// roots, or — with `--redis-ca`/`SLOTGATE_REDIS_CA` — against that CA
/// *instead* (the redis client's root store is replaced, so name the CA
/// that signed the server's certificate, not an extra one). `rediss://`
/// URLs ending in `#insecure` are refused: they skip verification.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct RedisOptions {
    /// Connections in each process's Redis pool (default: worker --concurrency + 4, planner 4).
    #[arg(id = "redis_pool_size", long = "redis-pool-size", value_name = "N", global = true, env = "SLOTGATE_REDIS_POOL_SIZE", value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub pool_size: Option<u32>,
    /// Longest time to open one Redis connection (TCP, TLS, handshake); 100ms to 10m.
    #[arg(id = "redis_connect_timeout", long = "redis-connect-timeout", value_name = "DURATION", global = true, env = "SLOTGATE_REDIS_CONNECT_TIMEOUT", default_value = "3s", value_parser = |s: &str| crate::config::REDIS_CONNECT_TIMEOUT.parse(s))]
    pub connect_timeout: Option<Duration>,
    /// PEM file of the CA that signed the Redis server's certificate (rediss:// only); replaces the system roots.
    #[arg(
        long = "redis-ca",
        global = true,
        env = "SLOTGATE_REDIS_CA",
        value_name = "PEM"
    )]
    pub ca: Option<std::path::PathBuf>,
    /// Redis topology: auto (from the URL), standalone, cluster (the URL(s) are seed nodes) or sentinel (a redis+sentinel:// URL).
    #[arg(
        id = "redis_mode",
        long = "redis-mode",
        global = true,
        env = "SLOTGATE_REDIS_MODE",
        value_enum,
        default_value_t = RedisMode::Auto
    )]
    pub mode: RedisMode,
    /// Password of the Sentinels themselves (the URL's password is the data nodes'); from the environment only.
    #[arg(
        id = "redis_sentinel_password",
        long = "redis-sentinel-password",
        global = true,
        env = "SLOTGATE_REDIS_SENTINEL_PASSWORD",
        hide = true,
        hide_env_values = true
    )]
    pub sentinel_password: Option<String>,
}

/// A Redis URL or CA the pool cannot be built from; shown with the URL
/// redacted.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct PoolError(String);

/// Where the data lives, as `REDIS_URL` and `--redis-mode` say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Topology {
    /// One server at one URL.
    Standalone(String),
    /// A Redis Cluster, from its seed nodes' URLs.
    Cluster(Vec<String>),
    /// A primary named by Sentinels.
    Sentinel(SentinelSpec),
}

/// A `redis+sentinel://[user:password@]host1:26379,host2:26379/<primary name>[/<db>]`
/// URL, taken apart. The URL's user and password are the data nodes';
/// the Sentinels' own password comes from `SLOTGATE_REDIS_SENTINEL_PASSWORD`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SentinelSpec {
    /// The Sentinels' addresses (port 26379 unless given).
    pub sentinels: Vec<(String, u16)>,
    /// The name the Sentinels monitor the primary under.
    pub primary: String,
    /// `rediss+sentinel://`: TLS to the Sentinels and to the data nodes.
    pub tls: bool,
    /// The data nodes' user, if any.
    pub username: Option<String>,
    /// The data nodes' password, if any.
    pub password: Option<String>,
    /// The database number on the data nodes.
    pub db: i64,
}

impl Topology {
    /// Reads the topology from `url` and `mode`; every refusal names the
    /// bad part of the (redacted) URL.
    pub fn parse(url: &str, mode: RedisMode) -> Result<Self, PoolError> {
        let shown = redact_all(url);
        let bad = |why: &str| PoolError(format!("redis url {shown:?}: {why}"));
        let lower = url.to_ascii_lowercase();
        let sentinel_scheme =
            lower.starts_with("redis+sentinel://") || lower.starts_with("rediss+sentinel://");
        if sentinel_scheme {
            if !matches!(mode, RedisMode::Auto | RedisMode::Sentinel) {
                return Err(bad(&format!(
                    "a redis+sentinel:// URL needs --redis-mode sentinel (or auto), not {mode:?}"
                )));
            }
            if split_urls(url).len() > 1 {
                return Err(bad(
                    "one redis+sentinel:// URL names every Sentinel (redis+sentinel://host1:26379,host2:26379/<primary name>)",
                ));
            }
            return SentinelSpec::parse(url)
                .map(Topology::Sentinel)
                .map_err(|why| bad(&why));
        }
        if mode == RedisMode::Sentinel {
            return Err(bad(
                "--redis-mode sentinel needs a redis+sentinel://host:26379,…/<primary name> URL",
            ));
        }
        let urls: Vec<String> = split_urls(url).into_iter().map(str::to_owned).collect();
        if urls.is_empty() {
            return Err(bad("no URL given"));
        }
        // What is not a URL of its own: a first part without a scheme, or
        // what follows a comma in a host part (`redis://a:1,b:2`; the
        // host part comes after the last `@`, so it holds no password).
        let not_a_url = urls.iter().find_map(|u| {
            let l = u.to_ascii_lowercase();
            if !(l.starts_with("redis://") || l.starts_with("rediss://")) {
                return Some(u.as_str());
            }
            let after_scheme = &u[u.find("://").map_or(0, |i| i + 3)..];
            let host = after_scheme
                .rsplit_once('@')
                .map_or(after_scheme, |(_, h)| h);
            let host = host.split(['/', '?', '#']).next().unwrap_or_default();
            host.split_once(',').map(|(_, next)| next)
        });
        if let Some(u) = not_a_url {
            return Err(bad(&format!(
                "{:?} is not a redis:// or rediss:// URL (several URLs are written in full, comma-separated)",
                crate::secret::redact_url(u)
            )));
        }
        match (mode, urls.len()) {
            (RedisMode::Standalone, n) if n > 1 => Err(bad(
                "several URLs name a cluster's seed nodes; --redis-mode standalone takes one",
            )),
            (RedisMode::Cluster, _) | (RedisMode::Auto, 2..) => Ok(Topology::Cluster(urls)),
            _ => Ok(Topology::Standalone(
                urls.into_iter().next().expect("one URL"),
            )),
        }
    }

    /// Whether keys must share a hash slot to be used together: only in a
    /// Redis Cluster (see [`KeySpace`](super::KeySpace)).
    pub fn is_cluster(&self) -> bool {
        matches!(self, Topology::Cluster(_))
    }
}

impl SentinelSpec {
    fn parse(url: &str) -> Result<Self, String> {
        let (scheme, rest) = url.split_once("://").ok_or("no scheme")?;
        let tls = scheme.eq_ignore_ascii_case("rediss+sentinel");
        let (auth, rest) = match rest.rsplit_once('@') {
            Some((a, r)) => (Some(a), r),
            None => (None, rest),
        };
        let (hosts, path) = rest
            .split_once('/')
            .ok_or("no primary name: write …/<name> after the Sentinels' addresses")?;
        let mut parts = path.split('/');
        let primary = decode(parts.next().unwrap_or_default())?;
        if primary.is_empty() {
            return Err("no primary name after the Sentinels' addresses".into());
        }
        let db = match parts.next().filter(|s| !s.is_empty()) {
            None => 0,
            Some(d) => d
                .parse()
                .map_err(|_| format!("database {d:?} is not a number"))?,
        };
        if parts.next().is_some() {
            return Err("the path is /<primary name>[/<db>]".into());
        }
        let mut sentinels = Vec::new();
        for h in hosts.split(',').filter(|h| !h.is_empty()) {
            let (host, port) = match h.rsplit_once(':') {
                Some((host, port)) if !port.contains(']') => (
                    host,
                    port.parse::<u16>()
                        .map_err(|_| format!("port {port:?} of {h:?} is not a port number"))?,
                ),
                _ => (h, 26379),
            };
            let host = host.trim_start_matches('[').trim_end_matches(']');
            if host.is_empty() {
                return Err(format!("{h:?} names no host"));
            }
            sentinels.push((host.to_owned(), port));
        }
        if sentinels.is_empty() {
            return Err("no Sentinel address".into());
        }
        let (username, password) = match auth {
            None => (None, None),
            Some(a) => match a.split_once(':') {
                Some((u, p)) => (Some(decode(u)?).filter(|u| !u.is_empty()), Some(decode(p)?)),
                None => (None, Some(decode(a)?)),
            },
        };
        Ok(Self {
            sentinels,
            primary,
            tls,
            username,
            password,
            db,
        })
    }
}

/// Percent-decoding of a URL part (a password may hold `@`, `:` or `/`).
fn decode(s: &str) -> Result<String, String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = s
                .get(i + 1..i + 3)
                .ok_or("a % not followed by two hex digits")?;
            out.push(
                u8::from_str_radix(hex, 16).map_err(|_| "a % not followed by two hex digits")?,
            );
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| "a percent-encoded part is not UTF-8".into())
}

/// The URLs of a `REDIS_URL` list (a Cluster's seed nodes), trimmed: the
/// list is cut at a comma only where what follows it (after any spaces)
/// begins with a Redis scheme, `redis://`, `rediss://`,
/// `redis+sentinel://` or `rediss+sentinel://` (in any case).
///
/// The one rule both [`Topology::parse`] and the redaction of a list
/// (`redact_all`) follow. A comma is a legal, unencoded character of a
/// password (`redis://:Pr1vate,secret@cache/`), and a Sentinel URL lists
/// its hosts with commas: cutting at every comma printed the part of a
/// password before its comma, and the rest of the password was taken for
/// a URL of its own. The one case still ambiguous, a password that holds
/// `,redis://` itself, must be percent-encoded (`%2C` for the comma).
fn split_urls(list: &str) -> Vec<&str> {
    const SCHEMES: [&str; 4] = [
        "redis://",
        "rediss://",
        "redis+sentinel://",
        "rediss+sentinel://",
    ];
    // (A comma followed by nothing but spaces ends the list.)
    let starts_a_url = |rest: &str| {
        let rest = rest.trim_start();
        rest.is_empty()
            || SCHEMES.iter().any(|s| {
                rest.get(..s.len())
                    .is_some_and(|head| head.eq_ignore_ascii_case(s))
            })
    };
    let mut urls = Vec::new();
    let mut start = 0;
    for (i, _) in list.match_indices(',') {
        if starts_a_url(&list[i + 1..]) {
            urls.push(&list[start..i]);
            start = i + 1;
        }
    }
    urls.push(&list[start..]);
    urls.into_iter()
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .collect()
}

/// Every URL of a `REDIS_URL` list ([`split_urls`]), redacted.
fn redact_all(list: &str) -> String {
    split_urls(list)
        .into_iter()
        .map(crate::secret::redact_url)
        .collect::<Vec<_>>()
        .join(",")
}

/// Opens a connection pool. Short timeouts: a worker facing a dead Redis
/// should back off and retry, not hang.
pub fn pool(url: &str, max_size: usize) -> Result<RedisPool, PoolError> {
    pool_with(url, max_size, &RedisOptions::default())
}

/// [`pool`] with the operator's [`RedisOptions`]; `max_size` is the
/// binary's default, replaced by `--redis-pool-size`.
pub fn pool_with(url: &str, max_size: usize, opts: &RedisOptions) -> Result<RedisPool, PoolError> {
    let shown = redact_all(url);
    let bad = |e: &dyn std::fmt::Display| PoolError(format!("redis url {shown:?}: {e}"));
    if url.contains('#') && url.to_ascii_lowercase().contains("insecure") {
        return Err(bad(
            &"#insecure turns off certificate verification; use --redis-ca instead",
        ));
    }
    let topology = Topology::parse(url, opts.mode)?;
    let certs = ca_certificates(opts)?;
    let size = opts.pool_size.map_or(max_size, |n| n as usize);
    let connect = opts.connect_timeout.unwrap_or(Duration::from_secs(3));
    let inner = match &topology {
        Topology::Standalone(url) => standalone(url, certs.as_ref(), size, connect, &bad)?,
        Topology::Cluster(urls) => cluster(urls, certs.as_ref(), size, connect, &bad)?,
        Topology::Sentinel(spec) => sentinel(spec, certs.as_ref(), opts, size, connect, &bad)?,
    };
    Ok(RedisPool { inner })
}

/// A pool's error for its URL (shown redacted).
type Bad<'a> = dyn Fn(&dyn std::fmt::Display) -> PoolError + 'a;

/// `--redis-ca`: the PEM file's certificates, read and checked once.
fn ca_certificates(opts: &RedisOptions) -> Result<Option<redis::TlsCertificates>, PoolError> {
    Ok(match &opts.ca {
        None => None,
        Some(path) => {
            let pem = std::fs::read(path).map_err(|e| {
                PoolError(format!("--redis-ca {}: cannot read: {e}", path.display()))
            })?;
            if !String::from_utf8_lossy(&pem).contains("-----BEGIN CERTIFICATE-----") {
                return Err(PoolError(format!(
                    "--redis-ca {}: holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
                    path.display()
                )));
            }
            Some(redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(pem),
            })
        }
    })
}

/// One server (`redis://`, `rediss://`): deadpool over its connection info.
fn standalone(
    url: &str,
    certs: Option<&redis::TlsCertificates>,
    size: usize,
    connect: Duration,
    bad: &Bad<'_>,
) -> Result<Inner, PoolError> {
    let client = match certs {
        None => redis::Client::open(url).map_err(|e| bad(&e))?,
        Some(c) => redis::Client::build_with_tls(url, c.clone())
            .map_err(|e| bad(&format!("with --redis-ca: {e}")))?,
    };
    // The connection info carries the TLS parameters; deadpool's own
    // config type would drop them.
    let manager =
        deadpool_redis::Manager::new(client.get_connection_info().clone()).map_err(|e| bad(&e))?;
    Ok(Inner::Single(
        deadpool_redis::Pool::builder(manager)
            .max_size(size)
            .wait_timeout(Some(Duration::from_secs(5)))
            .create_timeout(Some(connect))
            .recycle_timeout(Some(Duration::from_secs(3)))
            .runtime(deadpool_redis::Runtime::Tokio1)
            .build()
            .map_err(|e| bad(&e))?,
    ))
}

/// A Cluster from its seed nodes, behind our own manager.
fn cluster(
    urls: &[String],
    certs: Option<&redis::TlsCertificates>,
    size: usize,
    connect: Duration,
    bad: &Bad<'_>,
) -> Result<Inner, PoolError> {
    let mut b = redis::cluster::ClusterClientBuilder::new(urls.iter().map(String::as_str))
        .connection_timeout(connect)
        // Longer than any blocking wait on the bell (1 s), shorter
        // than the queue's own command deadline.
        .response_timeout(Duration::from_secs(4));
    if let Some(c) = certs {
        b = b.certs(c.clone());
    }
    let client = b.build().map_err(|e| bad(&e))?;
    Ok(Inner::Cluster(
        managed(ClusterManager { client }, size, connect).map_err(|e| bad(&e))?,
    ))
}

/// A primary named by Sentinels (`redis+sentinel://`), behind our own
/// manager, which checks the primary's role on every recycle.
fn sentinel(
    spec: &SentinelSpec,
    certs: Option<&redis::TlsCertificates>,
    opts: &RedisOptions,
    size: usize,
    connect: Duration,
    bad: &Bad<'_>,
) -> Result<Inner, PoolError> {
    let addrs: Vec<redis::ConnectionAddr> = spec
        .sentinels
        .iter()
        .map(|(h, p)| {
            if spec.tls {
                redis::ConnectionAddr::TcpTls {
                    host: h.clone(),
                    port: *p,
                    insecure: false,
                    tls_params: None,
                }
            } else {
                redis::ConnectionAddr::Tcp(h.clone(), *p)
            }
        })
        .collect();
    // To tell, when a connection is refused for its password,
    // which of the two passwords it was (see `SentinelManager`).
    let probes = addrs
        .iter()
        .map(|addr| {
            let info = redis::ConnectionInfo {
                addr: addr.clone(),
                redis: redis::RedisConnectionInfo {
                    password: opts.sentinel_password.clone(),
                    ..Default::default()
                },
            };
            match certs {
                Some(c) if spec.tls => redis::Client::build_with_tls(info, c.clone()),
                _ => redis::Client::open(info),
            }
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(&e))?;
    let mut b = redis::sentinel::SentinelClientBuilder::new(
        addrs,
        spec.primary.clone(),
        redis::sentinel::SentinelServerType::Master,
    )
    .map_err(|e| bad(&e))?
    .set_client_to_redis_db(spec.db);
    if spec.tls {
        b = b
            .set_client_to_redis_tls_mode(redis::TlsMode::Secure)
            .set_client_to_sentinel_tls_mode(redis::TlsMode::Secure);
        if let Some(c) = certs {
            b = b
                .set_client_to_redis_certificates(c.clone())
                .set_client_to_sentinel_certificates(c.clone());
        }
    }
    if let Some(u) = &spec.username {
        b = b.set_client_to_redis_username(u.clone());
    }
    if let Some(p) = &spec.password {
        b = b.set_client_to_redis_password(p.clone());
    }
    if let Some(p) = &opts.sentinel_password {
        b = b.set_client_to_sentinel_password(p.clone());
    }
    let client = b.build().map_err(|e| bad(&e))?;
    Ok(Inner::Sentinel(
        managed(
            SentinelManager {
                client: tokio::sync::Mutex::new(client),
                connect,
                primary: spec.primary.clone(),
                probe_conns: tokio::sync::Mutex::new(vec![None; probes.len()]),
                probes,
                named: std::sync::Mutex::new(None),
            },
            size,
            connect,
        )
        .map_err(|e| bad(&e))?,
    ))
}

fn managed<M: deadpool::managed::Manager>(
    m: M,
    size: usize,
    connect: Duration,
) -> Result<deadpool::managed::Pool<M>, deadpool::managed::BuildError> {
    deadpool::managed::Pool::builder(m)
        .max_size(size)
        .wait_timeout(Some(Duration::from_secs(5)))
        .create_timeout(Some(connect))
        .recycle_timeout(Some(Duration::from_secs(3)))
        .runtime(deadpool::Runtime::Tokio1)
        .build()
}

/// A pool of Redis connections to one server, a Cluster, or the primary a
/// Sentinel names; made by [`pool`] / [`pool_with`].
#[derive(Clone)]
pub struct RedisPool {
    inner: Inner,
}

impl std::fmt::Debug for RedisPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match &self.inner {
            Inner::Single(_) => "standalone",
            Inner::Cluster(_) => "cluster",
            Inner::Sentinel(_) => "sentinel",
        };
        f.debug_struct("RedisPool")
            .field("topology", &kind)
            .finish()
    }
}

#[derive(Clone)]
enum Inner {
    Single(deadpool_redis::Pool),
    Cluster(deadpool::managed::Pool<ClusterManager>),
    Sentinel(deadpool::managed::Pool<SentinelManager>),
}

impl RedisPool {
    /// Whether this pool reaches a Redis Cluster (keys used together must
    /// then share a hash slot).
    pub fn is_cluster(&self) -> bool {
        matches!(self.inner, Inner::Cluster(_))
    }

    /// The most connections the pool opens.
    pub fn max_size(&self) -> usize {
        match &self.inner {
            Inner::Single(p) => p.status().max_size,
            Inner::Cluster(p) => p.status().max_size,
            Inner::Sentinel(p) => p.status().max_size,
        }
    }

    /// Adds `n` connections to the pool's maximum (the bell watchers of a
    /// partitioned queue each hold one).
    pub(crate) fn grow(&self, n: usize) {
        let size = self.max_size() + n;
        match &self.inner {
            Inner::Single(p) => p.resize(size),
            Inner::Cluster(p) => p.resize(size),
            Inner::Sentinel(p) => p.resize(size),
        }
    }

    /// A connection, whatever the topology.
    pub(crate) async fn get(&self) -> Result<Conn, deadpool_redis::PoolError> {
        Ok(match &self.inner {
            Inner::Single(p) => Conn::Single(p.get().await?),
            Inner::Cluster(p) => Conn::Cluster(p.get().await?),
            Inner::Sentinel(p) => Conn::Sentinel(p.get().await?),
        })
    }
}

/// A pooled connection of any topology; every command goes through it.
pub(crate) enum Conn {
    Single(deadpool_redis::Connection),
    Cluster(deadpool::managed::Object<ClusterManager>),
    Sentinel(deadpool::managed::Object<SentinelManager>),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, redis::Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
            Conn::Sentinel(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(cmd, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(cmd, offset, count),
            Conn::Sentinel(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
            Conn::Sentinel(c) => c.get_db(),
        }
    }
}

/// Makes `ClusterConnection`s; one per pooled connection (see the module
/// overview for why they are not shared).
pub(crate) struct ClusterManager {
    client: redis::cluster::ClusterClient,
}

impl deadpool::managed::Manager for ClusterManager {
    type Type = redis::cluster_async::ClusterConnection;
    type Error = redis::RedisError;

    async fn create(&self) -> Result<Self::Type, Self::Error> {
        self.client.get_async_connection().await
    }

    async fn recycle(
        &self,
        conn: &mut Self::Type,
        _: &deadpool::managed::Metrics,
    ) -> deadpool::managed::RecycleResult<Self::Error> {
        redis::cmd("PING").query_async::<String>(conn).await?;
        Ok(())
    }
}

/// How long the primary the Sentinels name is taken as known before a
/// pooled connection's check asks them again: the longest a connection to
/// an old primary that still answers `master` (after `+switch-master`, before
/// the Sentinels reconfigure it, about 10 s in a manual failover) is handed
/// out. One question to a Sentinel per 100 ms per process.
const NAMED_FRESH: Duration = Duration::from_millis(100);

/// A connection to the primary the Sentinels named when it was opened,
/// and that primary's address.
pub(crate) struct SentinelConn {
    conn: redis::aio::MultiplexedConnection,
    addr: (String, u16),
}

impl ConnectionLike for SentinelConn {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, redis::Value> {
        self.conn.req_packed_command(cmd)
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        self.conn.req_packed_commands(cmd, offset, count)
    }

    fn get_db(&self) -> i64 {
        self.conn.get_db()
    }
}

/// Host and port of a TCP (or TLS) address.
fn host_port(addr: &redis::ConnectionAddr) -> (String, u16) {
    match addr {
        redis::ConnectionAddr::Tcp(h, p) => (h.clone(), *p),
        redis::ConnectionAddr::TcpTls { host, port, .. } => (host.clone(), *port),
        redis::ConnectionAddr::Unix(p) => (p.display().to_string(), 0),
    }
}

/// Makes connections to the primary the Sentinels name, and drops a
/// pooled one whose server is no longer the primary: one that answers
/// `ROLE` other than `master`, or that the Sentinels no longer name. The
/// second check matters: after a failover the old primary, if it still
/// runs, answers `master` until the Sentinels reconfigure it (seconds
/// later), and every write it takes meanwhile is thrown away when it
/// resyncs from the new one.
pub(crate) struct SentinelManager {
    client: tokio::sync::Mutex<redis::sentinel::SentinelClient>,
    connect: Duration,
    /// The name the Sentinels monitor the primary under.
    primary: String,
    /// A client per Sentinel with the Sentinels' password only: asked for
    /// the primary's address by the pooled connections' check, and, after
    /// a refused password, whether the Sentinels accept theirs.
    probes: Vec<redis::Client>,
    /// Open connections to the Sentinels, one per probe, for those checks.
    probe_conns: tokio::sync::Mutex<Vec<Option<redis::aio::MultiplexedConnection>>>,
    /// The address the Sentinels last named, and when.
    named: std::sync::Mutex<Option<(std::time::Instant, (String, u16))>>,
}

impl SentinelManager {
    fn probe_config(&self) -> redis::AsyncConnectionConfig {
        redis::AsyncConnectionConfig::new()
            .set_connection_timeout(self.connect)
            .set_response_timeout(self.connect)
    }

    /// The primary's address as a Sentinel names it now
    /// (`SENTINEL GET-MASTER-ADDR-BY-NAME`), at most [`NAMED_FRESH`] old;
    /// `None` when no Sentinel answers (the caller then trusts `ROLE`
    /// alone: Sentinels being away must not stop a working primary).
    async fn named_primary(&self) -> Option<(String, u16)> {
        let fresh = || {
            self.named
                .lock()
                .expect("named lock")
                .as_ref()
                .filter(|(at, _)| at.elapsed() < NAMED_FRESH)
                .map(|(_, a)| a.clone())
        };
        if let Some(a) = fresh() {
            return Some(a);
        }
        let mut conns = self.probe_conns.lock().await;
        // Another check may have asked while this one waited.
        if let Some(a) = fresh() {
            return Some(a);
        }
        for (probe, slot) in self.probes.iter().zip(conns.iter_mut()) {
            if slot.is_none() {
                *slot = probe
                    .get_multiplexed_async_connection_with_config(&self.probe_config())
                    .await
                    .ok();
            }
            let Some(conn) = slot.as_mut() else { continue };
            let answer: Result<Option<(String, u16)>, _> = redis::cmd("SENTINEL")
                .arg("GET-MASTER-ADDR-BY-NAME")
                .arg(&self.primary)
                .query_async(conn)
                .await;
            match answer {
                Ok(Some(addr)) => {
                    *self.named.lock().expect("named lock") =
                        Some((std::time::Instant::now(), addr.clone()));
                    return Some(addr);
                }
                Ok(None) => continue,
                Err(_) => *slot = None,
            }
        }
        None
    }

    /// The redis client says "authentication failed" (or the server
    /// `NOAUTH`) whether a Sentinel or the primary refused: this asks the
    /// Sentinels with their password alone and names the side that
    /// refused, so the operator knows which password to fix. Never shows
    /// a password.
    async fn name_refused_password(&self, e: redis::RedisError) -> redis::RedisError {
        let refused = e.kind() == redis::ErrorKind::AuthenticationFailed
            || matches!(e.code(), Some("NOAUTH" | "WRONGPASS"));
        if !refused {
            return e;
        }
        let mut sentinel_ok = false;
        for probe in &self.probes {
            let answer = match probe
                .get_multiplexed_async_connection_with_config(&self.probe_config())
                .await
            {
                Ok(mut c) => redis::cmd("PING").query_async::<String>(&mut c).await,
                Err(e) => Err(e),
            };
            if answer.is_ok() {
                sentinel_ok = true;
                break;
            }
        }
        let detail = if sentinel_ok {
            format!(
                "the primary {:?} the Sentinels name refused the URL's password (missing or wrong)",
                self.primary
            )
        } else {
            format!(
                "the Sentinels refused their password, SLOTGATE_REDIS_SENTINEL_PASSWORD (missing or wrong), asked for the primary {:?}",
                self.primary
            )
        };
        redis::RedisError::from((
            redis::ErrorKind::AuthenticationFailed,
            "password refused",
            detail,
        ))
    }
}

/// Whether the server on `conn` is a primary (`ROLE` answers `master`).
async fn is_primary(conn: &mut impl ConnectionLike) -> Result<bool, redis::RedisError> {
    let role: redis::Value = redis::cmd("ROLE").query_async(conn).await?;
    Ok(match role {
        redis::Value::Array(parts) => {
            matches!(
                parts.first(),
                Some(redis::Value::BulkString(b)) if b.as_slice() == b"master"
            ) || matches!(parts.first(), Some(redis::Value::SimpleString(s)) if s == "master")
        }
        _ => false,
    })
}

impl deadpool::managed::Manager for SentinelManager {
    type Type = SentinelConn;
    type Error = redis::RedisError;

    async fn create(&self) -> Result<Self::Type, Self::Error> {
        let config = redis::AsyncConnectionConfig::new().set_connection_timeout(self.connect);
        // Asks the Sentinels, then checks that the server they name says
        // `master` (the redis client does both).
        let got = self.client.lock().await.async_get_client().await;
        let client = match got {
            Ok(c) => c,
            Err(e) => return Err(self.name_refused_password(e).await),
        };
        let addr = host_port(&client.get_connection_info().addr);
        let mut conn = match client
            .get_multiplexed_async_connection_with_config(&config)
            .await
        {
            Ok(c) => c,
            Err(e) => return Err(self.name_refused_password(e).await),
        };
        // The Sentinels may still name a primary that was just demoted:
        // never hand out a connection that would write to a replica.
        if !is_primary(&mut conn).await? {
            return Err(redis::RedisError::from((
                redis::ErrorKind::ReadOnly,
                "the server Sentinel named is not (or no longer) the primary; asking again",
            )));
        }
        *self.named.lock().expect("named lock") = Some((std::time::Instant::now(), addr.clone()));
        Ok(SentinelConn { conn, addr })
    }

    async fn recycle(
        &self,
        conn: &mut Self::Type,
        _: &deadpool::managed::Metrics,
    ) -> deadpool::managed::RecycleResult<Self::Error> {
        if !is_primary(&mut conn.conn).await? {
            return Err(deadpool::managed::RecycleError::message(
                "the server is no longer the primary (a Sentinel failover); connection dropped",
            ));
        }
        match self.named_primary().await {
            Some(named) if named != conn.addr => Err(deadpool::managed::RecycleError::message(
                "the Sentinels name another server as the primary (a failover); connection dropped",
            )),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_their_topology() {
        use RedisMode::*;
        assert_eq!(
            Topology::parse("redis://h:6379/0", Auto).unwrap(),
            Topology::Standalone("redis://h:6379/0".into())
        );
        assert_eq!(
            Topology::parse("redis://a:7000, rediss://b:7001", Auto).unwrap(),
            Topology::Cluster(vec!["redis://a:7000".into(), "rediss://b:7001".into()])
        );
        assert_eq!(
            Topology::parse("redis://a:7000", Cluster).unwrap(),
            Topology::Cluster(vec!["redis://a:7000".into()])
        );
        let Topology::Sentinel(s) = Topology::parse(
            "rediss+sentinel://u:p%40ss@h1:26380,[::1],h3/mymaster/2",
            Auto,
        )
        .unwrap() else {
            panic!("not sentinel")
        };
        assert_eq!(
            s,
            SentinelSpec {
                sentinels: vec![
                    ("h1".into(), 26380),
                    ("::1".into(), 26379),
                    ("h3".into(), 26379)
                ],
                primary: "mymaster".into(),
                tls: true,
                username: Some("u".into()),
                password: Some("p@ss".into()),
                db: 2,
            }
        );
    }

    #[test]
    fn bad_urls_are_refused_naming_the_part_and_hiding_the_password() {
        use RedisMode::*;
        for (url, mode, says) in [
            (
                "redis://a:1,redis://b:2",
                Standalone,
                "standalone takes one",
            ),
            ("redis://a:1,b:2", Auto, "is not a redis://"),
            ("redis://a:1", Sentinel, "needs a redis+sentinel://"),
            ("redis+sentinel://:secret@h1:26379", Auto, "no primary name"),
            (
                "redis+sentinel://:secret@h1:x/m",
                Auto,
                "is not a port number",
            ),
            ("redis+sentinel://:secret@h1/m/db", Auto, "is not a number"),
            (
                "redis+sentinel://h1/m",
                Cluster,
                "needs --redis-mode sentinel",
            ),
        ] {
            let e = Topology::parse(url, mode).unwrap_err().to_string();
            assert!(e.contains(says), "{url}: {e}");
            assert!(!e.contains("secret"), "{url}: {e}");
        }
    }

    /// Issue 39: `redis://:Pr1vate,secret@…` printed as `Pr1vate,***`: the
    /// list was cut at every comma before each part was redacted, and the
    /// part after the comma was taken for a URL of its own.
    #[test]
    fn a_comma_in_a_password_neither_cuts_the_url_nor_shows_in_print() {
        use RedisMode::*;
        let pw = "Pr1vate,secret";
        // One server.
        let one = format!("redis://:{pw}@cache:6379/0");
        assert_eq!(redact_all(&one), "redis://:***@cache:6379/0");
        assert_eq!(
            Topology::parse(&one, Auto).unwrap(),
            Topology::Standalone(one.clone())
        );
        // A Cluster's seed nodes: cut only where a URL begins.
        let seeds = format!("redis://:{pw}@h1:7000, rediss://app:{pw}@h2:7001,");
        assert_eq!(
            redact_all(&seeds),
            "redis://:***@h1:7000,rediss://app:***@h2:7001"
        );
        assert_eq!(
            Topology::parse(&seeds, Auto).unwrap(),
            Topology::Cluster(vec![
                format!("redis://:{pw}@h1:7000"),
                format!("rediss://app:{pw}@h2:7001")
            ])
        );
        // Sentinels: the hosts' commas and the password's.
        let sentinels = format!("redis+sentinel://app:{pw}@h1:26379,h2:26380/mymaster");
        assert_eq!(
            redact_all(&sentinels),
            "redis+sentinel://app:***@h1:26379,h2:26380/mymaster"
        );
        let Topology::Sentinel(spec) = Topology::parse(&sentinels, Auto).unwrap() else {
            panic!("not sentinel")
        };
        assert_eq!(spec.password.as_deref(), Some(pw));
        assert_eq!(
            spec.sentinels,
            vec![("h1".into(), 26379), ("h2".into(), 26380)]
        );
        // Every place a comma can stand in a password, in every form of
        // URL: no fragment of it is printed, by the redaction or by a
        // refusal (`#insecure`, a wrong mode, a host list without schemes).
        for pw in [
            "Pr1vate,SECRET",
            ",SECRET",
            "SECRET,",
            "SE,CR,ET",
            "SECRET, x",
            "SE,:CRET",
            "SECRET,@",
        ] {
            for url in [
                format!("redis://:{pw}@cache:6379/0"),
                format!("rediss://default:{pw}@cache/"),
                format!("redis://:{pw}@h1:7000,redis://:{pw}@h2:7001"),
                format!("redis://:{pw}@h1:7000,h2:7001"),
                format!("redis+sentinel://:{pw}@h1:26379,h2/mymaster"),
                format!("rediss+sentinel://u:{pw}@h1,h2:26380/mymaster/1"),
                format!("rediss://:{pw}@cache/#insecure"),
            ] {
                let shown = redact_all(&url);
                assert!(!shown.contains("SE"), "{url:?} printed as {shown:?}");
                for mode in [Auto, Standalone, Cluster, Sentinel] {
                    if let Err(e) = pool(&url, 1).and(Topology::parse(&url, mode).map(|_| ())) {
                        let e = e.to_string();
                        assert!(!e.contains("SE"), "{url:?} ({mode:?}): {e}");
                    }
                }
            }
        }
    }

    #[test]
    fn a_redis_url_list_is_cut_only_where_a_url_begins() {
        assert_eq!(split_urls("redis://a:1"), vec!["redis://a:1"]);
        assert_eq!(
            split_urls(" redis://a:1 ,REDISS://b:2,, redis+sentinel://c/m"),
            vec!["redis://a:1", "REDISS://b:2,", "redis+sentinel://c/m"]
        );
        assert_eq!(split_urls("redis://:x,y@a,b/m"), vec!["redis://:x,y@a,b/m"]);
        assert_eq!(split_urls("redis://a:1,"), vec!["redis://a:1"]);
        assert!(split_urls(" , ").is_empty());
        // A host list without schemes is refused, naming the host after
        // the comma.
        let e = Topology::parse("redis://:x,y@a:1,b:2", RedisMode::Auto)
            .unwrap_err()
            .to_string();
        assert!(e.contains("\"b:2\" is not a redis://"), "{e}");
        // Two Sentinel URLs are one too many.
        let e = Topology::parse("redis+sentinel://a/m,redis+sentinel://b/m", RedisMode::Auto)
            .unwrap_err()
            .to_string();
        assert!(e.contains("names every Sentinel"), "{e}");
    }
}
