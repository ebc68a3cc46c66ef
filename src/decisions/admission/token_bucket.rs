//! The plain token bucket: a retry that finds it empty fails at once; and
//! no admission at all.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use super::{
    Admission, AttemptRecord, AttemptResult, Grant, GrantSource, Partition, RetryAdmission,
    RetryKind, RetryRequest,
};
use crate::vocabulary::ConfigError;

/// Tokens are counted in thousandths so that the bucket is one atomic integer.
const SCALE: f64 = 1000.0;

/// The settings of a [`TokenBucket`], by name.
///
/// ```
/// use reqwest_safe_retry::admission::{TokenBucket, TokenBucketConfig};
///
/// let bucket = TokenBucket::new(TokenBucketConfig {
///     capacity: 20.0,
///     ..TokenBucketConfig::default()
/// })
/// .unwrap();
/// assert_eq!(bucket.balance(), 20.0);
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenBucketConfig {
    /// Tokens at the start, and the most the bucket holds. Default 10.
    pub capacity: f64,
    /// Tokens each first attempt deposits (the retry ratio). Default 0.1.
    pub first_attempt_deposit: f64,
    /// Tokens deposited by a first attempt that succeeds. Default 0 (AWS: 1).
    pub success_deposit: f64,
    /// Cost of a retry after a transient failure. Default 1 (AWS: 14).
    pub retry_cost: f64,
    /// Cost of a retry after a timeout. Default 1.
    pub timeout_cost: f64,
    /// Cost of a retry after a throttling answer (429). Default 1 (AWS: 5).
    pub throttled_cost: f64,
    /// Give a retry's cost back when it succeeds. Default no (AWS: yes).
    pub refund_on_success: bool,
}

impl Default for TokenBucketConfig {
    fn default() -> Self {
        TokenBucketConfig {
            capacity: 10.0,
            first_attempt_deposit: 0.1,
            success_deposit: 0.0,
            retry_cost: 1.0,
            timeout_cost: 1.0,
            throttled_cost: 1.0,
            refund_on_success: false,
        }
    }
}

/// Converts a setting to milli-tokens, naming it when it is out of range.
pub(crate) fn to_milli(setting: &'static str, v: f64) -> Result<u64, ConfigError> {
    if !(0.0..=1e12).contains(&v) {
        return Err(ConfigError::named(
            setting,
            "must be finite, non-negative and below 1e12",
        ));
    }
    // In range, so the cast cannot truncate beyond rounding.
    Ok((v * SCALE).round() as u64)
}

/// A thread-safe token bucket that fails fast; cheap (one atomic).
///
/// It is one quota for the whole client, whatever the partition, as the
/// AWS SDKs' retry quota is: choose the adaptive admission to keep one
/// host's outage from spending another host's retries.
///
/// ```
/// use reqwest_safe_retry::admission::{TokenBucket, TokenBucketConfig};
///
/// let budget = TokenBucket::new(TokenBucketConfig {
///     capacity: 2.0,
///     ..TokenBucketConfig::default()
/// })
/// .unwrap();
/// assert!(budget.try_withdraw(1.0));
/// assert!(budget.try_withdraw(1.0));
/// assert!(!budget.try_withdraw(1.0)); // empty: fail fast
/// for _ in 0..10 {
///     budget.deposit(0.1); // ten first attempts earn one retry
/// }
/// assert!(budget.try_withdraw(1.0));
/// ```
#[derive(Debug)]
pub struct TokenBucket {
    /// Milli-tokens now in the bucket.
    balance: AtomicU64,
    capacity: u64,
    first_attempt_deposit: u64,
    success_deposit: u64,
    retry_cost: u64,
    timeout_cost: u64,
    throttled_cost: u64,
    refund_on_success: bool,
}

impl TokenBucket {
    /// A full bucket. Tokens are counted in thousandths: values are rounded
    /// to 0.001.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming the setting when a value is negative or not
    /// finite, when the capacity is zero, or when a retry costs nothing (a
    /// budget that can never run out is no budget — turn it off instead).
    pub fn new(config: TokenBucketConfig) -> Result<Self, ConfigError> {
        let capacity = to_milli("budget.capacity", config.capacity)?;
        if capacity == 0 {
            return Err(ConfigError::named(
                "budget.capacity",
                "must hold at least 0.001 tokens (turn the budget off instead)",
            ));
        }
        let costs = [
            ("budget.retry_cost", config.retry_cost),
            ("budget.timeout_cost", config.timeout_cost),
            ("budget.throttled_cost", config.throttled_cost),
        ];
        let mut milli = [0u64; 3];
        for (slot, (name, value)) in milli.iter_mut().zip(costs) {
            *slot = to_milli(name, value)?;
            if *slot == 0 {
                return Err(ConfigError::named(
                    name,
                    "a retry must cost at least 0.001 tokens",
                ));
            }
        }
        Ok(TokenBucket {
            balance: AtomicU64::new(capacity),
            capacity,
            first_attempt_deposit: to_milli(
                "budget.first_attempt_deposit",
                config.first_attempt_deposit,
            )?,
            success_deposit: to_milli("budget.success_deposit", config.success_deposit)?,
            retry_cost: milli[0],
            timeout_cost: milli[1],
            throttled_cost: milli[2],
            refund_on_success: config.refund_on_success,
        })
    }

