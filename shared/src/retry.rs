//! Capped exponential backoff with *full jitter*:
//! `sleep = random(0, min(cap, base · 2^attempt))`.
//!
//! Full jitter spreads retrying clients uniformly over the whole window, so a
//! crowd that failed together does not come back together (the AWS
//! "Exponential Backoff and Jitter" result). The RNG is injected so tests and
//! simulations are reproducible: every function here takes its RNG, and the
//! executor and the worker draw theirs from an injected [`Entropy`] (as they
//! take the time from an injected clock).
//!
//! Also here: [`Reconnect`], the same shape with fixed bounds for a store
//! that went away, and [`Backoff`], the experiment's other strategies, which
//! only `slotgate-bench backoff` uses.

use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Where the jitter's randomness comes from: each retry loop asks it for an
/// RNG of its own, so concurrent loops share no lock while they run.
pub trait Entropy: Send + Sync + std::fmt::Debug {
    /// A fresh RNG for one retry loop.
    fn rng(&self) -> StdRng;
}

/// An [`Entropy`] shared by the tasks of a process.
pub type SharedEntropy = Arc<dyn Entropy>;

/// The operating system's randomness: production's [`Entropy`].
#[derive(Debug, Clone, Copy, Default)]
pub struct OsEntropy;

impl Entropy for OsEntropy {
    fn rng(&self) -> StdRng {
        StdRng::from_entropy()
    }
}

/// A seeded [`Entropy`]: the same seed hands out the same RNGs in the same
/// order, so a test's or a simulation's delays repeat.
#[derive(Debug)]
pub struct SeededEntropy(Mutex<StdRng>);

impl SeededEntropy {
    /// The RNGs that `seed` leads to.
    pub fn new(seed: u64) -> Self {
        Self(Mutex::new(StdRng::seed_from_u64(seed)))
    }
}

impl Entropy for SeededEntropy {
    fn rng(&self) -> StdRng {
        let mut root = self.0.lock().unwrap_or_else(|p| p.into_inner());
        StdRng::seed_from_u64(root.next_u64())
    }
}

/// How a call is retried. Defaults: 5 attempts, base 500 ms, cap 30 s.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all, including the first.
    pub max_attempts: u32,
    /// The first backoff window's ceiling; it doubles with each failure.
    pub base: Duration,
    /// The largest backoff window, however many failures came before.
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

    /// The sleep before probing again a key the CMS said it is still
    /// applying (a probe's `409`): uniform in `[cap/2, cap]`. The CMS has
    /// told us the write is under way, so there is nothing to learn sooner;
    /// full jitter from `base` would spend the attempts in the first second
    /// (twenty of them could end, by chance, within a few seconds of a
    /// write that takes ten) and record `failed` for a publish the CMS was
    /// about to apply. With this floor, `n` attempts of `409` wait at least
    /// `n · cap / 2`: a bound an operator can size against the CMS's
    /// slowest write (docs/receivers.md).
    pub fn in_progress_delay<R: Rng + ?Sized>(&self, rng: &mut R) -> Duration {
        let c = self.cap.as_micros() as u64;
        Duration::from_micros(c / 2 + rng.gen_range(0..=c - c / 2))
    }
}

/// The backoff strategies of the AWS "Exponential Backoff and Jitter"
/// experiment. slotgate itself uses [`Backoff::Full`]; the others exist so the
/// benchmark can compare them with the same code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backoff {
    /// Retry at once.
    None,
    /// `min(cap, base · 2^attempt)`, no jitter.
    Exponential,
    /// `random(0, min(cap, base · 2^attempt))`.
    Full,
    /// `c/2 + random(0, c/2)` with `c = min(cap, base · 2^attempt)`.
    Equal,
    /// `min(cap, random(base, previous · 3))`.
    Decorrelated,
}

impl Backoff {
    /// Every strategy, in the order the benchmark reports them.
    pub const ALL: [Backoff; 5] = [
        Backoff::None,
        Backoff::Exponential,
        Backoff::Full,
        Backoff::Equal,
        Backoff::Decorrelated,
    ];

