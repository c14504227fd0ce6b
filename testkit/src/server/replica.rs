//! A Postgres primary with a streaming replica on loopback, both owned by
//! one test: what a failover does to the gate, measured rather than
//! assumed (docs/production.md, "Postgres high availability").
//!
//! The replica is a base backup of the primary (`pg_basebackup`) started as
//! a hot standby. Its WAL stream reaches the primary through a testkit
//! [`Proxy`] (the *link*): freezing the link is how a test makes the replica
//! lag. Pausing replay (`pg_wal_replay_pause`) would not do: the WAL is
//! still received and a promotion replays every byte received, so nothing
//! would be lost. A frozen link holds the WAL on the primary's side, and a
//! promotion then really ends without the commits made meanwhile
//! ([`PgPair::lag_bytes`] says how much is missing).
//!
//! Clients reach the pair through a second proxy (the *front*), one stable
//! address that [`PgPair::repoint_front_to_replica`] moves to the promoted
//! replica, as a virtual IP or a DNS name follows a failover.
//!
//! Everything blocking (`pg_ctl`, `pg_basebackup`, the kill) runs under
//! `tokio::task::block_in_place`, so the proxies keep forwarding meanwhile:
//! the pair needs a multi-threaded runtime.

use super::postgres::OwnedPostgres;
use super::{path_str, ServerError};
use crate::proxy::Proxy;
use std::time::Duration;

/// The replica's `application_name`, the name a synchronous primary waits
/// for (`synchronous_standby_names`).
pub const STANDBY_NAME: &str = "replica";

/// How the primary treats its standby at commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replication {
    /// No synchronous standby (Postgres's default): a commit returns once
    /// it is durable on the primary; the replica follows when it can.
    Async,
    /// `synchronous_standby_names = 'replica'`: a commit returns only once
    /// the replica confirmed it at the given level.
    Sync(SyncLevel),
}

/// `synchronous_commit` of a primary with a synchronous standby.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncLevel {
    /// `on`: the standby flushed the commit to its disk.
    On,
    /// `remote_apply`: the standby applied it (a query there sees it).
    RemoteApply,
}

impl SyncLevel {
    fn setting(self) -> &'static str {
        match self {
            SyncLevel::On => "on",
            SyncLevel::RemoteApply => "remote_apply",
        }
    }
}

/// A primary and its streaming replica, with the replica's WAL link and the
/// clients' front address; both servers are stopped and removed on drop.
pub struct PgPair {
    /// Stops forwarding (closes the clients' connections) first on drop.
    pub front: Proxy,
    /// The replica's WAL stream from the primary.
    pub link: Proxy,
    /// The primary, serving writes until a test kills or demotes it.
    pub primary: OwnedPostgres,
    /// The streaming replica made by `pg_basebackup`.
    pub replica: OwnedPostgres,
    /// The replica's WAL link, which a test can freeze to make it lag.
    pub replication: Replication,
}

/// One text value from a fresh connection to `url` (a `pg_lsn` as text,
/// to hand one server's WAL position to the other).
async fn scalar_text(url: &str, sql: &str) -> Result<String, sqlx::Error> {
    let mut c: sqlx::PgConnection = sqlx::Connection::connect(url).await?;
    let v: String = sqlx::query_scalar(sql).fetch_one(&mut c).await?;
    sqlx::Connection::close(c).await?;
    Ok(v)
}

impl PgPair {
    /// Starts a primary, a replica streaming from it (through the link) and
    /// the front (at the primary); returns once the replica streams. Panics
    /// if it cannot (a test's set-up).
    pub async fn start(replication: Replication) -> PgPair {
        Self::launch(replication)
            .await
            .unwrap_or_else(|e| panic!("throwaway Postgres pair: {e}"))
    }

    async fn launch(replication: Replication) -> Result<PgPair, ServerError> {
        let mut settings = vec![("wal_level", "replica"), ("max_wal_senders", "5")];
        if let Replication::Sync(level) = replication {
            settings.push(("synchronous_standby_names", STANDBY_NAME));
            settings.push(("synchronous_commit", level.setting()));
        }
        let primary = tokio::task::block_in_place(|| OwnedPostgres::launch(&settings))?;
        let link = Proxy::start(&format!("127.0.0.1:{}", primary.port)).await?;
        let mut replica = OwnedPostgres::unstarted(&[])?;
        let data = replica.data();
        let port = primary.port.to_string();
        // The base backup comes straight from the primary; only the stream
        // that follows goes through the link.
        let out = tokio::task::block_in_place(|| {
            replica.run(
                "pg_basebackup",
                &[
                    "-h",
                    "127.0.0.1",
                    "-p",
                    &port,
                    "-U",
                    "postgres",
                    "-D",
                    path_str(&data),
                    "-R",
                    "-X",
                    "stream",
                    "--checkpoint=fast",
                ],
            )
        })?;
        if !out.status.success() {
            return Err(ServerError::Step {
                step: "pg_basebackup".into(),
                detail: String::from_utf8_lossy(&out.stderr).into_owned(),
            });
        }
        // `-R` wrote a primary_conninfo to the primary itself; the later
        // line wins.
        let conninfo = format!(
            "\nprimary_conninfo = 'host=127.0.0.1 port={} user=postgres application_name={STANDBY_NAME}'\n",
            link.addr.port()
        );
        let auto = data.join("postgresql.auto.conf");
        let mut text = std::fs::read_to_string(&auto)?;
        text.push_str(&conninfo);
        std::fs::write(&auto, text)?;
        tokio::task::block_in_place(|| replica.start_on_a_free_port())?;
        let front = Proxy::start(&format!("127.0.0.1:{}", primary.port)).await?;
        let pair = PgPair {
            front,
            link,
            primary,
            replica,
            replication,
        };
        pair.wait_streaming().await;
        Ok(pair)
    }

