//! The one process harness: the slotgate binaries (and the throwaway
//! servers of [`crate::server`]) as child processes of a test, a benchmark
//! or the chaos suite. Every fault those inject — `kill -9`, SIGSTOP,
//! SIGTERM — goes through here, and each is verified (the exit status says
//! SIGKILL, the process state says stopped), so a fault that did not happen
//! cannot pass for one that did.

use nix::sys::signal::Signal;
use nix::unistd::Pid;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

/// How often the harness looks again while it waits for a process.
const POLL: Duration = Duration::from_millis(20);

/// A running child, its stdout and stderr in one log file; killed (SIGKILL)
/// on drop if still alive, so a failing test leaves nothing behind.
pub struct Proc {
    /// What the test calls the process (its log's name).
    pub name: String,
    /// The child process.
    pub child: Child,
    /// Where its stdout and stderr go.
    pub log: PathBuf,
}

impl Proc {
    /// Starts `bin args` with `envs`, stderr+stdout to `<dir>/<name>.log`.
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

    /// The process id, for signals.
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Everything the process has written so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Sends `sig` (`"TERM"`, `"STOP"`, `"CONT"`, `"KILL"`, …); panics if it
    /// cannot be sent, since a test whose fault was never injected proves
    /// nothing.
    pub fn signal(&self, sig: &str) {
        self.try_signal(sig)
            .unwrap_or_else(|e| panic!("kill -{sig} {}: {e}", self.pid()));
    }

    /// Sends `sig` (`"TERM"`, `"STOP"`, …); the error if it could not be sent.
    pub fn try_signal(&self, sig: &str) -> std::io::Result<()> {
        let s: Signal = format!("SIG{sig}").parse().map_err(std::io::Error::from)?;
        nix::sys::signal::kill(Pid::from_raw(self.pid()), s).map_err(std::io::Error::from)
    }

    /// Sends `sig`, ignoring a process that is already gone.
    fn send(&self, sig: Signal) {
        let _ = nix::sys::signal::kill(Pid::from_raw(self.pid()), sig);
    }

    /// Its exit status if it has exited, `None` while it runs.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Waits up to `timeout` for exit; `None` if still running.
    pub fn wait_timeout(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(s) = self.exited() {
                return Some(s);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(POLL);
        }
    }

    /// `kill -9`, then waits for the exit. `Ok` with the status when the
    /// kill is what ended it; `Err` with the status when the process had
    /// already exited by itself (that is not a kill).
    pub fn kill_9(&mut self) -> Result<ExitStatus, ExitStatus> {
        if let Some(st) = self.exited() {
            return Err(st);
        }
        self.send(Signal::SIGKILL);
        let st = self.child.wait().expect("wait for a killed child");
        if st.signal() == Some(Signal::SIGKILL as i32) {
            Ok(st)
        } else {
            Err(st)
        }
    }

    /// SIGSTOP, then waits (up to 5 s) until the kernel reports it stopped
    /// (state `T`); false if it never did.
    pub fn pause(&self) -> bool {
        self.send(Signal::SIGSTOP);
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if self.state() == Some('T') {
                return true;
            }
            std::thread::sleep(POLL);
        }
        false
    }

    /// SIGCONT (after [`Self::pause`]).
    pub fn resume(&self) {
        self.send(Signal::SIGCONT);
    }

    /// SIGTERM (with a SIGCONT first, so a paused process can act on it),
    /// then waits up to `grace`; `None` if it is still running. The caller
    /// judges the status (a clean shutdown exits 0).
    pub fn terminate(&mut self, grace: Duration) -> Option<ExitStatus> {
        self.send(Signal::SIGCONT);
        self.send(Signal::SIGTERM);
        self.wait_timeout(grace)
    }

    /// Its state letter from `/proc/<pid>/stat` (`R`, `S`, `T` = stopped,
    /// `Z`, …); `None` once it is gone.
    pub fn state(&self) -> Option<char> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid())).ok()?;
        stat.rsplit_once(')')?.1.trim_start().chars().next()
    }

    /// Peak resident set (VmHWM) so far, in MiB; `None` once it is gone.
    pub fn peak_rss_mib(&self) -> Option<f64> {
        let s = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).ok()?;
        let kb: f64 = s
            .lines()
            .find(|l| l.starts_with("VmHWM:"))?
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()?;
        Some(kb / 1024.0)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// SIGTERM to every process at once, then waits for each up to `grace`
