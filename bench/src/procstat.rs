//! CPU time of processes, read from `/proc/<pid>/stat`, for `breakdown`:
//! what each process of a burst (workers, planner, Postgres, Redis) spent.
//!
//! A process's own time (`utime` + `stime`) covers all its threads, those
//! that exited included; its reaped time (`cutime` + `cstime`) covers every
//! child it has waited for. So a server's whole cost is the root process's
//! own and reaped time plus its live children's: Postgres backends that
//! come and go during a burst are counted whole once the postmaster reaps
//! them, with no sampling (and none lost between samples). The same holds
//! for the bench itself: a `planner` run to completion is reaped by it.

use std::time::Duration;

/// The kernel reports these times in USER_HZ ticks, which is 100 on every
/// Linux architecture the project runs on (it is not `CONFIG_HZ`).
const USER_HZ: f64 = 100.0;

/// One process's CPU time so far.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Cpu {
    /// Its own threads' user + system time.
    pub(crate) own: Duration,
    /// Its waited-for children's user + system time.
    pub(crate) reaped: Duration,
}

/// The fields after the command name (which may hold spaces and
/// parentheses, hence the last `)`): index 0 is field 3, the state.
fn fields(pid: i32) -> Option<Vec<u64>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.rsplit_once(')')?.1;
    // The state letter is not a number; the rest up to cstime are.
    Some(
        rest.split_whitespace()
            .skip(1)
            .take(14)
            .map(|f| f.parse().unwrap_or(0))
            .collect(),
    )
}

fn ticks(t: u64) -> Duration {
    Duration::from_secs_f64(t as f64 / USER_HZ)
}

/// `pid`'s CPU time so far; `None` once it is gone (reaped).
pub(crate) fn cpu(pid: i32) -> Option<Cpu> {
    // After skipping the state: ppid is [0], utime [10], stime [11],
    // cutime [12], cstime [13].
    let f = fields(pid)?;
    (f.len() == 14).then(|| Cpu {
        own: ticks(f[10] + f[11]),
        reaped: ticks(f[12] + f[13]),
    })
}

/// The live processes whose parent is `ppid`.
pub(crate) fn children(ppid: i32) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| fields(pid).is_some_and(|f| f.first() == Some(&(ppid as u64))))
        .collect()
}

/// CPU time of `root` and all its children so far, live or reaped (one
/// level down: Postgres's backends do not fork). Read again when `root`
/// reaped a child meanwhile, so that no child is counted twice (live, then
/// reaped) or not at all; `None` if `root` is gone.
pub(crate) fn tree(root: i32) -> Option<Duration> {
    loop {
        let before = cpu(root)?;
        let kids: Duration = children(root)
            .into_iter()
            .filter_map(cpu)
            .map(|c| c.own + c.reaped)
            .sum();
        let after = cpu(root)?;
        if after.reaped == before.reaped {
            return Some(after.own + after.reaped + kids);
        }
    }
}

/// What the bench's own reaped children have spent so far: around a child
/// run to completion (and nothing else reaped meanwhile), that child's CPU.
pub(crate) fn reaped_by_me() -> Duration {
    cpu(std::process::id() as i32)
        .map(|c| c.reaped)
        .unwrap_or_default()
}
