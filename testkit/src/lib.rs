//! Test fixtures for slotgate's suites. Real Postgres and Redis, never mocks:
//! every test gets its own database (dropped afterwards) and its own Redis
//! key prefix (deleted afterwards), so the suite runs in parallel and never
//! touches anyone else's data. Nothing here FLUSHes anything.
//!
//! Servers come from `DATABASE_URL` (any database on a server where we may
//! `CREATE DATABASE`) and `REDIS_URL`, defaulting to the local ones.
//!
//! This crate does not depend on `slotgate` on purpose: the library's own
//! integration tests use it, and a dev-dependency cycle would give them two
//! incompatible copies of the library's types.
#![warn(missing_docs, unreachable_pub)]

pub mod cms;
pub mod process;
pub mod proxy;
pub mod query_plan;
pub mod redis_conn;
pub mod server;
pub mod services;
pub mod stack;
pub mod tls;
pub mod zone;

use std::future::Future;
use std::time::{Duration, Instant};

/// Where tests find Postgres when `DATABASE_URL` is not set.
pub const DEFAULT_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";
/// Where tests find Redis when `REDIS_URL` is not set.
pub const DEFAULT_REDIS_URL: &str = "redis://127.0.0.1:6379/";

/// The library's migration list, compiled in here too (testkit cannot link
/// `slotgate`: the library's own tests depend on testkit).
// Its items are `pub` for the library; here they are this crate's own.
#[allow(unreachable_pub)]
#[path = "../../migrations/checksums.rs"]
mod migrations;

/// The migrations, embedded here too, with the same checksums as the
/// library's (see `slotgate::migrations`).
pub static MIGRATOR: std::sync::LazyLock<sqlx::migrate::Migrator> =
    std::sync::LazyLock::new(migrations::migrator);

fn unique(tag: &str) -> String {
    format!(
        "{tag}_{}",
        uuid::Uuid::new_v4()
            .simple()
            .to_string()
            .get(..12)
            .unwrap_or("x")
    )
}

/// The server URL with the database name replaced.
pub fn with_database(url: &str, db: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let after_scheme = base.find("://").map(|i| i + 3).unwrap_or(0);
    let root = match base[after_scheme..].find('/') {
        Some(i) => &base[..after_scheme + i],
        None => base,
    };
    match query {
        Some(q) => format!("{root}/{db}?{q}"),
        None => format!("{root}/{db}"),
    }
}

/// A fresh, migrated database of one test, dropped when this is dropped.
pub struct TestDb {
    /// The database's name (unique per test).
    pub name: String,
    /// A URL of the database, for the binaries a test starts.
    pub url: String,
    admin_url: String,
    /// A pool on the database, for the test's own queries.
    pub pool: sqlx::PgPool,
}

impl TestDb {
    /// Creates and migrates a database of its own on the server of `DATABASE_URL`.
    pub async fn new() -> TestDb {
        Self::on(std::env::var("DATABASE_URL").unwrap_or_else(|_| DEFAULT_DATABASE_URL.into()))
            .await
    }

    /// [`TestDb::new`] on the server of `admin_url` (any database there
    /// where we may `CREATE DATABASE`): a server of the caller's own, e.g.
    /// a [`server::OwnedPostgres`] a benchmark measures in isolation.
    pub async fn on(admin_url: impl Into<String>) -> TestDb {
        let admin_url = admin_url.into();
        let name = unique("sg");
        let mut admin = sqlx::PgPool::connect(&admin_url)
            .await
            .unwrap_or_else(|e| panic!("test Postgres at {admin_url}: {e}"));
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&admin)
            .await
            .expect("create test database");
        admin.close().await;
        admin = sqlx::PgPool::connect(&with_database(&admin_url, &name))
            .await
            .expect("connect to test database");
        MIGRATOR.run(&admin).await.expect("migrate test database");
        TestDb {
            url: with_database(&admin_url, &name),
            name,
            admin_url,
            pool: admin,
        }
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        // Only the admin connection is used here: the test's own pool belongs
        // to the test's runtime, which is blocked on this thread's join.
        let (admin_url, name) = (self.admin_url.clone(), self.name.clone());
        // Drop runs inside or outside a runtime; a thread of its own with a
        // runtime of its own works in both.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                if let Ok(admin) = sqlx::PgPool::connect(&admin_url).await {
                    let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                        .execute(&admin)
                        .await;
                    admin.close().await;
                }
            });
        })
        .join();
    }
}

/// A Redis key prefix of one test; its keys are deleted when this is dropped.
pub struct TestRedis {
    /// The Redis server's URL.
    pub url: String,
    /// The test's key prefix (unique per test).
    pub prefix: String,
}

