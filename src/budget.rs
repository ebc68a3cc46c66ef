//! The client-wide retry budget: a token bucket shared by every clone of the
//! client.
//!
//! ```
//! use reqwest_safe_retry::RetryBudget;
//!
//! let budget = RetryBudget::new(2.0, 0.1, 1.0).unwrap();
//! assert!(budget.try_withdraw_retry());
//! assert!(budget.try_withdraw_retry());
//! assert!(!budget.try_withdraw_retry()); // empty: fail fast
//! for _ in 0..10 {
//!     budget.deposit(); // ten first attempts earn one retry
//! }
//! assert!(budget.try_withdraw_retry());
//! ```
//!
//! # Why a budget and not only a maximum of attempts
//!
//! `max_attempts = 3` caps one call, not the fleet: during an outage every
//! call makes three attempts and the failing service sees three times its
//! normal load exactly when it can least take it — and with retries at `k`
//! layers of a call chain, `3^k` times. A budget ties retries to real traffic:
//! each first attempt deposits a fraction of a token (10 % by default) and
//! each retry spends a whole one, so retries stay near a tenth of traffic
//! however long the outage lasts (Google SRE book, ch. 22; gRPC retry
//! throttling; Finagle and Envoy ship the same idea on by default).

use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::ConfigError;

/// Tokens are counted in thousandths so that the bucket is one atomic integer.
const SCALE: f64 = 1000.0;

/// A thread-safe token bucket; cheap (one atomic) and shared through `Arc`.
#[derive(Debug)]
pub struct RetryBudget {
    /// Milli-tokens now in the bucket.
    balance: AtomicU64,
    capacity: u64,
    deposit: u64,
    retry_cost: u64,
    timeout_cost: u64,
}

impl RetryBudget {
    /// A full bucket of `capacity` tokens; each first attempt deposits
    /// `deposit`, each retry costs `retry_cost` (timeouts cost the same).
    /// Tokens are counted in thousandths: values are rounded to 0.001.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] when a value is negative, not finite, or when the cost
    /// of a retry is zero (a budget that can never run out is no budget —
    /// turn it off instead).
    pub fn new(capacity: f64, deposit: f64, retry_cost: f64) -> Result<Self, ConfigError> {
        RetryBudget::with_timeout_cost(capacity, deposit, retry_cost, retry_cost)
    }

    /// Like [`RetryBudget::new`] with a separate cost for a retry after a
    /// timeout (the AWS SDK charges 10 tokens there instead of 5).
    ///
    /// # Errors
    ///
    /// As [`RetryBudget::new`].
    pub fn with_timeout_cost(
        capacity: f64,
        deposit: f64,
        retry_cost: f64,
        timeout_cost: f64,
    ) -> Result<Self, ConfigError> {
        let to_milli = |v: f64| -> Result<u64, ConfigError> {
            if !(0.0..=1e12).contains(&v) {
                return Err(ConfigError::new(
                    "retry budget values must be finite, non-negative and below 1e12",
                ));
            }
            // In range, so the cast cannot truncate beyond rounding.
            Ok((v * SCALE).round() as u64)
        };
        let capacity = to_milli(capacity)?;
        let deposit = to_milli(deposit)?;
        let retry_cost = to_milli(retry_cost)?;
        let timeout_cost = to_milli(timeout_cost)?;
        if retry_cost == 0 || timeout_cost == 0 {
            return Err(ConfigError::new(
                "a retry must cost at least 0.001 tokens (tokens are counted in thousandths)",
            ));
        }
        Ok(RetryBudget {
            balance: AtomicU64::new(capacity),
            capacity,
            deposit,
            retry_cost,
            timeout_cost,
        })
    }

    /// Credits a first attempt: adds the deposit, up to the capacity.
    pub fn deposit(&self) {
        let _ = self
            .balance
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |b| {
                Some(b.saturating_add(self.deposit).min(self.capacity))
            });
    }

    /// Spends the cost of one retry; `false` (and nothing spent) when the
    /// bucket holds less.
    pub fn try_withdraw_retry(&self) -> bool {
        self.try_withdraw(self.retry_cost)
    }

    /// Spends the cost of a retry after a timeout.
    pub fn try_withdraw_timeout(&self) -> bool {
        self.try_withdraw(self.timeout_cost)
    }

    fn try_withdraw(&self, cost: u64) -> bool {
        self.balance
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |b| b.checked_sub(cost))
            .is_ok()
    }

    /// Tokens in the bucket now.
    pub fn balance(&self) -> f64 {
        self.balance.load(Ordering::Acquire) as f64 / SCALE
    }

    /// The most tokens the bucket holds.
    pub fn capacity(&self) -> f64 {
        self.capacity as f64 / SCALE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_nonsense() {
        assert!(RetryBudget::new(-1.0, 0.1, 1.0).is_err());
        assert!(RetryBudget::new(10.0, f64::NAN, 1.0).is_err());
        assert!(RetryBudget::new(10.0, 0.1, 0.0).is_err());
    }

    #[test]
    fn deposits_stop_at_capacity() {
        let b = RetryBudget::new(1.0, 0.4, 1.0).unwrap();
        for _ in 0..10 {
            b.deposit();
        }
        assert_eq!(b.balance(), 1.0);
    }

    #[test]
    fn timeouts_cost_more_when_configured() {
        let b = RetryBudget::with_timeout_cost(15.0, 0.0, 5.0, 10.0).unwrap();
        assert!(b.try_withdraw_timeout());
        assert!(!b.try_withdraw_timeout());
        assert!(b.try_withdraw_retry());
        assert!(!b.try_withdraw_retry());
    }

    #[test]
    fn concurrent_withdrawals_never_overspend() {
        let b = std::sync::Arc::new(RetryBudget::new(100.0, 0.0, 1.0).unwrap());
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let b = b.clone();
                std::thread::spawn(move || (0..1000).filter(|_| b.try_withdraw_retry()).count())
            })
            .collect();
        let total: usize = handles.into_iter().map(|h| h.join().unwrap()).sum();
        assert_eq!(total, 100);
        assert_eq!(b.balance(), 0.0);
    }
}