    /// Database `db` on the primary, directly.
    pub fn primary_url(&self, db: &str) -> String {
        self.primary.url(db)
    }

    /// Database `db` on the replica, directly.
    pub fn replica_url(&self, db: &str) -> String {
        self.replica.url(db)
    }

    /// Database `db` through the front: what the worker and the planner
    /// are given.
    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@{}/{db}", self.front.addr)
    }

    /// Waits until the primary sees the replica streaming (and, with a
    /// synchronous standby, as `sync`).
    pub async fn wait_streaming(&self) {
        let want = match self.replication {
            Replication::Async => "async",
            Replication::Sync(_) => "sync",
        };
        let sql = format!(
            "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming' \
             AND application_name = '{STANDBY_NAME}' AND sync_state = '{want}'"
        );
        let url = self.primary_url("postgres");
        crate::wait_for(
            "the replica streaming from the primary",
            Duration::from_secs(30),
            || async {
                let pool = sqlx::PgPool::connect(&url).await.ok()?;
                let n = sqlx::query_scalar::<_, i64>(&sql)
                    .fetch_one(&pool)
                    .await
                    .ok();
                pool.close().await;
                (n? >= 1).then_some(())
            },
        )
        .await
    }

    /// A new database on the primary, migrated, and replayed by the
    /// replica; returns its name.
    pub async fn create_db(&self) -> String {
        let name = crate::unique("sgha");
        let admin = sqlx::PgPool::connect(&self.primary_url("postgres"))
            .await
            .expect("connect to the primary");
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&admin)
            .await
            .expect("create the test database");
        admin.close().await;
        let pool = sqlx::PgPool::connect(&self.primary_url(&name))
            .await
            .expect("connect to the test database");
        crate::MIGRATOR
            .run(&pool)
            .await
            .expect("migrate the test database");
        pool.close().await;
        self.wait_caught_up().await;
        name
    }

    /// Bytes of WAL the primary has written that the replica has not
    /// received: what a promotion now would go without.
    pub async fn lag_bytes(&self) -> i64 {
        let at = scalar_text(
            &self.primary_url("postgres"),
            "SELECT pg_current_wal_lsn()::text",
        )
        .await
        .expect("the primary's WAL position");
        let mut c: sqlx::PgConnection = sqlx::Connection::connect(&self.replica_url("postgres"))
            .await
            .expect("connect to the replica");
        sqlx::query_scalar::<_, i64>(
            "SELECT pg_wal_lsn_diff($1::pg_lsn, pg_last_wal_receive_lsn())::bigint",
        )
        .bind(&at)
        .fetch_one(&mut c)
        .await
        .expect("the replica's WAL position")
    }

    /// Waits until the replica has received and applied everything the
    /// primary has written.
    pub async fn wait_caught_up(&self) {
        let primary = self.primary_url("postgres");
        let replica = self.replica_url("postgres");
        crate::wait_for(
            "the replica to replay all of the primary's WAL",
            Duration::from_secs(30),
            || async {
                let at = scalar_text(&primary, "SELECT pg_current_wal_lsn()::text")
                    .await
                    .ok()?;
                let mut c: sqlx::PgConnection = sqlx::Connection::connect(&replica).await.ok()?;
                let behind: bool =
                    sqlx::query_scalar("SELECT pg_last_wal_replay_lsn() < $1::pg_lsn")
                        .bind(&at)
                        .fetch_one(&mut c)
                        .await
                        .ok()?;
                (!behind).then_some(())
            },
        )
        .await
    }

    /// Stops the replica's WAL stream: the primary keeps committing, the
    /// replica falls behind (verify with [`Self::lag_bytes`]).
    pub fn freeze_link(&self) {
        self.link.freeze();
    }

    /// `kill -9` of the primary, verified (see [`OwnedPostgres::kill_9`]).
    pub fn kill_primary(&self) {
        tokio::task::block_in_place(|| self.primary.kill_9());
    }

    /// Promotes the replica (`pg_ctl promote`) and waits until it takes
    /// writes (`pg_is_in_recovery()` false).
    pub async fn promote(&self) {
        let data = self.replica.data();
        let out = tokio::task::block_in_place(|| {
            self.replica
                .run("pg_ctl", &["-D", path_str(&data), "-w", "promote"])
        })
        .expect("pg_ctl promote");
        assert!(
            out.status.success(),
            "pg_ctl promote: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.replica.log()
        );
        let url = self.replica_url("postgres");
        crate::wait_for(
            "the promoted replica to leave recovery",
            Duration::from_secs(30),
            || async {
                let in_recovery = scalar_text(&url, "SELECT pg_is_in_recovery()::text")
                    .await
                    .ok()?;
                (in_recovery == "false").then_some(())
            },
        )
        .await
    }

    /// Moves the front to the replica (its connections so far are closed).
    pub fn repoint_front_to_replica(&self) {
        self.front
            .repoint(&format!("127.0.0.1:{}", self.replica.port));
    }

    /// `kill -9` of the primary (verified: the postmaster gone, its port
    /// refusing), the synchronous standby promoted (verified: out of
    /// recovery) and the front moved to it, as a virtual IP follows a
    /// failover. What happened, and how long it took; whether slotgate
    /// carried on there is the caller's to verify.
    pub async fn fail_over(&self) -> String {
        let (old, new) = (self.primary.port, self.replica.port);
        let started = std::time::Instant::now();
        self.kill_primary();
        self.promote().await;
        self.repoint_front_to_replica();
        format!(
            "kill -9 primary {old}; standby {new} promoted and the address {} moved to it after {:.1?}",
            self.front.addr,
            started.elapsed()
        )
    }
}
