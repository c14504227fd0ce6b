//! What the connected server says about its own durability: does it take
//! writes at all (a standby in recovery does not), and does a commit wait
//! for a standby before it returns? The gate row is only as good as the
//! primary's memory: with asynchronous replication a failover goes without
//! the last committed gate rows, and a duplicate delivery of such a slot
//! then passes the gate (measured: docs/production.md, "Postgres high availability";
//! DESIGN 4.20). `planner check` and the worker say so.

use super::StoreError;
use sqlx::postgres::PgPool;

// ---------------------------------------------------------------- replication

/// The server's answers, as one statement reads them (its columns are
/// named as the fields).
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct ServerRole {
    /// `pg_is_in_recovery()`: a standby, which takes no writes.
    pub in_recovery: bool,
    /// A new transaction is read-only (`default_transaction_read_only`,
    /// or recovery).
    pub read_only: bool,
    /// `synchronous_commit` of this session.
    pub synchronous_commit: String,
    /// `synchronous_standby_names`: empty means no commit waits for a
    /// standby.
    pub synchronous_standby_names: String,
    /// Standbys `pg_stat_replication` shows as `sync` or `quorum` now.
    pub sync_standbys: i64,
    /// Standbys whose state this role may not see (it lacks
    /// `pg_read_all_stats`): their `sync_state` reads as NULL.
    pub hidden_standbys: i64,
}

/// Reads [`ServerRole`] (one round trip; no table is touched).
pub async fn server_role(pool: &PgPool) -> Result<ServerRole, StoreError> {
    sqlx::query_as(
        "SELECT pg_is_in_recovery() AS in_recovery,
                current_setting('transaction_read_only') = 'on' AS read_only,
                current_setting('synchronous_commit') AS synchronous_commit,
                current_setting('synchronous_standby_names') AS synchronous_standby_names,
                (SELECT count(*) FROM pg_stat_replication WHERE sync_state IN ('sync', 'quorum')) AS sync_standbys,
                (SELECT count(*) FROM pg_stat_replication WHERE sync_state IS NULL) AS hidden_standbys",
    )
    .fetch_one(pool)
    .await
}

/// What a server's role means for the gate: whether it can be written at
/// all, and whether a commit it acknowledged survives its loss.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Durability {
    /// A standby in recovery (hot standby): every write fails with SQLSTATE
    /// 25006. Nothing can be recorded here until it is promoted or the
    /// address leads to the primary again.
    Standby,
    /// A primary whose transactions are read-only by default
    /// (`default_transaction_read_only = on`): writes fail with 25006 too.
    ReadOnly,
    /// Every commit waits until at least one standby has confirmed it at
    /// `level` (`on`, `remote_apply`, `remote_write`): a failover to that
    /// standby loses no acknowledged gate row.
    Synchronous {
        /// `synchronous_commit`.
        level: String,
        /// Standbys confirming now.
        standbys: i64,
    },
    /// Standbys are named and commits wait for them, but none is connected
    /// as `sync` or `quorum`: commits hang until one is.
    StandbyAwaited {
        /// `synchronous_standby_names`.
        names: String,
    },
    /// Commits wait for standbys named in `synchronous_standby_names`, but
    /// this role may not see whether one is connected.
    Unverified {
        /// `synchronous_standby_names`.
        names: String,
    },
    /// A commit returns before any standby has it: a failover can lose the
    /// last acknowledged gate rows, and a duplicate of such a slot then runs
    /// again.
    Asynchronous(Asynchronous),
}

/// Why commits do not wait for a standby.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Asynchronous {
    /// `synchronous_standby_names` is empty (Postgres's default).
    NoStandbyNamed,
    /// `synchronous_commit` is `off` or `local`: commits do not wait even
    /// for the standbys named.
    CommitDoesNotWait(String),
}