    fn add(&self, milli: u64) {
        if milli == 0 {
            return;
        }
        let _ = self
            .balance
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |b| {
                Some(b.saturating_add(milli).min(self.capacity))
            });
    }

    fn take(&self, milli: u64) -> bool {
        self.balance
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |b| {
                b.checked_sub(milli)
            })
            .is_ok()
    }

    /// Adds `tokens`, up to the capacity.
    pub fn deposit(&self, tokens: f64) {
        self.add(to_milli("", tokens).unwrap_or(0));
    }

    /// Spends `tokens`; `false` (and nothing spent) when the bucket holds
    /// less.
    pub fn try_withdraw(&self, tokens: f64) -> bool {
        to_milli("", tokens).is_ok_and(|m| self.take(m))
    }

    /// Tokens in the bucket now.
    pub fn balance(&self) -> f64 {
        self.balance.load(Ordering::Acquire) as f64 / SCALE
    }

    /// The most tokens the bucket holds.
    pub fn capacity(&self) -> f64 {
        self.capacity as f64 / SCALE
    }

    fn cost(&self, kind: RetryKind) -> u64 {
        match kind {
            RetryKind::Timeout => self.timeout_cost,
            RetryKind::Throttled => self.throttled_cost,
            _ => self.retry_cost,
        }
    }
}

impl RetryAdmission for TokenBucket {
    fn first_attempt(&self, _partition: Partition, _now: Instant) {
        self.add(self.first_attempt_deposit);
    }

    fn may_admit(&self, _partition: Partition, kind: RetryKind) -> bool {
        self.balance.load(Ordering::Acquire) >= self.cost(kind)
    }

    fn admit(&self, _partition: Partition, retry: RetryRequest, _now: Instant) -> Admission {
        let cost = self.cost(retry.kind());
        if self.take(cost) {
            Admission::Admit(Grant::new(GrantSource::Token, cost as f64 / SCALE))
        } else {
            Admission::Refuse
        }
    }

    fn record(&self, _partition: Partition, attempt: AttemptRecord, _now: Instant) {
        if attempt.result() != AttemptResult::Success {
            return;
        }
        match attempt.grant() {
            None if attempt.attempt() == 1 => self.add(self.success_deposit),
            Some(grant) if self.refund_on_success => {
                self.add(to_milli("", grant.cost()).unwrap_or(0));
            }
            _ => {}
        }
    }
}

/// No admission control: every retry goes out (attempts and the deadline
/// still bound them). For comparison, and for loops such as a reconnect
/// where one caller retries alone.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoAdmission;

impl RetryAdmission for NoAdmission {
    fn first_attempt(&self, _partition: Partition, _now: Instant) {}

    fn admit(&self, _partition: Partition, _retry: RetryRequest, _now: Instant) -> Admission {
        Admission::Admit(Grant::new(GrantSource::Free, 0.0))
    }

    fn record(&self, _partition: Partition, _attempt: AttemptRecord, _now: Instant) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bucket(capacity: f64, deposit: f64) -> TokenBucket {
        TokenBucket::new(TokenBucketConfig {
            capacity,
            first_attempt_deposit: deposit,
            ..TokenBucketConfig::default()
        })
        .unwrap()
    }

    #[test]
    fn refuses_nonsense_and_names_the_setting() {
        let err = |c: TokenBucketConfig| TokenBucket::new(c).unwrap_err().setting();
        let d = TokenBucketConfig::default();
        assert_eq!(
            err(TokenBucketConfig {
                capacity: -1.0,
                ..d
            }),
            "budget.capacity"
        );
        assert_eq!(
            err(TokenBucketConfig { capacity: 0.0, ..d }),
            "budget.capacity"
        );
        assert_eq!(
            err(TokenBucketConfig {
                first_attempt_deposit: f64::NAN,
                ..d
            }),
            "budget.first_attempt_deposit"
        );
        assert_eq!(
            err(TokenBucketConfig {
                retry_cost: 0.0,
                ..d
            }),
            "budget.retry_cost"
        );
    }

    #[test]
    fn deposits_stop_at_capacity() {
        let b = bucket(1.0, 0.4);
        for _ in 0..10 {
            b.first_attempt(Partition::SINGLE, Instant::now());
        }
        assert_eq!(b.balance(), 1.0);
    }

    #[test]
    fn timeouts_and_throttling_are_priced_apart() {
        let b = TokenBucket::new(TokenBucketConfig {
            capacity: 15.0,
            timeout_cost: 10.0,
            throttled_cost: 5.0,
            ..TokenBucketConfig::default()
        })
        .unwrap();
        let now = Instant::now();
        let ask = |kind| {
            b.admit(
                Partition::SINGLE,
                RetryRequest::new(kind, Duration::ZERO),
                now,
            )
        };
        assert!(matches!(ask(RetryKind::Timeout), Admission::Admit(_)));
        assert!(!b.may_admit(Partition::SINGLE, RetryKind::Timeout));
        assert_eq!(ask(RetryKind::Timeout), Admission::Refuse);
        assert!(matches!(ask(RetryKind::Throttled), Admission::Admit(_)));
        assert_eq!(ask(RetryKind::Transient), Admission::Refuse);
    }

    use std::time::Duration;

    #[test]
    fn concurrent_withdrawals_never_overspend() {
        let b = std::sync::Arc::new(bucket(100.0, 0.0));
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let b = b.clone();
                std::thread::spawn(move || (0..1000).filter(|_| b.try_withdraw(1.0)).count())
            })
            .collect();
        let total: usize = handles.into_iter().map(|h| h.join().unwrap()).sum();
        assert_eq!(total, 100);
        assert_eq!(b.balance(), 0.0);
    }
}
