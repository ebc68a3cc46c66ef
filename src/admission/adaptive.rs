//! The default: retries that find no token wait, probes go out at a floor
//! rate while failures continue, and successes release the waiting retries
//! with slow start.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::{
    Admission, AttemptRecord, AttemptResult, Grant, GrantSource, RetryAdmission, RetryRequest,
};
use crate::error::ConfigError;
use crate::runtime::lock;

/// The settings of an [`AdaptiveAdmission`], by name.
///
/// The defaults hold the three lines of BENCHMARKS.md: a 1 s blip of 400
/// calls ≥ 97 % succeed at ≤ 2.5× the traffic, a long outage stays ≤ 1.15×,
/// and a quiet process is never refused a retry.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdaptiveConfig {
    /// Tokens at the start and the most the bucket holds: the burst of
    /// retries admitted at once. Default 10.
    pub capacity: f64,
    /// Tokens each first attempt deposits: retries stay near this fraction
    /// of traffic in an outage. Default 0.1.
    pub first_attempt_deposit: f64,
    /// Cost of a retry paid from the bucket. Default 1.
    pub retry_cost: f64,
    /// The floor rate: with the bucket empty, one retry per this interval
    /// goes out as a probe. Default 250 ms.
    pub probe_interval: Duration,
    /// Each failed probe doubles the interval (counted from its failure) up
    /// to this, so a long outage costs a handful of probes; any success
    /// resets it. Default 16 s.
    pub max_probe_interval: Duration,
    /// Slow start: each successful retry raises the rate at which waiting
    /// retries are released by this many per second (so the rate grows
    /// exponentially while retries succeed); each failed retry halves it.
    /// Default 10.
    pub release_step: f64,
    /// The highest release rate, retries per second. Default 10 000.
    pub max_release_rate: f64,
    /// How often a waiting retry asks again. Default 20 ms.
    pub poll_interval: Duration,
    /// The longest a retry waits for admission before the operation ends
    /// with `budget_exhausted` (the deadline bounds it too). Default 10 s.
    pub max_admission_wait: Duration,
}

impl Default for AdaptiveConfig {
    fn default() -> Self {
        AdaptiveConfig {
            capacity: 10.0,
            first_attempt_deposit: 0.1,
            retry_cost: 1.0,
            probe_interval: Duration::from_millis(250),
            max_probe_interval: Duration::from_secs(16),
            release_step: 10.0,
            max_release_rate: 10_000.0,
            poll_interval: Duration::from_millis(20),
            max_admission_wait: Duration::from_secs(10),
        }
    }
}

/// Adaptive retry admission, shared by every clone of a client.
///
/// A retry that has slept its backoff asks for admission:
///
/// 1. a token from the bucket (10 to start, +0.1 per first attempt, −1 per
///    retry) admits it at once — the SRE book's budget;
/// 2. otherwise a retry *released* by recent successes admits it: released
///    retries go out at a rate that each successful retry raises by
///    `release_step` per second (slow start: exponential growth while they
///    succeed) and each failed retry halves (collapse); the rate paces them,
///    so a server that rejects what exceeds its capacity is not hit by a
///    burst;
/// 3. otherwise, if no probe went out for `probe_interval`, it goes out as
///    a probe (the floor rate, which also serves quiet processes); a failed
///    probe doubles the interval (up to `max_probe_interval`);
/// 4. otherwise it waits and asks again, up to `max_admission_wait` and its
///    deadline.
///
/// Only successes of retries release retries: a healthy history of first
/// attempts must not pre-fund the next outage, so a fresh client behaves as
/// a warmed one. A first attempt that succeeds is still evidence of recovery:
/// it makes the next probe due at once.
#[derive(Debug)]
pub struct AdaptiveAdmission {
    config: AdaptiveConfig,
    state: Mutex<State>,
    /// First attempts not yet deposited: counted without the lock (the
    /// success path takes no lock), deposited when a retry next asks.
    deposits: AtomicU64,
    /// Whether failed probes have backed the probe interval off, so that a
    /// first attempt's success takes the lock only when it has work to do.
    backed_off: AtomicBool,
}

#[derive(Debug)]
struct State {
    tokens: f64,
    /// Release rate, retries per second.
    rate: f64,
    /// Released retries available now (paced by `rate`).
    allowance: f64,
    /// When `allowance` was last refilled.
    refilled: Option<Instant>,
    next_probe: Option<Instant>,
    probe_interval: Duration,
}

impl State {
    /// Adds what `rate` earned since the last refill; a burst is at most
    /// one poll interval's worth (and at least one retry).
    fn refill(&mut self, now: Instant, poll: Duration) {
        if let Some(then) = self.refilled {
            let earned = self.rate * now.saturating_duration_since(then).as_secs_f64();
            let burst = (self.rate * poll.as_secs_f64()).max(1.0);
            self.allowance = (self.allowance + earned).min(burst);
        }
        self.refilled = Some(now);
    }
}