    /// The strategy's label in benchmark output.
    pub fn name(self) -> &'static str {
        match self {
            Backoff::None => "none",
            Backoff::Exponential => "exponential",
            Backoff::Full => "full",
            Backoff::Equal => "equal",
            Backoff::Decorrelated => "decorrelated",
        }
    }

    /// The sleep after `attempt` failures (0-based); `previous` is the last
    /// sleep (decorrelated jitter grows from it; use `base` at first).
    pub fn delay<R: Rng + ?Sized>(
        self,
        rng: &mut R,
        base: Duration,
        cap: Duration,
        attempt: u32,
        previous: Duration,
    ) -> Duration {
        match self {
            Backoff::None => Duration::ZERO,
            Backoff::Exponential => ceiling(base, cap, attempt),
            Backoff::Full => full_jitter(rng, base, cap, attempt),
            Backoff::Equal => {
                let half = ceiling(base, cap, attempt).as_micros() as u64 / 2;
                Duration::from_micros(half + rng.gen_range(0..=half))
            }
            Backoff::Decorrelated => {
                let lo = base.as_micros() as u64;
                let hi = (previous.as_micros() as u64).saturating_mul(3).max(lo);
                Duration::from_micros(rng.gen_range(lo..=hi)).min(cap)
            }
        }
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
    /// Starts with no failures; `rng` draws the jitter (seed it in tests).
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
    /// After a success: the next failure starts from the smallest window
    /// again.
    pub fn reset(&mut self) {
        self.failures = 0;
    }
    /// Consecutive failures since the last reset, for log lines.
    pub fn failures(&self) -> u32 {
        self.failures
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One seed, the same delays from each RNG it hands out, in order; the
    /// RNGs it hands out differ from one another.
    #[test]
    fn a_seeded_entropy_repeats_its_delays() {
        let p = RetryPolicy {
            max_attempts: 5,
            base: Duration::from_millis(100),
            cap: Duration::from_secs(30),
        };
        let delays = |e: &dyn Entropy| -> Vec<Vec<Duration>> {
            (0..3)
                .map(|_| {
                    let mut rng = e.rng();
                    (0..8).map(|a| p.delay(&mut rng, a)).collect()
                })
                .collect()
        };
        let (a, b) = (
            delays(&SeededEntropy::new(42)),
            delays(&SeededEntropy::new(42)),
        );
        assert_eq!(a, b);
        assert_ne!(a[0], a[1], "each loop gets an RNG of its own");
        assert_ne!(a, delays(&SeededEntropy::new(43)));
    }

    /// Every wait after a `409` lies in `[cap/2, cap]`, so twenty of them
    /// outlast ten caps whatever the RNG draws; full jitter's do not.
    #[test]
    fn a_write_in_progress_is_probed_again_no_sooner_than_half_the_cap() {
        let p = RetryPolicy {
            max_attempts: 20,
            base: Duration::from_millis(50),
            cap: Duration::from_secs(1),
        };
        let mut rng = SeededEntropy::new(7).rng();
        let waits: Vec<Duration> = (0..1000).map(|_| p.in_progress_delay(&mut rng)).collect();
        assert!(waits
            .iter()
            .all(|w| *w >= Duration::from_millis(500) && *w <= Duration::from_secs(1)));
        assert!(waits.iter().any(|w| *w < Duration::from_millis(600)));
        assert!(waits.iter().any(|w| *w > Duration::from_millis(900)));
        // The old rule: 19 full-jitter waits from `base` fall short of
        // 9 s for some seeds (the chaos probe scenario's held write).
        let short = (0..200u64).any(|seed| {
            let mut rng = SeededEntropy::new(seed).rng();
            (0..19).map(|a| p.delay(&mut rng, a)).sum::<Duration>() < Duration::from_secs(6)
        });
        assert!(
            short,
            "full jitter should sometimes spend 19 attempts in under 6 s"
        );
    }

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
    fn strategies_stay_in_their_windows() {
        let mut rng = StdRng::seed_from_u64(1);
        let (b, c) = (Duration::from_millis(5), Duration::from_secs(2));
        for attempt in 0..12 {
            let ceil = ceiling(b, c, attempt);
            assert_eq!(
                Backoff::None.delay(&mut rng, b, c, attempt, b),
                Duration::ZERO
            );
            assert_eq!(Backoff::Exponential.delay(&mut rng, b, c, attempt, b), ceil);
            assert!(Backoff::Full.delay(&mut rng, b, c, attempt, b) <= ceil);
            let e = Backoff::Equal.delay(&mut rng, b, c, attempt, b);
            assert!(e >= ceil / 2 && e <= ceil, "{e:?} {ceil:?}");
            let prev = Duration::from_millis(40);
            let d = Backoff::Decorrelated.delay(&mut rng, b, c, attempt, prev);
            assert!(d >= b && d <= Duration::from_millis(120), "{d:?}");
        }
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