impl ServerRole {
    /// Judges the answers.
    pub fn durability(&self) -> Durability {
        if self.in_recovery {
            return Durability::Standby;
        }
        if self.read_only {
            return Durability::ReadOnly;
        }
        let names = self.synchronous_standby_names.trim();
        if names.is_empty() {
            return Durability::Asynchronous(Asynchronous::NoStandbyNamed);
        }
        if matches!(self.synchronous_commit.as_str(), "off" | "local") {
            return Durability::Asynchronous(Asynchronous::CommitDoesNotWait(
                self.synchronous_commit.clone(),
            ));
        }
        if self.sync_standbys > 0 {
            return Durability::Synchronous {
                level: self.synchronous_commit.clone(),
                standbys: self.sync_standbys,
            };
        }
        if self.hidden_standbys > 0 {
            return Durability::Unverified {
                names: names.to_owned(),
            };
        }
        Durability::StandbyAwaited {
            names: names.to_owned(),
        }
    }
}

impl Durability {
    /// The server takes writes (a primary, not read-only).
    pub fn writable(&self) -> bool {
        !matches!(self, Durability::Standby | Durability::ReadOnly)
    }

    /// What an operator should know, `None` when all is well. One sentence
    /// each, naming the setting to change.
    pub fn warning(&self) -> Option<String> {
        match self {
            Durability::Synchronous { .. } => None,
            Durability::Standby => Some(
                "the server is a standby in recovery (pg_is_in_recovery): it takes no writes; \
                 point DATABASE_URL at the primary"
                    .into(),
            ),
            Durability::ReadOnly => Some(
                "the server's transactions are read-only (default_transaction_read_only = on): \
                 nothing can be recorded"
                    .into(),
            ),
            Durability::Asynchronous(why) => {
                let why = match why {
                    Asynchronous::NoStandbyNamed => "synchronous_standby_names is empty".to_owned(),
                    Asynchronous::CommitDoesNotWait(level) => {
                        format!("synchronous_commit = {level}")
                    }
                };
                Some(format!(
                    "the primary has no synchronous standby ({why}): a failover to an \
                     asynchronous replica can lose the last committed gate rows, and a duplicate \
                     delivery of such a slot then runs again; set synchronous_standby_names and \
                     synchronous_commit = on or remote_apply (docs/production.md, \"Postgres high availability\")"
                ))
            }
            Durability::StandbyAwaited { names } => Some(format!(
                "synchronous_standby_names = '{names}' but no such standby is connected: every \
                 commit waits until one is"
            )),
            Durability::Unverified { names } => Some(format!(
                "synchronous_standby_names = '{names}', but this role cannot see whether a \
                 synchronous standby is connected (grant it pg_read_all_stats to check)"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn role(names: &str, commit: &str, sync: i64, hidden: i64) -> ServerRole {
        ServerRole {
            in_recovery: false,
            read_only: false,
            synchronous_commit: commit.into(),
            synchronous_standby_names: names.into(),
            sync_standbys: sync,
            hidden_standbys: hidden,
        }
    }

    #[test]
    fn only_a_connected_synchronous_standby_with_waiting_commits_is_durable() {
        assert_eq!(
            role("", "on", 0, 0).durability(),
            Durability::Asynchronous(Asynchronous::NoStandbyNamed)
        );
        assert_eq!(
            role("replica", "local", 1, 0).durability(),
            Durability::Asynchronous(Asynchronous::CommitDoesNotWait("local".into()))
        );
        assert_eq!(
            role("replica", "remote_apply", 1, 0).durability(),
            Durability::Synchronous {
                level: "remote_apply".into(),
                standbys: 1
            }
        );
        assert!(role("replica", "on", 1, 0).durability().warning().is_none());
        assert_eq!(
            role("replica", "on", 0, 0).durability(),
            Durability::StandbyAwaited {
                names: "replica".into()
            }
        );
        assert_eq!(
            role("replica", "on", 0, 1).durability(),
            Durability::Unverified {
                names: "replica".into()
            }
        );
        let standby = ServerRole {
            in_recovery: true,
            read_only: true,
            ..role("", "on", 0, 0)
        };
        assert_eq!(standby.durability(), Durability::Standby);
        assert!(!standby.durability().writable());
        assert!(role("", "on", 0, 0).durability().writable());
        assert!(role("", "on", 0, 0)
            .durability()
            .warning()
            .unwrap()
            .contains("synchronous_standby_names is empty"));
    }
}