impl AdaptiveAdmission {
    /// A new admission with a full bucket.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming the setting when a number is negative or not
    /// finite, the capacity or a cost is zero, an interval is zero, or the
    /// largest probe interval is below the first.
    pub fn new(config: AdaptiveConfig) -> Result<Self, ConfigError> {
        let finite = |name: &'static str, v: f64| {
            if v.is_finite() && v >= 0.0 {
                Ok(v)
            } else {
                Err(ConfigError::named(name, "must be finite and non-negative"))
            }
        };
        if finite("admission.capacity", config.capacity)? == 0.0 {
            return Err(ConfigError::named(
                "admission.capacity",
                "must be greater than zero (turn admission off instead)",
            ));
        }
        finite(
            "admission.first_attempt_deposit",
            config.first_attempt_deposit,
        )?;
        finite("admission.release_step", config.release_step)?;
        finite("admission.max_release_rate", config.max_release_rate)?;
        if finite("admission.retry_cost", config.retry_cost)? == 0.0 {
            return Err(ConfigError::named(
                "admission.retry_cost",
                "must be greater than zero",
            ));
        }
        for (name, d) in [
            ("admission.probe_interval", config.probe_interval),
            ("admission.poll_interval", config.poll_interval),
        ] {
            if d.is_zero() {
                return Err(ConfigError::named(name, "must be greater than zero"));
            }
        }
        if config.max_probe_interval < config.probe_interval {
            return Err(ConfigError::named(
                "admission.max_probe_interval",
                "must not be below probe_interval",
            ));
        }
        Ok(AdaptiveAdmission {
            state: Mutex::new(State {
                tokens: config.capacity,
                rate: 0.0,
                allowance: 0.0,
                refilled: None,
                next_probe: None,
                probe_interval: config.probe_interval,
            }),
            deposits: AtomicU64::new(0),
            backed_off: AtomicBool::new(false),
            config,
        })
    }

    /// Locks the state with every pending first attempt deposited. Adding
    /// them at once is adding them one by one: the cap only ever lowers a
    /// total that grows.
    fn locked(&self) -> std::sync::MutexGuard<'_, State> {
        let mut s = lock(&self.state);
        let n = self.deposits.swap(0, Ordering::Relaxed);
        if n > 0 {
            #[allow(clippy::cast_precision_loss)] // exact below 2^53 first attempts
            let deposit = n as f64 * self.config.first_attempt_deposit;
            s.tokens = (s.tokens + deposit).min(self.config.capacity);
        }
        s
    }

    /// Sets the probe interval and whether it is backed off.
    fn set_probe_interval(&self, s: &mut State, interval: Duration) {
        s.probe_interval = interval;
        self.backed_off
            .store(interval > self.config.probe_interval, Ordering::Relaxed);
    }

    /// The settings.
    pub fn config(&self) -> &AdaptiveConfig {
        &self.config
    }

    /// Tokens in the bucket now.
    pub fn tokens(&self) -> f64 {
        self.locked().tokens
    }

    /// The rate, retries per second, at which evidence of recovery
    /// releases waiting retries now (0 while failures continue).
    pub fn release_rate(&self) -> f64 {
        lock(&self.state).rate
    }

    /// The interval before the next probe after the last one.
    pub fn probe_interval(&self) -> Duration {
        lock(&self.state).probe_interval
    }
}

impl RetryAdmission for AdaptiveAdmission {
    fn first_attempt(&self, _now: Instant) {
        self.deposits.fetch_add(1, Ordering::Relaxed);
    }

    fn admit(&self, retry: RetryRequest, now: Instant) -> Admission {
        let c = &self.config;
        let mut s = self.locked();
        if s.tokens >= c.retry_cost {
            s.tokens -= c.retry_cost;
            return Admission::Admit(Grant::new(GrantSource::Token, c.retry_cost));
        }
        s.refill(now, c.poll_interval);
        if s.allowance >= 1.0 {
            s.allowance -= 1.0;
            return Admission::Admit(Grant::new(GrantSource::Released, 0.0));
        }
        match s.next_probe {
            Some(due) if now < due => {
                let left = c.max_admission_wait.saturating_sub(retry.waited());
                if left.is_zero() {
                    return Admission::Refuse;
                }
                let mut wait = c.poll_interval.min(due - now).min(left);
                if s.rate > 0.0 {
                    // Until the next released retry, at least 1 ms.
                    let next = Duration::from_secs_f64((1.0 - s.allowance) / s.rate);
                    wait = wait.min(next.max(Duration::from_millis(1)));
                }
                Admission::Wait(wait)
            }
            _ => {
                // Far-future instants are not representable: then no probe
                // is due again, and waiting retries end at their bound.
                s.next_probe = now.checked_add(s.probe_interval).or(Some(now));
                Admission::Admit(Grant::new(GrantSource::Probe, 0.0))
            }
        }
    }

    fn record(&self, attempt: AttemptRecord, now: Instant) {
        let c = &self.config;
        match (attempt.result(), attempt.grant()) {
            (AttemptResult::Success, Some(_)) => {
                // Slow start: successes per second grow with the rate, so
                // the rate grows exponentially while retries succeed.
                let mut s = self.locked();
                s.refill(now, c.poll_interval);
                s.rate = (s.rate + c.release_step).min(c.max_release_rate);
                self.set_probe_interval(&mut s, c.probe_interval);
            }
            // The service answers again: probe at once rather than at the
            // end of a backed-off interval. A first attempt that succeeds
            // while nothing is backed off (the usual case) takes no lock.
            (AttemptResult::Success, None) if self.backed_off.load(Ordering::Relaxed) => {
                let mut s = self.locked();
                if s.probe_interval > c.probe_interval {
                    self.set_probe_interval(&mut s, c.probe_interval);
                    s.next_probe = Some(now);
                }
            }
            (AttemptResult::Failure, Some(grant)) => {
                let mut s = self.locked();
                // Collapse: each failed retry halves the release rate; below
                // one retry per second only probes remain.
                s.refill(now, c.poll_interval);
                s.rate /= 2.0;
                if s.rate < 1.0 {
                    s.rate = 0.0;
                    s.allowance = 0.0;
                }
                if grant.is_probe() {
                    let backed_off = s.probe_interval.saturating_mul(2).min(c.max_probe_interval);
                    self.set_probe_interval(&mut s, backed_off);
                    s.next_probe = now.checked_add(s.probe_interval).or(Some(now));
                }
            }
            _ => {}
        }
    }
}
