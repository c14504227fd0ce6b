//! Throwaway Postgres and Redis servers, the one way slotgate provisions
//! them: for tests whose faults stop or reconfigure a server (the shared
//! one is never touched) and, through [`crate::services`], for
//! `scripts/with-services` on a machine where none is running. Also a
//! throwaway real WordPress ([`OwnedWordPress`]), for tests and demos that
//! publish to one.
//!
//! Each server lives in a temp directory of its own, on a free port of
//! 127.0.0.1, and goes away with its handle. [`PgPair`] is the one
//! topology of several servers: a Postgres primary with a streaming replica.

mod cli;
mod cluster;
mod postgres;
mod redis;
mod replica;
mod sentinel;
mod wordpress;

pub use cli::{redis_cli, redis_cli_auth, CliTarget, ErrorReplies};
pub use cluster::{command_calls, ClusterNode, OwnedCluster};
pub use postgres::OwnedPostgres;
pub use redis::{answers_ping, spawn_redis, OwnedRedis, TlsRedis};
pub use replica::{PgPair, Replication, SyncLevel, STANDBY_NAME};
pub use sentinel::{
    info_field, DataNode, Election, OwnedSentinel, SentinelAuth, Transport,
    PRIMARY_NAME as SENTINEL_PRIMARY_NAME,
};
pub use wordpress::{OwnedWordPress, WpOp, WpPost, WpTransition};

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A fail-over a topology went through: what happened, in words for a
/// run's log, and whether every step was seen to take hold (a fault that
/// was not verified proves nothing).
#[derive(Debug, Clone)]
pub struct Failover {
    /// The steps and how long they took.
    pub what: String,
    /// Every step verified.
    pub verified: bool,
}

/// Why a throwaway server could not be had.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The server binaries are not installed and could not be installed.
    #[error("{what} not found; install it with: sudo apt-get install {package}")]
    Missing {
        /// The binary looked for.
        what: String,
        /// The Debian package that has it.
        package: String,
    },
    /// A setup step (initdb, chown, …) failed.
    #[error("{step} failed: {detail}")]
    Step {
        /// The step.
        step: String,
        /// What it printed or why it failed.
        detail: String,
    },
    /// The server did not come up on any of the ports tried.
    #[error("{what} did not start; its log:\n{log}")]
    Start {
        /// The server.
        what: String,
        /// Its log, for the reader of the test's failure.
        log: String,
    },
    #[error("{0}")]
    /// Reading or writing a server's files failed.
    Io(#[from] std::io::Error),
}

/// Ports are picked from 21000..29000: below Linux's ephemeral range
/// (32768..60999), where an outgoing connection can hold a port that no
/// listener shows and the server's bind would fail.
const PORTS: std::ops::Range<u16> = 21000..29000;

/// How many ports a server start tries before it gives up (a port may be
/// taken between the check and the server's bind).
const START_TRIES: usize = 5;

/// A port of `PORTS` nothing listens on right now, from a random start so
/// that concurrent callers rarely pick the same one.
pub fn pick_port() -> u16 {
    let span = PORTS.end - PORTS.start;
    let start = (uuid::Uuid::new_v4().as_u128() % u128::from(span)) as u16;
    (0..span)
        .map(|i| PORTS.start + (start + i) % span)
        .find(|p| std::net::TcpListener::bind(("127.0.0.1", *p)).is_ok())
        .expect("a free port in 21000..29000")
}

/// The first of `names` found on PATH or in /usr/sbin, /usr/bin (mariadbd
/// is in /usr/sbin, which a user's PATH may lack).
pub(crate) fn find_exe(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let dirs: Vec<PathBuf> = std::env::split_paths(&path)
        .chain(["/usr/sbin", "/usr/bin"].map(PathBuf::from))
        .collect();
    names
        .iter()
        .flat_map(|n| dirs.iter().map(move |d| d.join(n)))
        .find(|p| p.is_file())
}

pub(crate) fn path_str(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 temp path")
}

pub(crate) fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// A fresh directory under /tmp (short, for Postgres's socket path, and
/// reachable by the `postgres` user), readable by everyone.
pub(crate) fn temp_dir(tag: &str) -> Result<PathBuf, ServerError> {
    let base = std::env::temp_dir();
    let base = if base.as_os_str().len() > 60 || is_root() {
        PathBuf::from("/tmp")
    } else {
        base
    };
    let dir = base.join(format!(
        "slotgate-{tag}-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..10]
    ));
    std::fs::create_dir_all(&dir)?;
    chmod(&dir, "755")?;
    Ok(dir)
}

fn chmod(path: &Path, mode: &str) -> Result<(), ServerError> {
    checked(Command::new("chmod").arg(mode).arg(path), "chmod")
}

/// Runs `cmd` to completion; its stderr in the error unless it exited 0.
pub(crate) fn checked(cmd: &mut Command, step: &str) -> Result<(), ServerError> {
    let out = cmd.stdin(Stdio::null()).output()?;
    if out.status.success() {
        return Ok(());
    }
    Err(ServerError::Step {
        step: step.to_owned(),
        detail: format!(
            "{} {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ),
    })
}

/// Installs `package` (one, or several separated by spaces) with apt-get
/// when we are root and it is there (a fresh CI machine); otherwise says
/// what to install.
pub(crate) fn install(what: &str, package: &str) -> Result<(), ServerError> {
    let missing = || ServerError::Missing {
        what: what.to_owned(),
        package: package.to_owned(),
    };
    if !is_root() || Command::new("apt-get").arg("--version").output().is_err() {
        return Err(missing());
    }
    eprintln!("services: installing {package} with apt-get");
    let apt = |args: &[&str]| {
        Command::new("apt-get")
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    let install: Vec<&str> = ["install", "-y", "-q"]
        .into_iter()
        .chain(package.split_whitespace())
        .collect();
    if apt(&["update", "-q"]) && apt(&install) {
        Ok(())
    } else {
        Err(missing())
    }
}

/// `path`'s text, or a note that there is none (for error messages).
pub(crate) fn log_of(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| format!("({}: {e})", path.display()))
}

/// Polls `ok` every 100 ms until it holds, within `within`; otherwise a
/// [`ServerError::Step`] saying what was waited for. For the multi-server
/// topologies' set-up and healing, which have no single process to watch.
pub(crate) fn poll_until(
    what: &str,
    within: std::time::Duration,
    ok: impl Fn() -> bool,
) -> Result<(), ServerError> {
    let deadline = std::time::Instant::now() + within;
    while std::time::Instant::now() < deadline {
        if ok() {
            return Ok(());
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    Err(ServerError::Step {
        step: format!("waiting for {what}"),
        detail: format!("not within {within:?}"),
    })
}
