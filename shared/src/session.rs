//! The Postgres session: what every connection of a worker or planner tells
//! the server at connect time, and the client-side deadline of each
//! transaction. Together they make sure Postgres cannot hold the fleet:
//!
//! - `lock_timeout`: a statement waiting for a row another session holds
//!   (a stuck transaction on a kind's quota row, an operator's open `psql`
//!   transaction) gives up instead of waiting for as long as the holder
//!   likes; the delivery rolls back and is retried later.
//! - `statement_timeout`: no single statement runs longer than this.
//! - `idle_in_transaction_session_timeout`: the server ends a session that
//!   sits in an open transaction doing nothing (its client froze or lost its
//!   network), releasing the rows it holds.
//! - TCP keepalives (`tcp_keepalives_idle/interval/count`, per session): the
//!   server notices a client that vanished without closing its connection
//!   (half-open) within minutes rather than the kernel's ~2 hours.
//! - The transaction deadline (client side, a tokio timeout): a transaction
//!   whose server went silent (no answer at all, so no server-side timeout
//!   can reach the client) is abandoned after this long.
//!
//! - The pool: `--pg-pool-size` replaces the binary's default number of
//!   connections, and `--pg-acquire-timeout` bounds the wait for one
//!   (including opening it: TCP, TLS handshake and startup), so a Postgres
//!   that does not answer the handshake cannot hold a delivery either.
//!
//! Defaults, bounds and how to tune them: docs/operations.md, "Postgres timeouts and
//! clocks" and "Pool sizes".

use std::time::Duration;

/// The settings of every Postgres session (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::Args)]
pub struct Session {
    /// Postgres lock_timeout of every session: how long a statement waits for a row another session holds.
    #[arg(long = "pg-lock-timeout", global = true, env = "SLOTGATE_PG_LOCK_TIMEOUT", default_value = "2s", value_parser = parse_duration)]
    pub lock_timeout: Duration,
    /// Postgres statement_timeout of every session.
    #[arg(long = "pg-statement-timeout", global = true, env = "SLOTGATE_PG_STATEMENT_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub statement_timeout: Duration,
    /// Postgres idle_in_transaction_session_timeout of every session.
    #[arg(long = "pg-idle-in-transaction-timeout", global = true, env = "SLOTGATE_PG_IDLE_IN_TRANSACTION_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    pub idle_in_transaction_timeout: Duration,
    /// Client-side deadline of every transaction (it is rolled back and retried later).
    #[arg(long = "pg-transaction-deadline", global = true, env = "SLOTGATE_PG_TRANSACTION_DEADLINE", default_value = "15s", value_parser = parse_duration)]
    pub transaction_deadline: Duration,
    /// Postgres tcp_keepalives_idle of every session (whole seconds).
    #[arg(long = "pg-keepalive-idle", global = true, env = "SLOTGATE_PG_KEEPALIVE_IDLE", default_value = "30s", value_parser = parse_duration)]
    pub keepalive_idle: Duration,
    /// Postgres tcp_keepalives_interval of every session (whole seconds).
    #[arg(long = "pg-keepalive-interval", global = true, env = "SLOTGATE_PG_KEEPALIVE_INTERVAL", default_value = "10s", value_parser = parse_duration)]
    pub keepalive_interval: Duration,
    /// Postgres tcp_keepalives_count of every session.
    #[arg(long = "pg-keepalive-count", global = true, env = "SLOTGATE_PG_KEEPALIVE_COUNT", default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub keepalive_count: u32,
    /// Connections in each process's Postgres pool (default: worker --concurrency + 4, planner 4).
    #[arg(id = "pg_pool_size", long = "pg-pool-size", value_name = "N", global = true, env = "SLOTGATE_PG_POOL_SIZE", value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub pool_size: Option<u32>,
    /// Longest wait for a pooled Postgres connection, including connecting (TCP, TLS, startup).
    #[arg(long = "pg-acquire-timeout", global = true, env = "SLOTGATE_PG_ACQUIRE_TIMEOUT", default_value = "5s", value_parser = parse_duration)]
    pub acquire_timeout: Duration,
}

impl Default for Session {
    fn default() -> Self {
        Self {
            lock_timeout: Duration::from_secs(2),
            statement_timeout: Duration::from_secs(10),
            idle_in_transaction_timeout: Duration::from_secs(30),
            transaction_deadline: Duration::from_secs(15),
            keepalive_idle: Duration::from_secs(30),
            keepalive_interval: Duration::from_secs(10),
            keepalive_count: 3,
            pool_size: None,
            acquire_timeout: Duration::from_secs(5),
        }
    }
}

