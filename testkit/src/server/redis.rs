//! A `redis-server` of one owner (a test, or `scripts/with-services`),
//! keeping nothing on disk, run as a child process so that it goes away
//! with its owner; and [`TlsRedis`], one that speaks only TLS.

use super::{find_exe, install, log_of, pick_port, temp_dir, ServerError, START_TRIES};
use crate::process::Proc;
use crate::tls::TestCa;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How long a fresh server has to answer PING.
const READY_WITHIN: Duration = Duration::from_secs(10);

/// A running Redis on 127.0.0.1:`port`; killed on drop.
pub struct OwnedRedis {
    /// The server's port on 127.0.0.1.
    pub port: u16,
    /// The `redis-server` process (stopped on drop).
    pub proc: Proc,
    dir: PathBuf,
    /// Starts that have run here (each log is kept apart).
    starts: u32,
}

/// `redis-server`, installed first when missing and allowed.
fn server_exe() -> Result<PathBuf, ServerError> {
    let found = || find_exe(&["redis-server"]);
    if let Some(p) = found() {
        return Ok(p);
    }
    install("redis-server", "redis-server")?;
    found().ok_or_else(|| ServerError::Missing {
        what: "redis-server after installing".into(),
        package: "redis-server".into(),
    })
}

/// Starts `redis-server` on 127.0.0.1 with nothing on disk, `args` (its
/// port settings) added, its log `<dir>/<name>.log`. Not waited for.
pub fn spawn_redis(name: &str, dir: &Path, args: &[&str]) -> Result<Proc, ServerError> {
    let exe = server_exe()?;
    let dir_s = dir.to_str().expect("utf-8 dir");
    let mut all = vec![
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--dir",
        dir_s,
    ];
    all.extend_from_slice(args);
    Ok(Proc::spawn(name, &exe, &all, &[], dir))
}

/// Does a Redis answer PING on 127.0.0.1:`port`?
pub fn answers_ping(port: u16) -> bool {
    let ask = || -> std::io::Result<bool> {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
        s.set_read_timeout(Some(Duration::from_secs(1)))?;
        s.write_all(b"PING\r\n")?;
        let mut buf = [0u8; 7];
        s.read_exact(&mut buf)?;
        Ok(&buf == b"+PONG\r\n")
    };
    ask().unwrap_or(false)
}

impl OwnedRedis {
    /// Starts a server on a free port; panics if it cannot (a test's set-up).
    pub fn start() -> OwnedRedis {
        Self::launch().unwrap_or_else(|e| panic!("throwaway Redis: {e}"))
    }

    /// Starts a server on a free port and waits until it answers PING;
    /// another port if the bind lost a race.
    pub fn launch() -> Result<OwnedRedis, ServerError> {
        let dir = temp_dir("redis")?;
        let mut last = None;
        for _ in 0..START_TRIES {
            let port = pick_port();
            let mut r = OwnedRedis {
                port,
                proc: spawn_redis("redis-0", &dir, &["--port", &port.to_string()])?,
                dir: dir.clone(),
                starts: 1,
            };
            if r.wait_ready() {
                return Ok(r);
            }
            last = Some(r.proc.log_text());
        }
        Err(ServerError::Start {
            what: "redis-server".into(),
            log: last.unwrap_or_default(),
        })
    }

    /// Waits until this server (not another one on its port: ours must be
    /// running) answers PING; false if it exited or never answered.
    fn wait_ready(&mut self) -> bool {
        let deadline = Instant::now() + READY_WITHIN;
        while Instant::now() < deadline {
            if self.proc.exited().is_some() {
                return false;
            }
            if answers_ping(self.port) {
                return self.proc.exited().is_none();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// `kill -9` of the server (verified): Redis lost, with everything in it.
    pub fn kill_9(&mut self) {
        if let Err(st) = self.proc.kill_9() {
            panic!("redis-server had exited by itself: {st}");
        }
    }

    /// A new, empty server on the same port, answering PING.
    pub fn restart(&mut self) {
        let name = format!("redis-{}", self.starts);
        self.starts += 1;
        self.proc = spawn_redis(&name, &self.dir, &["--port", &self.port.to_string()])
            .unwrap_or_else(|e| panic!("throwaway Redis: {e}"));
        assert!(
            self.wait_ready(),
            "redis-server did not come back on {}: {}",
            self.port,
            log_of(&self.dir.join(format!("{name}.log")))
        );
    }

    /// `redis://127.0.0.1:<port>/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }
}

impl Drop for OwnedRedis {
    fn drop(&mut self) {
        let _ = self.proc.kill_9();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A `redis-server` of the test's own that speaks only TLS (`--port 0`),
/// with the certificate of `ca`; killed on drop.
pub struct TlsRedis {
    /// The TLS port on 127.0.0.1.
    pub port: u16,
    /// The `redis-server` process (stopped on drop).
    pub proc: Proc,
}

impl TlsRedis {
    /// Starts `redis-server` speaking only TLS, with a certificate from `ca`, its files in `dir`.
    pub fn start(ca: &TestCa, dir: &Path) -> TlsRedis {
        let port = pick_port();
        let port_s = port.to_string();
        let proc = spawn_redis(
            "redis-tls",
            dir,
            &[
                "--port",
                "0",
                "--tls-port",
                &port_s,
                "--tls-cert-file",
                ca.server_cert.to_str().unwrap(),
                "--tls-key-file",
                ca.server_key.to_str().unwrap(),
                "--tls-ca-cert-file",
                ca.ca.to_str().unwrap(),
                "--tls-auth-clients",
                "no",
            ],
        )
        .expect("redis-server");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "TLS redis-server did not listen: {}",
                proc.log_text()
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        TlsRedis { port, proc }
    }

    /// `rediss://127.0.0.1:<port>/` (the certificate names the IP).
    pub fn url(&self) -> String {
        format!("rediss://127.0.0.1:{}/", self.port)
    }
}
