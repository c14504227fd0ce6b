//! Capped exponential backoff with *full jitter*:
//! `sleep = random(0, min(cap, base · 2^attempt))`.
//!
//! Full jitter spreads retrying clients uniformly over the whole window, so a
//! crowd that failed together does not come back together (the AWS
//! "Exponential Backoff and Jitter" result). The RNG is injected so tests and
//! simulations are reproducible.

use rand::Rng;
use std::time::Duration;

/// How a call is retried. Defaults: 5 attempts, base 500 ms, cap 30 s.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all, including the first.
    pub max_attempts: u32,
    pub base: Duration,
    pub cap: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: crate::config::DEFAULT_HTTP_ATTEMPTS,
            base: crate::config::DEFAULT_RETRY_BASE,
            cap: crate::config::DEFAULT_RETRY_CAP,
        }
    }
}

/// The ceiling of the backoff window after `attempt` failures (0-based):
/// `min(cap, base · 2^attempt)`.
pub fn ceiling(base: Duration, cap: Duration, attempt: u32) -> Duration {
    let factor = 1u32.checked_shl(attempt.min(31)).unwrap_or(u32::MAX);
    base.checked_mul(factor).unwrap_or(cap).min(cap)
}

/// Full jitter: uniform in `[0, ceiling]`.
pub fn full_jitter<R: Rng + ?Sized>(
    rng: &mut R,
    base: Duration,
    cap: Duration,
    attempt: u32,
) -> Duration {
    let c = ceiling(base, cap, attempt).as_micros() as u64;
    Duration::from_micros(rng.gen_range(0..=c))
}

impl RetryPolicy {
    /// The sleep before the next try after `attempt` failures (0-based).
    pub fn delay<R: Rng + ?Sized>(&self, rng: &mut R, attempt: u32) -> Duration {
        full_jitter(rng, self.base, self.cap, attempt)
    }
}

/// Backoff for reconnecting to a store that went away: same shape, fixed
/// generous bounds (base 100 ms, cap 5 s), never gives up.
#[derive(Debug)]
pub struct Reconnect<R> {
    rng: R,
    failures: u32,
}

impl<R: Rng> Reconnect<R> {
    pub fn new(rng: R) -> Self {
        Self { rng, failures: 0 }
    }
    /// The sleep after one more consecutive failure.
    pub fn next_delay(&mut self) -> Duration {
        let d = full_jitter(
            &mut self.rng,
            Duration::from_millis(100),
            Duration::from_secs(5),
            self.failures,
        );
        self.failures = self.failures.saturating_add(1);
        d
    }
    pub fn reset(&mut self) {
        self.failures = 0;
    }
    pub fn failures(&self) -> u32 {
        self.failures
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{rngs::StdRng, SeedableRng};

    #[test]
    fn ceiling_doubles_then_caps() {
        let b = Duration::from_millis(100);
        let c = Duration::from_secs(1);
        assert_eq!(ceiling(b, c, 0), b);
        assert_eq!(ceiling(b, c, 3), Duration::from_millis(800));
        assert_eq!(ceiling(b, c, 4), c);
        assert_eq!(ceiling(b, c, 200), c);
    }

    #[test]
    fn full_jitter_stays_in_window_and_spreads() {
        let mut rng = StdRng::seed_from_u64(7);
        let p = RetryPolicy {
            max_attempts: 5,
            base: Duration::from_millis(100),
            cap: Duration::from_secs(1),
        };
        let samples: Vec<Duration> = (0..1000).map(|_| p.delay(&mut rng, 3)).collect();
        assert!(samples.iter().all(|d| *d <= Duration::from_millis(800)));
        let below = samples
            .iter()
            .filter(|d| **d < Duration::from_millis(400))
            .count();
        // Uniform: about half fall in the lower half of the window.
        assert!((400..600).contains(&below), "{below}");
    }
}
