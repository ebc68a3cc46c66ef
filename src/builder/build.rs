//! `build()`: every setting checked, the policy made.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::HeaderValue;
use rand::rngs::SmallRng;

use crate::decisions::{
    AdaptiveAdmission, Backoff, CircuitBreaker, NoAdmission, RetryAdmission, TokenBucket,
};
use crate::engine::{Metrics, RetryPolicy, Settings};
use crate::vocabulary::ConfigError;

use super::{AdmissionChoice, RetryPolicyBuilder};

impl RetryPolicyBuilder {
    /// Checks every setting and builds the policy.
    ///
    /// # Errors
    ///
    /// [`ConfigError`], naming the setting, when `max_attempts` is 0, a
    /// backoff is invalid (see [`Backoff::from_parts`]), the deadline, an
    /// attempt timeout or the minimum attempt window is zero, the deadline
    /// is shorter than the minimum attempt window (no attempt could ever
    /// start), a header name is invalid, or the admission's settings are
    /// (a zero-capacity budget, for one), or hedging's are (see
    /// [`crate::hedging::HedgeConfig`]: a percentile outside (0, 1], say).
    ///
    /// With the `metrics` feature, building describes every metric to the
    /// installed recorder and registers the series that exist before any
    /// call at zero (install the recorder first). The hosts whose series
    /// are labelled apart are as many as the adaptive admission keeps
    /// partitions for (`AdaptiveConfig::max_partitions`; with another
    /// admission, the circuit breaker's, else 10 000); the hosts past them
    /// share `server.address="_other"`.
    pub fn build(self) -> Result<RetryPolicy, ConfigError> {
        if self.max_attempts == 0 {
            return Err(ConfigError::named("max_attempts", "must be at least 1"));
        }
        if self.deadline == Some(Duration::ZERO) {
            return Err(ConfigError::named("deadline", "must be greater than zero"));
        }
        if self.attempt_timeout == Some(Duration::ZERO) {
            return Err(ConfigError::named(
                "attempt_timeout",
                "must be greater than zero",
            ));
        }
        if self.min_attempt_window.is_zero() {
            return Err(ConfigError::named(
                "min_attempt_window",
                "must be greater than zero",
            ));
        }
        if self.deadline.is_some_and(|d| d < self.min_attempt_window) {
            return Err(ConfigError::named(
                "deadline",
                "is shorter than min_attempt_window: no retry could ever start",
            ));
        }
        let backoff = Backoff::from_parts(self.base, self.cap, self.multiplier, self.jitter)
            .map_err(|e| e.in_setting("backoff"))?;
        let throttle_backoff = match self.throttle_backoff {
            Some((base, cap)) => Some(
                Backoff::from_parts(base, cap, self.multiplier, self.jitter)
                    .map_err(|e| e.in_setting("throttle_backoff"))?,
            ),
            None => None,
        };
        // The hosts the published metrics label apart: as many as the
        // admission keeps partitions for (or the breaker, or the default
        // bound); the rest share one label.
        let hosts = match &self.admission {
            AdmissionChoice::Adaptive(config) => config.max_partitions,
            _ => self
                .circuit_breaker
                .as_ref()
                .map_or(10_000, |c| c.max_partitions),
        };
        let admission: Arc<dyn RetryAdmission> = match self.admission {
            AdmissionChoice::Adaptive(config) => Arc::new(AdaptiveAdmission::new(config)?),
            AdmissionChoice::TokenBucket(config) => Arc::new(TokenBucket::new(config)?),
            AdmissionChoice::Shared(shared) => shared,
            AdmissionChoice::None => Arc::new(NoAdmission),
        };
        let breaker = match self.circuit_breaker {
            Some(config) => Some(Arc::new(CircuitBreaker::new(config, self.clock.now())?)),
            None => None,
        };
        if let Some(hedge) = &self.hedge {
            hedge.validate()?;
        }
        let settings = Settings {
            max_attempts: self.max_attempts,
            backoff,
            throttle_backoff,
            pace_first_attempts: self.pace_first_attempts,
            deadline: self.deadline,
            attempt_timeout: self.attempt_timeout,
            min_attempt_timeout: self.min_attempt_timeout,
            min_attempt_window: self.min_attempt_window,
            max_retry_after: self.max_retry_after,
            key_header: self.key_header?,
            key_methods: self.key_methods,
            key_generator: self.key_generator,
            key_format: self.key_format,
            verdict_header: self.verdict_header?,
            deadline_header: self.deadline_header?,
            deadline_value: self.deadline.map(|d| {
                let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
                (ms, HeaderValue::from(ms))
            }),
            attempt_header: self.attempt_header?,
            hedge: self.hedge,
            replay_limit: self.replay_limit,
            replay_cap: self.replay_cap,
        };
        let rng = self
            .rng
            .unwrap_or_else(|| Box::new(rand::make_rng::<SmallRng>()));
        Ok(RetryPolicy {
            settings: Arc::new(settings),
            admission,
            breaker,
            rng: Arc::new(Mutex::new(rng)),
            sleeper: self.sleeper,
            clock: self.clock,
            metrics: Arc::new(Metrics::new(hosts)),
            classifiers: self.classifiers.into(),
            hedger: Arc::default(),
            replicas: Arc::default(),
            replay_memory: Arc::default(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decisions::{AdaptiveConfig, TokenBucketConfig};

    fn setting(b: RetryPolicyBuilder) -> &'static str {
        b.build().unwrap_err().setting()
    }

    #[test]
    fn bad_settings_are_reported_by_build_with_their_name() {
        let b = RetryPolicy::builder;
        assert_eq!(setting(b().max_attempts(0)), "max_attempts");
        assert_eq!(
            setting(b().backoff(Duration::from_secs(2), Duration::from_secs(1))),
            "backoff"
        );
        assert_eq!(
            setting(b().throttle_backoff(Duration::ZERO, Duration::from_secs(1))),
            "throttle_backoff"
        );
        assert_eq!(setting(b().deadline(Duration::ZERO)), "deadline");
        assert_eq!(
            setting(b().min_attempt_window(Duration::ZERO)),
            "min_attempt_window"
        );
        assert_eq!(
            setting(b().idempotency_header("bad header")),
            "idempotency_header"
        );
        assert_eq!(
            setting(b().token_bucket(TokenBucketConfig {
                first_attempt_deposit: -1.0,
                ..TokenBucketConfig::default()
            })),
            "budget.first_attempt_deposit"
        );
        let err = RetryPolicy::builder().multiplier(0.5).build().unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid retry configuration: backoff: backoff multiplier must be a finite number of at least 1"
        );
    }

    #[test]
    fn settings_that_cannot_work_together_are_refused() {
        // A deadline shorter than the window an attempt needs.
        let err = RetryPolicy::builder()
            .deadline(Duration::from_millis(50))
            .min_attempt_window(Duration::from_millis(100))
            .build()
            .unwrap_err();
        assert_eq!(err.setting(), "deadline");
        // A budget that can never admit a retry.
        let zero = |capacity| {
            setting(RetryPolicy::builder().token_bucket(TokenBucketConfig {
                capacity,
                ..TokenBucketConfig::default()
            }))
        };
        assert_eq!(zero(0.0), "budget.capacity");
        assert_eq!(
            setting(RetryPolicy::builder().adaptive_admission(AdaptiveConfig {
                capacity: 0.0,
                ..AdaptiveConfig::default()
            })),
            "admission.capacity"
        );
        // Equal deadline and window still build.
        assert!(RetryPolicy::builder()
            .deadline(Duration::from_millis(100))
            .min_attempt_window(Duration::from_millis(100))
            .build()
            .is_ok());
    }
}
