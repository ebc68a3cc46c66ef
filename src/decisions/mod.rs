//! The decisions: what to do about what the server said. How long to wait
//! ([`Backoff`]), whether a request may be sent again (the safety rule),
//! whether a retry may go now ([`RetryAdmission`] and its strategies, the
//! circuit breaker, rate-limit pacing), and when to hedge ([`HedgeConfig`],
//! the per-host latency tracker and hedge budget). State and arithmetic
//! over instants passed in: no I/O, no clock, no sleeping.
//!
//! May use: `vocabulary`, `signals`.
//!
//! ```
//! use std::time::Duration;
//! use rand::{rngs::StdRng, SeedableRng};
//! use reqwest_safe_retry::Jitter;
//! use reqwest_safe_retry::retry::Backoff;
//!
//! let (base, cap) = (Duration::from_millis(100), Duration::from_secs(10));
//! let backoff = Backoff::from_parts(base, cap, 2.0, Jitter::None).unwrap();
//! let mut rng = StdRng::seed_from_u64(1);
//! assert_eq!(backoff.delay(2, Duration::ZERO, &mut rng), Duration::from_millis(400));
//! ```

mod admission;
mod backoff;
mod hedge;
mod replicas;
pub(crate) mod safety;

pub(crate) use admission::CircuitBreaker;
pub use admission::{
    AdaptiveAdmission, AdaptiveConfig, Admission, AttemptRecord, AttemptResult,
    CircuitBreakerConfig, FirstAttemptPacing, Grant, GrantSource, NoAdmission, RetryAdmission,
    RetryKind, RetryRequest, TokenBucket, TokenBucketConfig,
};
pub use backoff::{Backoff, Jitter};
pub use hedge::HedgeConfig;
pub(crate) use hedge::Hedger;
pub(crate) use replicas::NameKey;
pub use replicas::ReplicaTable;
