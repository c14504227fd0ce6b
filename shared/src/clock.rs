//! The clock, injected wherever behaviour depends on "now" (due times, what
//! is recorded), so tests can move time instead of waiting for it; and the
//! measured offset of a process's clock against Postgres's, which is the
//! one clock that judges claim expiry and starting deadlines across
//! machines.

use chrono::{DateTime, Utc};
use std::sync::{Arc, Mutex};

/// A source of the current instant.
pub trait Clock: Send + Sync + 'static {
    /// The current instant, as this clock sees it (not necessarily
    /// Postgres's; see [`SKEW_LIMIT_MS`]).
    fn now(&self) -> DateTime<Utc>;
}

/// The real wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }
}

/// A clock that only moves when told to; for tests.
#[derive(Debug, Clone)]
pub struct ManualClock(Arc<Mutex<DateTime<Utc>>>);

impl ManualClock {
    /// A clock standing at `at`; its clones share it, so a test can hold
    /// one and move the clock of the code under test.
    pub fn new(at: DateTime<Utc>) -> Self {
        Self(Arc::new(Mutex::new(at)))
    }
    /// Jumps to `at`, backwards too (to test a clock that steps back).
    pub fn set(&self, at: DateTime<Utc>) {
        *self.0.lock().expect("clock poisoned") = at;
    }
    /// Moves the clock by `by` (negative moves it back).
    pub fn advance(&self, by: chrono::Duration) {
        let mut t = self.0.lock().expect("clock poisoned");
        *t += by;
    }
}

impl Clock for ManualClock {
    fn now(&self) -> DateTime<Utc> {
        *self.0.lock().expect("clock poisoned")
    }
}

/// Shared handle to a clock.
pub type SharedClock = Arc<dyn Clock>;

/// Milliseconds since the Unix epoch, the unit of Redis scores.
pub fn unix_ms(t: DateTime<Utc>) -> i64 {
    t.timestamp_millis()
}

/// A clock further than this (milliseconds) from Postgres's is reported:
/// a WARN in the worker's log and a mark in `planner status`.
pub const SKEW_LIMIT_MS: i64 = 1000;

/// One measurement of a clock against Postgres's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Skew {
    /// This clock minus Postgres's, at the midpoint of the round trip.
    pub skew_ms: i64,
    /// The round trip; the measurement is good to half of it.
    pub rtt_ms: i64,
}

impl Skew {
    /// Further off than [`SKEW_LIMIT_MS`] (beyond what the round trip
    /// could explain).
    pub fn is_off(&self) -> bool {
        self.skew_ms.abs() > SKEW_LIMIT_MS + self.rtt_ms / 2
    }

    /// "ahead of" or "behind".
    pub fn direction(&self) -> &'static str {
        if self.skew_ms >= 0 {
            "ahead of"
        } else {
            "behind"
        }
    }
}

/// `t + d`, saturating at the latest instant chrono can hold instead of
/// panicking. Every place where a configured duration meets an instant goes
/// through here: the config bounds keep real values far from the limit, and
/// this keeps a value set in code (or a bound changed later) from turning
/// every delivery into a panic.
pub fn later(t: DateTime<Utc>, d: std::time::Duration) -> DateTime<Utc> {
    chrono::Duration::from_std(d)
        .ok()
        .and_then(|d| t.checked_add_signed(d))
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skew_is_off_beyond_the_limit_and_the_round_trip() {
        let s = |skew_ms, rtt_ms| Skew { skew_ms, rtt_ms };
        assert!(!s(900, 2).is_off());
        assert!(s(40_000, 2).is_off());
        assert!(s(-1_500, 2).is_off());
        assert!(
            !s(1_100, 400).is_off(),
            "within the round trip's uncertainty"
        );
        assert_eq!(s(-5, 1).direction(), "behind");
    }

    #[test]
    fn later_saturates_instead_of_panicking() {
        use std::time::Duration;
        let t = Utc::now();
        assert_eq!(
            later(t, Duration::from_secs(60)),
            t + chrono::Duration::seconds(60)
        );
        assert_eq!(later(t, Duration::MAX), DateTime::<Utc>::MAX_UTC);
        assert_eq!(
            later(t, Duration::from_secs(400_000 * 366 * 24 * 3600)),
            DateTime::<Utc>::MAX_UTC
        );
    }
}