/// (the shutdowns overlap): each one's name and exit status, `None` for one
/// still running (it is killed when dropped).
pub fn terminate_all(procs: &mut [Proc], grace: Duration) -> Vec<(String, Option<ExitStatus>)> {
    for p in procs.iter() {
        p.send(Signal::SIGCONT);
        p.send(Signal::SIGTERM);
    }
    let deadline = Instant::now() + grace;
    procs
        .iter_mut()
        .map(|p| {
            let left = deadline.saturating_duration_since(Instant::now());
            (p.name.clone(), p.wait_timeout(left))
        })
        .collect()
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

/// Runs `bin args` with `envs` (and `RUST_LOG=warn`) to completion without
/// blocking the runtime; its output, whatever its status.
pub async fn run(bin: &Path, args: &[&str], envs: &[(&str, &str)]) -> std::io::Result<Output> {
    tokio::process::Command::new(bin)
        .args(args)
        .env("RUST_LOG", "warn")
        .envs(envs.iter().copied())
        .stdin(Stdio::null())
        .output()
        .await
}

/// Where the workspace's binaries are, from one of them
/// (`env!("CARGO_BIN_EXE_worker")` in the worker's tests).
pub fn sibling(bin: &Path, name: &str) -> PathBuf {
    bin.with_file_name(name)
}

/// libfaketime's preload library (the multi-threaded build where there is
/// one), as Debian's `faketime` package installs it.
pub fn libfaketime() -> Option<PathBuf> {
    let dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib")
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .map(|e| e.path().join("faketime"))
        .chain(["/usr/lib/faketime", "/usr/local/lib/faketime"].map(PathBuf::from))
        .collect();
    ["libfaketimeMT.so.1", "libfaketime.so.1"]
        .iter()
        .flat_map(|lib| dirs.iter().map(move |d| d.join(lib)))
        .find(|p| p.is_file())
}

/// The environment that runs a child with its wall clock `offset`
/// (libfaketime syntax, e.g. `"+40s"`) off this process's: `lib` preloaded
/// directly rather than through the `faketime` wrapper, which forks and so
/// would stand between the harness's signals and the process. Only the wall
/// clock moves; timers and timeouts keep real time.
///
/// When this process itself runs under libfaketime with an offset (the
/// suite run at another time of day, `FAKETIME=+7200s`, servers and all),
/// the child's offset is added to it, so the child is still `offset` off
/// the clock its test and the servers share.
pub fn clock_offset_envs(lib: &str, offset: &str) -> [(&'static str, String); 4] {
    let here = std::env::var("LD_PRELOAD")
        .is_ok_and(|p| p.contains("faketime"))
        .then(|| std::env::var("FAKETIME").ok())
        .flatten()
        .and_then(|f| offset_secs(&f));
    let offset = match (here, offset_secs(offset)) {
        (Some(here), Some(child)) => format!("{:+}s", here + child),
        _ => offset.to_owned(),
    };
    [
        ("LD_PRELOAD", lib.to_owned()),
        ("FAKETIME", offset),
        ("DONT_FAKE_MONOTONIC", "1".to_owned()),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1".to_owned()),
    ]
}

/// A libfaketime offset (`+40s`, `-7200`, `+2h`, `-1d`) in seconds; `None`
/// for the other forms (an absolute time, a speed-up).
fn offset_secs(f: &str) -> Option<i64> {
    let sign = match f.chars().next()? {
        '+' => 1,
        '-' => -1,
        _ => return None,
    };
    let body = &f[1..];
    let (n, unit) = match body.char_indices().last()? {
        (i, c) if c.is_ascii_alphabetic() => (&body[..i], c),
        _ => (body, 's'),
    };
    let per = match unit {
        's' => 1,
        'm' => 60,
        'h' => 3600,
        'd' => 86_400,
        _ => return None,
    };
    Some(sign * n.parse::<i64>().ok()? * per)
}

#[cfg(test)]
mod tests {
    use super::offset_secs;

    #[test]
    fn libfaketime_offsets_read_as_seconds() {
        assert_eq!(offset_secs("+40s"), Some(40));
        assert_eq!(offset_secs("-7200"), Some(-7200));
        assert_eq!(offset_secs("+2m"), Some(120));
        assert_eq!(offset_secs("+2h"), Some(7200));
        assert_eq!(offset_secs("-1d"), Some(-86_400));
        for other in [
            "@2026-12-05 23:59:50",
            "2026-12-05 23:59:50",
            "+1 x2",
            "+",
            "",
            "+4w",
        ] {
            assert_eq!(offset_secs(other), None, "{other:?}");
        }
    }
}
