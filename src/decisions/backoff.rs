//! Capped exponential backoff and its jitter modes: pure functions.
//!
//! ```
//! use std::time::Duration;
//! use rand::{rngs::StdRng, SeedableRng};
//! use reqwest_safe_retry::Jitter;
//! use reqwest_safe_retry::retry::Backoff;
//!
//! let backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(10))
//!     .unwrap()
//!     .with_jitter(Jitter::Full);
//! assert_eq!(backoff.ceiling(0), Duration::from_millis(100));
//! assert_eq!(backoff.ceiling(3), Duration::from_millis(800));
//! assert_eq!(backoff.ceiling(10_000), Duration::from_secs(10));
//!
//! let mut rng = StdRng::seed_from_u64(7);
//! let delay = backoff.delay(2, backoff.base(), &mut rng);
//! assert!(delay <= backoff.ceiling(2));
//! ```
//!
//! # Why jitter
//!
//! Clients that failed together retry together. Without jitter, a fleet that
//! hit the same blip comes back in the same millisecond, again and again, each
//! time a little larger than the server can take (Brooker, "Exponential
//! Backoff And Jitter", 2015). Full jitter spreads each retry uniformly over
//! `[0, ceiling]` and in Brooker's simulation does the least work; it is the
//! default. Jitter applies at the cap as well: a fleet parked at the cap must
//! not come back in lockstep.

use std::time::Duration;

use rand::{Rng, RngExt};

use crate::vocabulary::{uniform, ConfigError};

/// How a delay is drawn below (or around) the exponential ceiling.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum Jitter {
    /// No randomness: `ceiling(n)`. For comparison only — a fleet using it
    /// retries in lockstep.
    None,
    /// `U(0, ceiling(n))`. The default.
    Full,
    /// `ceiling(n)/2 + U(0, ceiling(n)/2)`: never shorter than half the ceiling.
    Equal,
    /// `U(base, min(cap, prev × 3))`, where `prev` is the previous delay of
    /// the same logical operation (the base for the first retry).
    ///
    /// Brooker's formula is `min(cap, U(base, prev × 3))`; once `prev × 3`
    /// passes the cap, that puts two thirds of a fleet at exactly the cap, in
    /// lockstep. Clamping the upper end first keeps the same range and keeps
    /// the jitter at the cap.
    Decorrelated,
    /// `ceiling(n) × U(1 − f, 1 + f)`: gRPC's reconnect jitter (`f = 0.2`).
    /// The upper side may exceed the cap by the factor `1 + f`, as in gRPC.
    Proportional(f64),
}

impl Jitter {
    /// The name used on command lines and in reports (`full`, `equal`, …).
    pub fn name(&self) -> &'static str {
        match self {
            Jitter::None => "none",
            Jitter::Full => "full",
            Jitter::Equal => "equal",
            Jitter::Decorrelated => "decorrelated",
            Jitter::Proportional(_) => "proportional",
        }
    }
}

/// Capped exponential backoff: `ceiling(n) = min(cap, base × multiplier^n)`,
/// with a [`Jitter`] mode on top.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    base: Duration,
    cap: Duration,
    multiplier: f64,
    jitter: Jitter,
}

impl Backoff {
    /// A backoff doubling from `base` up to `cap`, with full jitter.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] when `base` is zero or `cap` is below `base`.
    pub fn new(base: Duration, cap: Duration) -> Result<Self, ConfigError> {
        Backoff::from_parts(base, cap, 2.0, Jitter::Full)
    }

    /// A backoff from all its parts, validated.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] when `base` is zero, `cap` is below `base`, the
    /// multiplier is not a finite number ≥ 1, or a proportional jitter factor
    /// is outside `[0, 1]`.
    pub fn from_parts(
        base: Duration,
        cap: Duration,
        multiplier: f64,
        jitter: Jitter,
    ) -> Result<Self, ConfigError> {
        if base.is_zero() {
            return Err(ConfigError::new("backoff base must be greater than zero"));
        }
        if cap < base {
            return Err(ConfigError::new("backoff cap must not be below the base"));
        }
        if !multiplier.is_finite() || multiplier < 1.0 {
            return Err(ConfigError::new(
                "backoff multiplier must be a finite number of at least 1",
            ));
        }
        if let Jitter::Proportional(f) = jitter {
            if !(0.0..=1.0).contains(&f) {
                return Err(ConfigError::new(
                    "proportional jitter factor must lie in [0, 1]",
                ));
            }
        }
        Ok(Backoff {
            base,
            cap,
            multiplier,
            jitter,
        })
    }

    /// The same backoff with another jitter mode.
    ///
    /// A proportional factor outside `[0, 1]` is clamped into it.
    #[must_use]
    pub fn with_jitter(mut self, jitter: Jitter) -> Self {
        self.jitter = match jitter {
            Jitter::Proportional(f) if f.is_nan() => Jitter::Proportional(0.0),
            Jitter::Proportional(f) => Jitter::Proportional(f.clamp(0.0, 1.0)),
            other => other,
        };
        self
    }

    /// The first delay's ceiling.
    pub fn base(&self) -> Duration {
        self.base
    }

    /// The largest ceiling.
    pub fn cap(&self) -> Duration {
        self.cap
    }

    /// The growth factor per retry.
    pub fn multiplier(&self) -> f64 {
        self.multiplier
    }

    /// The jitter mode.
    pub fn jitter(&self) -> Jitter {
        self.jitter
    }

