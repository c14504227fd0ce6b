//! A Postgres server of one owner (a test, or `scripts/with-services`),
//! started with the installed server binaries. Postgres refuses to run as
//! root, so as root it runs as the `postgres` system user (created when
//! missing).

use super::{
    checked, install, is_root, log_of, path_str, pick_port, temp_dir, ServerError, START_TRIES,
};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// Settings every throwaway server runs with: durability is not wanted of
/// a server that is thrown away, and the whole suite shares one.
const SETTINGS: &[(&str, &str)] = &[
    ("listen_addresses", "127.0.0.1"),
    ("fsync", "off"),
    ("max_connections", "300"),
];

/// A running Postgres on 127.0.0.1:`port`, in a temp directory of its own;
/// stopped (immediately) and removed on drop.
pub struct OwnedPostgres {
    dir: PathBuf,
    bin: PathBuf,
    /// The server's port on 127.0.0.1.
    pub port: u16,
    /// Extra `-c name=value` server settings (e.g. `ssl=on`).
    settings: Vec<(String, String)>,
}

/// The newest `/usr/lib/postgresql/<version>/bin` with a `pg_ctl`.
fn newest_bin() -> Option<PathBuf> {
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let v = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("pg_ctl").exists().then_some((v, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, b)| b)
}

/// The server binaries, installed first when missing and allowed.
fn server_bin() -> Result<PathBuf, ServerError> {
    if let Some(b) = newest_bin() {
        return Ok(b);
    }
    install(
        "PostgreSQL server binaries (/usr/lib/postgresql/*/bin)",
        "postgresql",
    )?;
    newest_bin().ok_or_else(|| ServerError::Missing {
        what: "PostgreSQL server binaries after installing".into(),
        package: "postgresql".into(),
    })
}

/// As root: the `postgres` user, created when missing.
fn ensure_postgres_user() -> Result<(), ServerError> {
    if Command::new("id")
        .args(["-u", "postgres"])
        .output()?
        .status
        .success()
    {
        return Ok(());
    }
    checked(
        Command::new("useradd").args([
            "--system",
            "--home",
            "/nonexistent",
            "--no-create-home",
            "--shell",
            "/usr/sbin/nologin",
            "postgres",
        ]),
        "useradd postgres",
    )
}

impl OwnedPostgres {
    /// Starts a server; panics if it cannot (a test's set-up).
    pub fn start() -> OwnedPostgres {
        Self::start_with(&[])
    }

    /// Starts a server with extra settings (`-c name=value` each); panics if
    /// it cannot.
    pub fn start_with(settings: &[(&str, &str)]) -> OwnedPostgres {
        Self::launch(settings).unwrap_or_else(|e| panic!("throwaway Postgres: {e}"))
    }

    /// Starts a server with extra settings: initdb, then `pg_ctl start` on a
    /// free port, another port if the bind lost a race.
    pub fn launch(settings: &[(&str, &str)]) -> Result<OwnedPostgres, ServerError> {
        let mut pg = Self::unstarted(settings)?;
        let data = pg.data();
        let out = pg.run(
            "initdb",
            &[
                "-D",
                path_str(&data),
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--locale=C",
            ],
        )?;
        if !out.status.success() {
            return Err(ServerError::Step {
                step: "initdb".into(),
                detail: String::from_utf8_lossy(&out.stderr).into_owned(),
            });
        }
        pg.start_on_a_free_port()?;
        Ok(pg)
    }

    /// An owner for a data directory to be filled by the caller (a base
    /// backup): `dir` is new, owned by the server's user, nothing runs yet.
    pub(super) fn unstarted(settings: &[(&str, &str)]) -> Result<OwnedPostgres, ServerError> {
        let bin = server_bin()?;
        if is_root() {
            ensure_postgres_user()?;
        }
        let dir = temp_dir("pg")?;
        if is_root() {
            checked(
                Command::new("chown")
                    .args(["-R", "postgres:postgres"])
                    .arg(&dir),
                "chown the Postgres directory to postgres",
            )?;
        }
        Ok(OwnedPostgres {
            bin,
            port: 0,
            dir,
            settings: SETTINGS
                .iter()
                .chain(settings)
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        })
    }

    /// `pg_ctl start` on a free port, another port if the bind lost a race.
    pub(super) fn start_on_a_free_port(&mut self) -> Result<(), ServerError> {
        let data = self.data();
        for _ in 0..START_TRIES {
            self.port = pick_port();
            if self.pg_start()?.status.success() {
                return Ok(());
            }
            if data.join("postmaster.pid").exists() {
                break; // a postmaster runs: not a port problem
            }
        }
        Err(ServerError::Start {
            what: "postgres".into(),
            log: log_of(&self.dir.join("postgres.log")),
        })
    }

