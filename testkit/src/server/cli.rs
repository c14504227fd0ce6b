//! The one way the throwaway Redis topologies run `redis-cli` (Debian's
//! `redis-tools`, installed with `redis-server`): to set them up, to ask
//! them who is primary, and to count what a test did to them.
//!
//! `redis-cli` exits 0 on a server's error reply and prints it on stdout,
//! so whether such a reply is an answer or a failure is the caller's
//! choice ([`ErrorReplies`]): the Cluster's set-up reads some as answers
//! (a node not yet joined), the Sentinel's checks as failures (a refused
//! password must not pass for a reply).

use super::{find_exe, ServerError};
use std::path::Path;
use std::process::Command;

/// What a server's error reply (`ERR …`, `NOAUTH …`, `WRONGPASS …`,
/// `READONLY …`) is to the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorReplies {
    /// Returned as the output, like any reply; only a failing `redis-cli`
    /// is an error.
    Output,
    /// An error ([`ServerError::Step`]) with the reply's text.
    Fail,
}

/// The server `redis-cli` talks to, on 127.0.0.1.
#[derive(Debug, Clone, Copy)]
pub struct CliTarget<'a> {
    /// The server's port on 127.0.0.1.
    pub port: u16,
    /// Sent through the environment (`REDISCLI_AUTH`), not on a command
    /// line `ps` shows.
    pub password: Option<&'a str>,
    /// On TLS: the CA to verify the server's certificate against.
    pub ca: Option<&'a Path>,
}

/// `redis-cli -p <port> <args…>` with no password and no TLS: its standard
/// output, a server's error reply included.
pub fn redis_cli(port: u16, args: &[&str]) -> Result<String, ServerError> {
    let to = CliTarget {
        port,
        password: None,
        ca: None,
    };
    redis_cli_auth(to, ErrorReplies::Output, args)
}

/// `redis-cli` to `to` with `args`: its standard output; a server's error
/// reply as `errors` says.
pub fn redis_cli_auth(
    to: CliTarget<'_>,
    errors: ErrorReplies,
    args: &[&str],
) -> Result<String, ServerError> {
    let cli = find_exe(&["redis-cli"]).ok_or_else(|| ServerError::Missing {
        what: "redis-cli".into(),
        package: "redis-tools".into(),
    })?;
    let mut cmd = Command::new(cli);
    cmd.args(["-h", "127.0.0.1", "-p", &to.port.to_string()]);
    if let Some(ca) = to.ca {
        cmd.arg("--tls").arg("--cacert").arg(ca);
    }
    if let Some(p) = to.password {
        cmd.env("REDISCLI_AUTH", p);
    }
    let out = cmd.args(args).output()?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let refused = errors == ErrorReplies::Fail
        && ["ERR", "NOAUTH", "WRONGPASS", "READONLY"]
            .iter()
            .any(|e| stdout.starts_with(e));
    if !out.status.success() || refused {
        return Err(ServerError::Step {
            step: format!("redis-cli -p {} {}", to.port, args.join(" ")),
            detail: format!("{stdout}{}", String::from_utf8_lossy(&out.stderr)),
        });
    }
    Ok(stdout)
}
