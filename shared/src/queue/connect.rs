//! How a process connects to Redis: the operator's options ([`RedisOptions`])
//! and the connection pool built from them, TLS included.

use std::time::Duration;

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
}

/// A Redis URL or CA the pool cannot be built from; shown with the URL
/// redacted.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct PoolError(String);

/// Opens a connection pool. Short timeouts: a worker facing a dead Redis
/// should back off and retry, not hang.
pub fn pool(url: &str, max_size: usize) -> Result<deadpool_redis::Pool, PoolError> {
    pool_with(url, max_size, &RedisOptions::default())
}

/// [`pool`] with the operator's [`RedisOptions`]; `max_size` is the
/// binary's default, replaced by `--redis-pool-size`.
pub fn pool_with(
    url: &str,
    max_size: usize,
    opts: &RedisOptions,
) -> Result<deadpool_redis::Pool, PoolError> {
    let shown = crate::secret::redact_url(url);
    let bad = |e: &dyn std::fmt::Display| PoolError(format!("redis url {shown:?}: {e}"));
    if url.contains('#') && url.to_ascii_lowercase().contains("insecure") {
        return Err(bad(
            &"#insecure turns off certificate verification; use --redis-ca instead",
        ));
    }
    let client = match &opts.ca {
        None => redis::Client::open(url).map_err(|e| bad(&e))?,
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
            let certs = redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(pem),
            };
            redis::Client::build_with_tls(url, certs).map_err(|e| {
                PoolError(format!("--redis-ca {} with {shown:?}: {e}", path.display()))
            })?
        }
    };
    // The connection info carries the TLS parameters; deadpool's own
    // config type would drop them.
    let manager =
        deadpool_redis::Manager::new(client.get_connection_info().clone()).map_err(|e| bad(&e))?;
    let size = opts.pool_size.map_or(max_size, |n| n as usize);
    let connect = opts.connect_timeout.unwrap_or(Duration::from_secs(3));
    deadpool_redis::Pool::builder(manager)
        .max_size(size)
        .wait_timeout(Some(Duration::from_secs(5)))
        .create_timeout(Some(connect))
        .recycle_timeout(Some(Duration::from_secs(3)))
        .runtime(deadpool_redis::Runtime::Tokio1)
        .build()
        .map_err(|e| bad(&e))
}