    /// Its data directory.
    pub fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// Runs a server tool as the server's user.
    ///
    /// Under libfaketime (`scripts/at-hour`) the tool gets no
    /// `FAKETIME_SHARED`: that variable names the semaphore of a root
    /// process, mode 0600, which the `postgres` user cannot open. libfaketime
    /// then makes one of its own named by the tool's pid, and when a process
    /// killed earlier left that name behind in /dev/shm (pids are reused), it
    /// ends the tool ("sem_open failed and recreation attempts failed: Permission
    /// denied"; a CI run's initdb did). Without the variable a tool that finds
    /// its name taken runs without the semaphore, which a plain offset never
    /// uses.
    pub(super) fn run(&self, tool: &str, args: &[&str]) -> std::io::Result<Output> {
        let exe = self.bin.join(tool);
        let mut cmd = if is_root() {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"])
                .arg(&exe)
                .env_remove("FAKETIME_SHARED");
            c
        } else {
            Command::new(&exe)
        };
        cmd.args(args)
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .output()
    }

    fn pg_start(&self) -> std::io::Result<Output> {
        let log = self.dir.join("postgres.log");
        let mut opts = format!(
            "-c port={} -c unix_socket_directories={}",
            self.port,
            self.dir.display()
        );
        for (k, v) in &self.settings {
            opts.push_str(&format!(" -c {k}={v}"));
        }
        self.run(
            "pg_ctl",
            &[
                "-D",
                path_str(&self.data()),
                "-l",
                path_str(&log),
                "-o",
                &opts,
                "-w",
                "-t",
                "60",
                "start",
            ],
        )
    }

    /// `pg_ctl stop -m immediate`: connections drop, as in a crash.
    fn pg_stop(&self) -> std::io::Result<Output> {
        self.run(
            "pg_ctl",
            &[
                "-D",
                path_str(&self.data()),
                "-m",
                "immediate",
                "-w",
                "stop",
            ],
        )
    }

    /// Stops the server at once (connections drop, like a crash).
    pub fn stop(&self) {
        let out = self.pg_stop().expect("pg_ctl");
        assert!(
            out.status.success(),
            "pg_ctl stop: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Starts it again on the same port.
    pub fn restart(&self) {
        let out = self.pg_start().expect("pg_ctl");
        assert!(
            out.status.success(),
            "pg_ctl start: {}",
            log_of(&self.dir.join("postgres.log"))
        );
    }

    /// Its server log so far (for a test's failure message).
    pub fn log(&self) -> String {
        log_of(&self.dir.join("postgres.log"))
    }

    /// The postmaster's pid, from `postmaster.pid`; `None` when it is not
    /// running.
    pub fn postmaster_pid(&self) -> Option<i32> {
        std::fs::read_to_string(self.data().join("postmaster.pid"))
            .ok()?
            .lines()
            .next()?
            .trim()
            .parse()
            .ok()
    }

    /// `kill -9` of the whole server at once: the postmaster and every
    /// backend (they share the process group `pg_ctl` started the postmaster
    /// in), as when its machine dies: no shutdown checkpoint, no goodbye to
    /// clients or standbys. Verified: returns once the postmaster is gone
    /// (or a zombie) and the port refuses connections; panics otherwise.
    pub fn kill_9(&self) {
        let pid = self
            .postmaster_pid()
            .expect("a running postmaster (postmaster.pid)");
        nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap_or_else(|e| panic!("kill -9 -{pid} (the postmaster's group): {e}"));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let dead = match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
                Err(_) => true,
                Ok(stat) => stat
                    .rsplit_once(')')
                    .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
            };
            let refused = std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err();
            if dead && refused {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "postmaster {pid} still alive (or its port {} still open) 10 s after kill -9",
                self.port
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// URL of database `db` on this server.
    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }

    /// Its directory (data, socket, log).
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for OwnedPostgres {
    fn drop(&mut self) {
        let _ = self.pg_stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use super::{is_root, OwnedPostgres};

    /// The rule of [`OwnedPostgres::run`]: root's `FAKETIME_SHARED` does not
    /// reach the server's user. Read where it would end up, in the
    /// postmaster's environment as it was started.
    #[test]
    fn the_server_s_user_gets_no_faketime_semaphore_of_root_s() {
        if !is_root() {
            eprintln!("skipped: not root, so the server runs as this user");
            return;
        }
        // Under scripts/at-hour the variable is set already (and in use: it
        // stays); otherwise a name no process holds.
        if std::env::var_os("FAKETIME_SHARED").is_none() {
            std::env::set_var("FAKETIME_SHARED", "/faketime_sem_0 /faketime_shm_0");
        }
        let pg = OwnedPostgres::start();
        let pid = pg.postmaster_pid().expect("a running postmaster");
        let environ = std::fs::read(format!("/proc/{pid}/environ")).expect("its environment");
        let names: Vec<String> = environ
            .split(|b| *b == 0)
            .filter_map(|kv| kv.split(|b| *b == b'=').next())
            .map(|k| String::from_utf8_lossy(k).into_owned())
            .collect();
        assert!(
            names.iter().any(|k| k == "PATH"),
            "the postmaster's environment was read: {names:?}"
        );
        assert!(
            !names.iter().any(|k| k == "FAKETIME_SHARED"),
            "the postmaster got FAKETIME_SHARED: {names:?}"
        );
    }
}
