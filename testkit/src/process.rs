//! Child processes of the real binaries, killed when dropped.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// A running child, killed (SIGKILL) on drop if still alive.
pub struct Proc {
    pub name: String,
    pub child: Child,
    pub log: PathBuf,
}

impl Proc {
    /// Starts `bin args` with `envs`, stderr+stdout to a log file in `dir`.
    pub fn spawn(name: &str, bin: &Path, args: &[&str], envs: &[(&str, &str)], dir: &Path) -> Proc {
        let log = dir.join(format!("{name}.log"));
        let out = std::fs::File::create(&log).expect("log file");
        let child = Command::new(bin)
            .args(args)
            .env("RUST_LOG", "info,sqlx=warn")
            .envs(envs.iter().copied())
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("dup"))
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", bin.display()));
        Proc {
            name: name.into(),
            child,
            log,
        }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.pid().to_string())
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        assert!(ok, "kill -{sig} {}", self.pid());
    }

    /// Waits up to `timeout` for exit; `None` if still running.
    pub fn wait_timeout(
        &mut self,
        timeout: std::time::Duration,
    ) -> Option<std::process::ExitStatus> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if let Ok(Some(s)) = self.child.try_wait() {
                return Some(s);
            }
            if std::time::Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A Postgres server owned by one test, for faults that must stop the server
/// itself (the shared one is never stopped). Postgres refuses to run as root,
/// so as root it runs as the `postgres` user.
pub struct OwnedPostgres {
    dir: PathBuf,
    bin: PathBuf,
    pub port: u16,
    /// Extra `-c name=value` server settings (e.g. `ssl=on`).
    settings: Vec<(String, String)>,
}

fn pg_bin() -> PathBuf {
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.path().join("bin"))
                .filter(|p| p.join("pg_ctl").exists())
                .collect()
        })
        .unwrap_or_default();
    versions.sort_by_key(|p| {
        p.parent()
            .and_then(|v| v.file_name())
            .and_then(|v| v.to_str())
            .and_then(|v| v.parse::<u32>().ok())
            .unwrap_or(0)
    });
    versions.pop().expect(
        "PostgreSQL server binaries under /usr/lib/postgresql/*/bin (apt-get install postgresql)",
    )
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

impl OwnedPostgres {
    fn run(&self, tool: &str, args: &[&str]) -> std::process::Output {
        let exe = self.bin.join(tool);
        let mut cmd = if is_root() {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(&exe);
            c
        } else {
            Command::new(&exe)
        };
        cmd.args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("{tool}: {e}"))
    }

    pub fn start() -> OwnedPostgres {
        Self::start_with(&[])
    }

    /// Starts a server with extra settings (`-c name=value` each).
    pub fn start_with(settings: &[(&str, &str)]) -> OwnedPostgres {
        let dir = std::env::temp_dir().join(format!(
            "slotgate-pg-{}-{}",
            std::process::id(),
            free_port()
        ));
        std::fs::create_dir_all(&dir).expect("pg dir");
        let pg = OwnedPostgres {
            bin: pg_bin(),
            port: free_port(),
            dir,
            settings: settings
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        };
        if is_root() {
            let ok = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(&pg.dir)
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
            assert!(ok, "chown the test Postgres directory to postgres");
            let _ = Command::new("chmod").arg("755").arg(&pg.dir).status();
        }
        let data = pg.dir.join("data");
        let out = pg.run(
            "initdb",
            &[
                "-D",
                data.to_str().unwrap(),
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--locale=C",
            ],
        );
        assert!(
            out.status.success(),
            "initdb: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        pg.pg_start();
        pg
    }

    fn pg_start(&self) {
        let data = self.dir.join("data");
        let log = self.dir.join("postgres.log");
        let mut opts = format!("-c listen_addresses=127.0.0.1 -c port={} -c unix_socket_directories={} -c fsync=off -c max_connections=200", self.port, self.dir.display());
        for (k, v) in &self.settings {
            opts.push_str(&format!(" -c {k}={v}"));
        }
        let out = self.run(
            "pg_ctl",
            &[
                "-D",
                data.to_str().unwrap(),
                "-l",
                log.to_str().unwrap(),
                "-o",
                &opts,
                "-w",
                "start",
            ],
        );
        assert!(
            out.status.success(),
            "pg_ctl start: {} {}",
            String::from_utf8_lossy(&out.stderr),
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    }

    /// `pg_ctl stop -m immediate`: connections drop, as in a crash.
    fn pg_stop(&self) -> std::process::Output {
        let data = self.dir.join("data");
        self.run(
            "pg_ctl",
            &[
                "-D",
                data.to_str().unwrap(),
                "-m",
                "immediate",
                "-w",
                "stop",
            ],
        )
    }

    /// Stops the server at once (connections drop, like a crash).
    pub fn stop(&self) {
        let out = self.pg_stop();
        assert!(
            out.status.success(),
            "pg_ctl stop: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Starts it again on the same port.
    pub fn restart(&self) {
        self.pg_start();
    }

    /// URL of database `db` on this server.
    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }
}

impl Drop for OwnedPostgres {
    fn drop(&mut self) {
        let _ = self.pg_stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A `redis-server` of the test's own on 127.0.0.1, keeping nothing on
/// disk, with `args` (its port settings) added; killed on drop.
pub fn own_redis(name: &str, dir: &Path, args: &[&str]) -> Proc {
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
    Proc::spawn(name, Path::new("redis-server"), &all, &[], dir)
}

/// Runs `bin args` with `envs` to completion and returns its stdout;
/// panics with its stderr unless it exited 0.
pub fn run_ok(bin: &Path, args: &[&str], envs: &[(&str, &str)]) -> String {
    let out = Command::new(bin)
        .args(args)
        .envs(envs.iter().copied())
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", bin.display()));
    assert!(
        out.status.success(),
        "{} {args:?}: {}",
        bin.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Where the workspace's binaries are, from one of them
/// (`env!("CARGO_BIN_EXE_worker")` in the worker's tests).
pub fn sibling(bin: &Path, name: &str) -> PathBuf {
    bin.with_file_name(name)
}
