//! The clock, injected wherever behaviour depends on "now" (deadlines, due
//! times, claim expiry), so tests can move time instead of waiting for it.

use chrono::{DateTime, Utc};
use std::sync::{Arc, Mutex};

/// A source of the current instant.
pub trait Clock: Send + Sync + 'static {
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
    pub fn new(at: DateTime<Utc>) -> Self {
        Self(Arc::new(Mutex::new(at)))
    }
    pub fn set(&self, at: DateTime<Utc>) {
        *self.0.lock().expect("clock poisoned") = at;
    }
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
    use std::time::Duration;

    #[test]
    fn later_saturates_instead_of_panicking() {
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
