//! The presets: the default policy, gRPC's connection backoff and the AWS
//! SDKs' standard retry mode, each a builder to change further.

use std::time::Duration;

use crate::decisions::{Jitter, TokenBucketConfig};
use crate::engine::RetryPolicy;

use super::RetryPolicyBuilder;

impl RetryPolicy {
    /// A builder starting from the defaults.
    pub fn builder() -> RetryPolicyBuilder {
        RetryPolicyBuilder::new()
    }

    /// gRPC's connection backoff, for reconnect loops: 1 s initial delay,
    /// ×1.6, ±20 % jitter, 120 s cap, each connect attempt given at least
    /// max(20 s, the backoff that follows it) (see
    /// [`RetryPolicyBuilder::min_attempt_timeout`]),
    /// no attempt limit, no deadline and no request budget. Each call of
    /// [`crate::retry::retry`] starts again from the initial delay, as gRPC does
    /// after a successful connection.
    pub fn grpc_connection_backoff() -> RetryPolicyBuilder {
        RetryPolicyBuilder::new()
            .max_attempts(u32::MAX)
            .backoff(Duration::from_secs(1), Duration::from_secs(120))
            .multiplier(1.6)
            .jitter(Jitter::Proportional(0.2))
            .no_deadline()
            .min_attempt_timeout(Duration::from_secs(20))
            .no_budget()
    }

    /// The AWS SDKs' "standard" retry mode as of 2026
    /// (`AWS_NEW_RETRIES_2026`): 3 attempts; full jitter from 50 ms after a
    /// transient error and from 1 s after a throttling answer (429), capped
    /// at 20 s; a quota of 500 tokens where a transient retry costs 14 and a
    /// throttled one 5, the cost refunded when the retry succeeds, and one
    /// token credited for a success that needed no retry. The quota fails
    /// fast when empty, as AWS's does.
    pub fn aws_standard() -> RetryPolicyBuilder {
        RetryPolicyBuilder::new()
            .max_attempts(3)
            .backoff(Duration::from_millis(50), Duration::from_secs(20))
            .throttle_backoff(Duration::from_secs(1), Duration::from_secs(20))
            .jitter(Jitter::Full)
            .token_bucket(TokenBucketConfig {
                capacity: 500.0,
                first_attempt_deposit: 0.0,
                success_deposit: 1.0,
                retry_cost: 14.0,
                timeout_cost: 14.0,
                throttled_cost: 5.0,
                refund_on_success: true,
            })
    }
}

impl Default for RetryPolicy {
    /// 3 attempts; full jitter from 100 ms, ×2, capped at 10 s; a 30 s
    /// deadline; Retry-After honoured up to 60 s; adaptive retry admission
    /// ([`crate::admission::AdaptiveConfig::default`]); Idempotency-Key (UUID v4, bare)
    /// on POST and PATCH; `Stripe-Should-Retry` honoured; the time left sent
    /// downstream as `Request-Timeout-Ms`.
    fn default() -> Self {
        RetryPolicyBuilder::new()
            .build()
            .unwrap_or_else(|_| unreachable!("the default settings are valid"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_grpc_preset_matches_its_source() {
        let grpc = RetryPolicy::grpc_connection_backoff().build().unwrap();
        assert_eq!(grpc.backoff().base(), Duration::from_secs(1));
        assert_eq!(grpc.backoff().cap(), Duration::from_secs(120));
        assert_eq!(grpc.backoff().multiplier(), 1.6);
        assert_eq!(grpc.backoff().jitter(), Jitter::Proportional(0.2));
        assert!(grpc.deadline().is_none());
    }
}
