//! What every command reaches for: the clock, the Postgres pool and the
//! queue named by the global flags, and the validated config.

use crate::cli::Connections;
use crate::exit::BadConfig;
use anyhow::{Context, Result};
use slotgate::clock::SharedClock;
use slotgate::config::Config;
use slotgate::plan::Planner;
use slotgate::queue::{KeySpace, Queue};
use slotgate::store;
use std::sync::Arc;

/// What every command reaches for: the clock and the stores' connection settings.
pub struct Env {
    /// The clock; the system's, or one a test moves.
    pub clock: SharedClock,
    /// `--database-url`, `--redis-url` and their TLS and pool settings.
    pub conn: Connections,
    /// `--config`: the queue's partition count comes from it.
    pub config: std::path::PathBuf,
}

impl Env {
    /// A small Postgres pool from `--database-url`.
    pub async fn pool(&self) -> Result<sqlx::PgPool> {
        let url = self
            .conn
            .database_url
            .as_deref()
            .context("DATABASE_URL is not set (or pass --database-url)")?;
        store::connect(url, 4, &self.conn.pg)
            .await
            .with_context(|| {
                format!(
                    "connecting to Postgres at {}",
                    slotgate::secret::redact_url(url)
                )
            })
    }
    /// The queue from `--redis-url`, `--prefix` and the config's
    /// `redis_partitions` (1 when there is no config file: the defaults).
    pub fn queue(&self) -> Result<Queue> {
        let partitions = if self.config.exists() {
            load_config(&self.config)?.redis_partitions
        } else {
            1
        };
        let url = self
            .conn
            .redis_url
            .as_deref()
            .context("REDIS_URL is not set (or pass --redis-url)")?;
        let pool = slotgate::queue::pool_with(url, 4, &self.conn.redis)?;
        Ok(Queue::new(
            pool,
            KeySpace::partitioned(self.conn.prefix.clone(), partitions, false),
        ))
    }
}

impl Env {
    /// The library's [`Planner`] over the `--config` (its slots numbered
    /// from Postgres), the pool and the queue: what every verb that plans,
    /// delivers or intervenes runs on.
    pub async fn planner(&self) -> Result<Planner> {
        let config = load_config(&self.config)?;
        let pool = self.pool().await?;
        Ok(Planner {
            config: numbered(config, &pool).await?,
            pool,
            queue: self.queue()?,
            clock: self.clock.clone(),
        })
    }
}

/// Numbers a loaded config's slots from Postgres (DESIGN 4.18): every
/// command that plans, delivers or seals slots must use the kept numbers,
/// never positions.
pub async fn numbered(config: Arc<Config>, pool: &sqlx::PgPool) -> Result<Arc<Config>> {
    let mut config = Arc::unwrap_or_clone(config);
    slotgate::store::number_kinds(pool, &mut config.kinds)
        .await
        .context("reading the slot numbers (table slot_number; run `planner migrate` first)")?;
    Ok(Arc::new(config))
}

/// Loads and validates the config; a bad one is exit status 2.
pub fn load_config(path: &std::path::Path) -> Result<Arc<Config>> {
    Config::load(path)
        .map(Arc::new)
        .map_err(|e| BadConfig(e).into())
}
