//! The accepted range of every duration setting, in the file and on the
//! command line, and the one parser of humane durations (`90s`, `1h 30m`).
//!
//! Every value is bounded, so nothing a config file or a flag says can make
//! a delivery panic or hang: a range is checked where the value is read,
//! and its message states the range.

use std::time::Duration;

const HOUR: Duration = Duration::from_secs(3600);
const DAY: Duration = Duration::from_secs(24 * 3600);

/// The accepted range of one duration setting. The upper limits keep every
/// sum of a setting and an instant far inside chrono's and Postgres's
/// ranges, and catch typos (`"2000h"` for `"20h"`) at start instead of at
/// 02:00.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bound {
    /// The smallest accepted value (inclusive).
    pub min: Duration,
    /// The largest accepted value, inclusive unless `max_excluded`.
    pub max: Duration,
    /// `max` itself is out of range (jitter: *less than* a day).
    pub max_excluded: bool,
}

impl Bound {
    const fn between(min: Duration, max: Duration) -> Bound {
        Bound {
            min,
            max,
            max_excluded: false,
        }
    }

    const fn up_to(max: Duration) -> Bound {
        Bound::between(Duration::ZERO, max)
    }

    /// `Ok(d)` when `d` is in range, else a message stating the range.
    pub fn check(&self, d: Duration) -> Result<Duration, String> {
        let over = if self.max_excluded {
            d >= self.max
        } else {
            d > self.max
        };
        if d < self.min || over {
            return Err(format!("{} is out of range: {}", show(d), self.describe()));
        }
        Ok(d)
    }

    /// Parses a humane duration and checks it.
    pub fn parse(&self, s: &str) -> Result<Duration, String> {
        self.check(parse_duration(s)?)
    }

    /// `at least 100ms and at most 1h`, `less than 1day`, …
    pub fn describe(&self) -> String {
        let max = if self.max_excluded {
            format!("less than {}", show(self.max))
        } else {
            format!("at most {}", show(self.max))
        };
        if self.min.is_zero() {
            format!("must be {max}")
        } else {
            format!("must be at least {} and {max}", show(self.min))
        }
    }
}

fn show(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

/// `jitter`: less than a day, so a slot's due time stays on its day's side
/// of the next day's slots.
pub const JITTER: Bound = Bound {
    min: Duration::ZERO,
    max: DAY,
    max_excluded: true,
};
/// `starting_deadline`: at most 7 days.
pub const STARTING_DEADLINE: Bound = Bound::up_to(Duration::from_secs(7 * 24 * 3600));
/// `http_timeout`: more than zero, at most 10 minutes.
pub const HTTP_TIMEOUT: Bound = Bound::between(Duration::from_millis(1), Duration::from_secs(600));
/// `retry_base`: at most 10 minutes.
pub const RETRY_BASE: Bound = Bound::up_to(Duration::from_secs(600));
/// `retry_cap`: at most an hour.
pub const RETRY_CAP: Bound = Bound::up_to(HOUR);

/// The worker's `--visibility` (claim and delivery lifetime without a
/// heartbeat): 100ms to 1h.
pub const VISIBILITY: Bound = Bound::between(Duration::from_millis(100), HOUR);
/// The worker's `--lease-ttl`: 100ms to 10 minutes.
pub const LEASE_TTL: Bound = Bound::between(Duration::from_millis(100), Duration::from_secs(600));
/// The worker's `--shutdown-grace` and `--reconcile-every`: 100ms to 1h.
pub const WORKER_PERIOD: Bound = Bound::between(Duration::from_millis(100), HOUR);
/// `planner run --every`: 1s to 12h (it plans today and tomorrow each
/// round, so a round must come at least once a day).
pub const PLAN_EVERY: Bound =
    Bound::between(Duration::from_secs(1), Duration::from_secs(12 * 3600));

/// The worker's `--forget-after` (gone consumers and heartbeats): 1 minute
/// to 30 days.
pub const FORGET_AFTER: Bound =
    Bound::between(Duration::from_secs(60), Duration::from_secs(30 * 24 * 3600));
/// `--redis-connect-timeout`: 100ms to 10 minutes.
pub const REDIS_CONNECT_TIMEOUT: Bound =
    Bound::between(Duration::from_millis(100), Duration::from_secs(600));
/// `[kinds.wordpress] refresh_every`: at most 10 minutes.
pub const WP_REFRESH: Bound = Bound::up_to(Duration::from_secs(600));
/// `planner trigger --wait-timeout`: 1s to 1 day.
pub const WAIT_TIMEOUT: Bound = Bound::between(Duration::from_secs(1), DAY);

/// Humane durations: `90s`, `15m`, `2h`, `1h 30m`, `250ms`, or `0`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    if t == "0" {
        return Ok(Duration::ZERO);
    }
    if t.starts_with('-') {
        return Err(format!("bad duration {s:?}: must not be negative"));
    }
    humantime::parse_duration(t)
        .map_err(|e| format!("bad duration {s:?} ({e}; expected e.g. \"90s\", \"15m\", \"2h\")"))
}