/// A setting outside its bounds; names the flag.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--{flag}: {why}")]
pub struct SessionError {
    /// The flag's name without the leading `--` (`pg-lock-timeout`, …).
    pub flag: &'static str,
    /// What is wrong: the range it is outside, or the flag it must be
    /// shorter than.
    pub why: String,
}

/// Bounds of each duration: `(flag, lowest, highest)`.
const BOUNDS: [(&str, Duration, Duration); 7] = [
    (
        "pg-lock-timeout",
        Duration::from_millis(10),
        Duration::from_secs(600),
    ),
    (
        "pg-statement-timeout",
        Duration::from_millis(100),
        Duration::from_secs(3600),
    ),
    (
        "pg-idle-in-transaction-timeout",
        Duration::from_secs(1),
        Duration::from_secs(3600),
    ),
    (
        "pg-transaction-deadline",
        Duration::from_millis(100),
        Duration::from_secs(3600),
    ),
    (
        "pg-keepalive-idle",
        Duration::from_secs(1),
        Duration::from_secs(7200),
    ),
    (
        "pg-keepalive-interval",
        Duration::from_secs(1),
        Duration::from_secs(600),
    ),
    (
        "pg-acquire-timeout",
        Duration::from_millis(100),
        Duration::from_secs(600),
    ),
];

fn parse_duration(s: &str) -> Result<Duration, String> {
    crate::config::parse_duration(s)
}

fn ms(d: Duration) -> String {
    format!("{}ms", d.as_millis())
}

impl Session {
    fn durations(&self) -> [Duration; 7] {
        [
            self.lock_timeout,
            self.statement_timeout,
            self.idle_in_transaction_timeout,
            self.transaction_deadline,
            self.keepalive_idle,
            self.keepalive_interval,
            self.acquire_timeout,
        ]
    }

    /// Checks the bounds, and that a lock wait ends (`lock_timeout`) before
    /// the statement's and the transaction's own limits would hide it.
    pub fn validate(&self) -> Result<(), SessionError> {
        for ((flag, lo, hi), d) in BOUNDS.iter().zip(self.durations()) {
            if d < *lo || d > *hi {
                return Err(SessionError {
                    flag,
                    why: format!(
                        "{} is outside {}..={}",
                        humantime::format_duration(d),
                        humantime::format_duration(*lo),
                        humantime::format_duration(*hi)
                    ),
                });
            }
        }
        if self.lock_timeout >= self.statement_timeout {
            return Err(SessionError {
                flag: "pg-lock-timeout",
                why: "must be shorter than --pg-statement-timeout".into(),
            });
        }
        if self.lock_timeout >= self.transaction_deadline {
            return Err(SessionError {
                flag: "pg-lock-timeout",
                why: "must be shorter than --pg-transaction-deadline".into(),
            });
        }
        if !(1..=100).contains(&self.keepalive_count) {
            return Err(SessionError {
                flag: "pg-keepalive-count",
                why: format!("{} is outside 1..=100", self.keepalive_count),
            });
        }
        Ok(())
    }

    /// The run-time parameters sent with every connection's startup
    /// message (`PgConnectOptions::options`): no extra round trip.
    pub fn startup_options(&self) -> Vec<(&'static str, String)> {
        vec![
            ("lock_timeout", ms(self.lock_timeout)),
            ("statement_timeout", ms(self.statement_timeout)),
            (
                "idle_in_transaction_session_timeout",
                ms(self.idle_in_transaction_timeout),
            ),
            (
                "tcp_keepalives_idle",
                self.keepalive_idle.as_secs().max(1).to_string(),
            ),
            (
                "tcp_keepalives_interval",
                self.keepalive_interval.as_secs().max(1).to_string(),
            ),
            ("tcp_keepalives_count", self.keepalive_count.to_string()),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_sent_in_milliseconds() {
        let s = Session::default();
        s.validate().unwrap();
        let o = s.startup_options();
        assert!(o.contains(&("lock_timeout", "2000ms".into())));
        assert!(o.contains(&("tcp_keepalives_idle", "30".into())));
    }

    #[test]
    fn bounds_name_the_flag() {
        let s = Session {
            lock_timeout: Duration::from_millis(1),
            ..Session::default()
        };
        assert_eq!(s.validate().unwrap_err().flag, "pg-lock-timeout");
        let s = Session {
            lock_timeout: Duration::from_secs(20),
            ..Session::default()
        };
        assert!(s.validate().unwrap_err().why.contains("shorter"));
        let s = Session {
            keepalive_idle: Duration::from_secs(3 * 3600),
            ..Session::default()
        };
        assert_eq!(s.validate().unwrap_err().flag, "pg-keepalive-idle");
    }
}