    /// `min(cap, base × multiplier^n)`, for any `n` without overflow or panic:
    /// `ceiling(10_000)` is the cap.
    pub fn ceiling(&self, n: u32) -> Duration {
        // Work in f64 seconds: `powi` saturates to +inf instead of overflowing,
        // and the comparison with the cap happens before any conversion back.
        let exp = i32::try_from(n).unwrap_or(i32::MAX);
        let secs = self.base.as_secs_f64() * self.multiplier.powi(exp);
        if !secs.is_finite() || secs >= self.cap.as_secs_f64() {
            self.cap
        } else {
            // `secs` is finite, non-negative and below the cap, so it fits.
            Duration::from_secs_f64(secs).min(self.cap)
        }
    }

    /// The delay before retry number `n` (0 for the first retry).
    ///
    /// `prev` is the previous delay of the same logical operation; only
    /// [`Jitter::Decorrelated`] uses it (pass [`Backoff::base`] for the first
    /// retry).
    pub fn delay<R: Rng + ?Sized>(&self, n: u32, prev: Duration, rng: &mut R) -> Duration {
        let ceiling = self.ceiling(n);
        match self.jitter {
            Jitter::None => ceiling,
            Jitter::Full => uniform(rng, Duration::ZERO, ceiling),
            Jitter::Equal => {
                let half = ceiling / 2;
                half + uniform(rng, Duration::ZERO, ceiling - half)
            }
            Jitter::Decorrelated => {
                let upper = prev.max(self.base).saturating_mul(3).min(self.cap);
                uniform(rng, self.base, upper)
            }
            Jitter::Proportional(f) => scale(ceiling, 1.0 - f + 2.0 * f * rng.random::<f64>()),
        }
    }

    /// The bounds `[low, high]` that [`Backoff::delay`] keeps to for retry `n`
    /// after a previous delay `prev`.
    pub fn bounds(&self, n: u32, prev: Duration) -> (Duration, Duration) {
        let ceiling = self.ceiling(n);
        match self.jitter {
            Jitter::None => (ceiling, ceiling),
            Jitter::Full => (Duration::ZERO, ceiling),
            Jitter::Equal => (ceiling / 2, ceiling),
            Jitter::Decorrelated => {
                let upper = prev.max(self.base).saturating_mul(3).min(self.cap);
                (self.base.min(upper), upper)
            }
            Jitter::Proportional(f) => (scale(ceiling, 1.0 - f), scale(ceiling, 1.0 + f)),
        }
    }
}

/// `d × factor` for a non-negative factor, saturating at `Duration::MAX`
/// instead of panicking as `Duration::mul_f64` does.
fn scale(d: Duration, factor: f64) -> Duration {
    Duration::try_from_secs_f64(d.as_secs_f64() * factor).unwrap_or(Duration::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{rngs::StdRng, SeedableRng};

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn ceiling_grows_then_caps() {
        let b = Backoff::new(ms(100), ms(1000)).unwrap();
        let got: Vec<_> = (0..6).map(|n| b.ceiling(n)).collect();
        assert_eq!(
            got,
            [ms(100), ms(200), ms(400), ms(800), ms(1000), ms(1000)]
        );
        assert_eq!(b.ceiling(10_000), ms(1000));
        assert_eq!(b.ceiling(u32::MAX), ms(1000));
    }

    #[test]
    fn huge_cap_and_multiplier_do_not_overflow() {
        let b = Backoff::from_parts(ms(1), Duration::MAX, 1e300, Jitter::Full).unwrap();
        assert_eq!(b.ceiling(10_000), Duration::MAX);
        let mut rng = StdRng::seed_from_u64(1);
        for jitter in [
            Jitter::None,
            Jitter::Full,
            Jitter::Equal,
            Jitter::Decorrelated,
            Jitter::Proportional(0.2),
        ] {
            let b = b.with_jitter(jitter);
            let (low, high) = b.bounds(10_000, Duration::MAX);
            let d = b.delay(10_000, Duration::MAX, &mut rng);
            assert!(
                low <= d && d <= high,
                "{jitter:?}: {d:?} outside [{low:?}, {high:?}]"
            );
        }
    }

    #[test]
    fn invalid_parts_are_refused() {
        assert!(Backoff::new(Duration::ZERO, ms(1)).is_err());
        assert!(Backoff::new(ms(10), ms(1)).is_err());
        assert!(Backoff::from_parts(ms(1), ms(2), 0.5, Jitter::Full).is_err());
        assert!(Backoff::from_parts(ms(1), ms(2), f64::NAN, Jitter::Full).is_err());
        assert!(Backoff::from_parts(ms(1), ms(2), 2.0, Jitter::Proportional(1.5)).is_err());
    }

    #[test]
    fn no_jitter_is_the_ceiling() {
        let b = Backoff::new(ms(5), ms(2000))
            .unwrap()
            .with_jitter(Jitter::None);
        let mut rng = StdRng::seed_from_u64(0);
        assert_eq!(b.delay(3, b.base(), &mut rng), ms(40));
    }

    #[test]
    fn decorrelated_starts_at_base_and_keeps_to_cap() {
        let b = Backoff::new(ms(10), ms(100))
            .unwrap()
            .with_jitter(Jitter::Decorrelated);
        let mut rng = StdRng::seed_from_u64(3);
        let mut prev = b.base();
        for n in 0..50 {
            let d = b.delay(n, prev, &mut rng);
            assert!(
                d >= ms(10) && d <= ms(100).min(prev * 3),
                "{d:?} after {prev:?}"
            );
            prev = d;
        }
    }

    #[test]
    fn full_jitter_spreads_over_the_whole_range() {
        let b = Backoff::new(ms(1000), ms(1000)).unwrap();
        let mut rng = StdRng::seed_from_u64(11);
        let draws: Vec<_> = (0..1000).map(|_| b.delay(0, b.base(), &mut rng)).collect();
        assert!(draws.iter().any(|d| *d < ms(100)));
        assert!(draws.iter().any(|d| *d > ms(900)));
    }
}