impl TestRedis {
    /// A fresh prefix on the server of `REDIS_URL`.
    pub fn new() -> TestRedis {
        Self::on(std::env::var("REDIS_URL").unwrap_or_else(|_| DEFAULT_REDIS_URL.into()))
    }

    /// A fresh prefix on the Redis at `url` (a server of the test's own).
    pub fn on(url: impl Into<String>) -> TestRedis {
        TestRedis {
            url: url.into(),
            prefix: unique("sgt"),
        }
    }

    /// A plain multiplexed connection, for assertions and fault injection.
    pub async fn conn(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.url.as_str())
            .expect("redis url")
            .get_multiplexed_async_connection()
            .await
            .expect("redis connection")
    }

    /// Adds a delivery of `slot` from `caller` to the ready stream
    /// `stream`, as `redis-cli XADD` would. The caller names the stream
    /// with `slotgate::queue::KeySpace` (testkit cannot link slotgate), so
    /// no test spells a key by hand.
    pub async fn deliver(&self, stream: &str, slot: &str, caller: &str) {
        let mut c = self.conn().await;
        let _: String = redis::cmd("XADD")
            .arg(stream)
            .arg("*")
            .arg("slot")
            .arg(slot)
            .arg("caller")
            .arg(caller)
            .query_async(&mut c)
            .await
            .expect("XADD");
    }

    /// Deletes every key of this prefix (the "Redis lost everything" fault,
    /// scoped to this test).
    pub async fn wipe(&self) {
        let mut c = self.conn().await;
        let keys = scan(&mut c, &format!("{}:*", glob_escape(&self.prefix)))
            .await
            .expect("SCAN");
        if !keys.is_empty() {
            let _: i64 = redis::cmd("DEL")
                .arg(&keys)
                .query_async(&mut c)
                .await
                .expect("DEL");
        }
    }
}

/// Every key matching `pattern` on the server `c` talks to (SCAN, not
/// KEYS: the server may be shared and busy; as an operator would look).
pub async fn scan(
    c: &mut impl redis::aio::ConnectionLike,
    pattern: &str,
) -> redis::RedisResult<Vec<String>> {
    let mut cursor: u64 = 0;
    let mut keys = Vec::new();
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(c)
            .await?;
        keys.extend(batch);
        if next == 0 {
            return Ok(keys);
        }
        cursor = next;
    }
}

/// `s` with Redis's glob characters escaped, for a MATCH pattern.
pub(crate) fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for ch in s.chars() {
        if matches!(ch, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(ch);
    }
    out
}

impl Default for TestRedis {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for TestRedis {
    fn drop(&mut self) {
        // No prefix: nothing of this test's (a kept stack's, see
        // `stack::Stack::keep`).
        if self.prefix.is_empty() {
            return;
        }
        let (url, pattern) = (self.url.clone(), format!("{}:*", glob_escape(&self.prefix)));
        let _ = std::thread::spawn(move || {
            let Ok(client) = redis::Client::open(url.as_str()) else {
                return;
            };
            let Ok(mut c) = client.get_connection() else {
                return;
            };
            let keys: Vec<String> = redis::cmd("KEYS")
                .arg(&pattern)
                .query(&mut c)
                .unwrap_or_default();
            if !keys.is_empty() {
                let _: redis::RedisResult<i64> = redis::cmd("DEL").arg(&keys).query(&mut c);
            }
        })
        .join();
    }
}

/// Polls `check` until it returns `Some`, or panics with `what` after
/// `timeout`. Tests synchronize with this, never with bare sleeps.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        if Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Counts rows of a query returning one bigint.
pub async fn count(pool: &sqlx::PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sql)
        .fetch_one(pool)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// A plain HTTP/1.1 GET on loopback: (status, body). For probing the
/// worker's metrics and health endpoints without an HTTP client dependency.
pub async fn http_get(addr: &str, path: &str) -> std::io::Result<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n").as_bytes(),
    )
    .await?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await?;
    Ok(status_and_body(&buf))
}

/// The status and body of a whole HTTP/1.x answer (status 0 when there is
/// no status line).
pub fn status_and_body(answer: &[u8]) -> (u16, String) {
    let text = String::from_utf8_lossy(answer);
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_database_url_keeps_its_query_and_a_prefix_is_matched_literally() {
        assert_eq!(
            with_database("postgres://u@h:5432/postgres?sslmode=disable", "x"),
            "postgres://u@h:5432/x?sslmode=disable"
        );
        assert_eq!(with_database("postgres://u@h", "x"), "postgres://u@h/x");
        assert_eq!(glob_escape("{a}[b]*?"), "{a}\\[b\\]\\*\\?");
    }
}
