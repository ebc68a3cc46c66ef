//! The retry policies the socket runs compare: the comparison rows'
//! backoffs with each admission, the default policy, and a policy warmed
//! by a history of successful calls.

use std::time::Duration;

use reqwest_safe_retry::admission::TokenBucketConfig;
use reqwest_safe_retry::retry::retry;
use reqwest_safe_retry::{Jitter, RetryPolicy, RetryPolicyBuilder};

use crate::AnyResult;

/// Which admission a comparison row uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admit {
    /// No admission: attempts and the deadline only.
    None,
    /// The fail-fast token bucket (10 tokens, +0.1 per first attempt,
    /// −1 per retry): the default before the adaptive admission.
    FailFast,
    /// The crate's default adaptive admission.
    Adaptive,
}

/// A comparison row's policy: `jitter` and `admit`, the given backoff,
/// attempts and deadline, a 2 s attempt timeout, seeded.
pub(crate) fn policy(
    jitter: Jitter,
    admit: Admit,
    base: Duration,
    cap: Duration,
    max_attempts: u32,
    deadline: Duration,
    seed: u64,
) -> AnyResult<RetryPolicy> {
    let builder = RetryPolicy::builder()
        .jitter(jitter)
        .backoff(base, cap)
        .max_attempts(max_attempts)
        .deadline(deadline)
        .attempt_timeout(Duration::from_secs(2))
        .seed(seed);
    Ok(with_admission(builder, admit).build()?)
}

/// A fresh admission of the given kind for each run.
fn with_admission(builder: RetryPolicyBuilder, admit: Admit) -> RetryPolicyBuilder {
    match admit {
        Admit::None => builder.no_budget(),
        Admit::FailFast => builder.token_bucket(TokenBucketConfig::default()),
        Admit::Adaptive => builder,
    }
}

/// The default policy, seeded, with the given admission.
pub(crate) fn default_policy(admit: Admit, seed: u64) -> AnyResult<RetryPolicy> {
    Ok(with_admission(RetryPolicy::builder().seed(seed), admit).build()?)
}

/// Gives `policy` a history: 1000 logical operations that succeed at
/// once, through the same admission (no socket involved).
pub(crate) async fn warm(policy: RetryPolicy) -> RetryPolicy {
    for _ in 0..1000 {
        retry(&policy, |_| async {
            reqwest_safe_retry::retry::Outcome::success(())
        })
        .await;
    }
    policy
}
