//! The default: retries that find no token wait, probes go out at a floor
//! rate while failures continue, and successes release the waiting retries
//! with slow start — each of these kept per host.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::vocabulary::{ConfigError, Partition};

use super::partitions::{Bounds, Partitions};
use super::{Admission, Grant, GrantSource};

mod admit;
mod config;
mod scope;

pub use config::AdaptiveConfig;

/// With no success of a retry for this long, the release rate halves, and
/// again for every further such interval: a rate learnt an hour ago says
/// nothing about a host now, so a fresh client behaves as a warmed one.
const RELEASE_HALF_LIFE: Duration = Duration::from_secs(1);

/// A waiter that has not asked again for this many poll intervals has gone
/// (its deadline ended it, or its caller dropped it) and no longer holds
/// its place in line.
const WAITER_STALE_POLLS: u32 = 4;

/// Adaptive retry admission, shared by every clone of a client and kept per
/// host ([`Partition`]).
///
/// A retry that has slept its backoff asks for admission for its host:
///
/// 1. a token from the host's bucket (10 to start, +0.1 per first attempt,
///    −1 per retry) admits it at once — the SRE book's budget;
/// 2. otherwise a retry *released* by recent successes admits it: released
///    retries go out at a rate that each successful retry raises by
///    `release_step` per second (slow start: exponential growth while they
///    succeed), each failed retry halves (collapse), and idle time decays;
///    the rate paces them, so a server that rejects what exceeds its
///    capacity is not hit by a burst;
/// 3. otherwise, once `probe_interval` has passed since the bucket ran dry
///    or the last probe, and no probe is in flight, it goes out as a probe
///    (the floor rate, which also serves quiet processes); a failed probe
///    doubles the interval (up to `max_probe_interval`);
/// 4. otherwise it waits and asks again, up to `max_admission_wait` and its
///    deadline. Waiting retries are served in the order they started
///    waiting (a retry holds its place from its second question, so to
///    within a poll interval).
///
/// A route of a host that answers 429 or says its quota is spent is
/// *paced* instead, until the host accepts what is sent: the route's
/// retries and first attempts go out one per release slot, at the rate it
/// is seen to accept, none before its Retry-After or reset; the bucket and
/// the probes do not apply to them meanwhile. The host's other routes are
/// not held; several routes of one caller throttled within a second under
/// one policy, none succeeding, are paced as one until calm, and a route
/// that throttles for that caller after them joins them; a route that
/// never met the limit is never held by it.
///
/// Only successes of retries release retries: a healthy history of first
/// attempts must not pre-fund the next outage, so a fresh client behaves as
/// a warmed one. A first attempt that succeeds is still evidence of recovery
/// for its host: it makes the host's next probe due at once.
///
/// Hosts never share state: one host's outage neither drains another's
/// bucket nor holds its retries, and one host's successes neither release
/// another's retries nor reset its probe back-off.
#[derive(Debug)]
pub struct AdaptiveAdmission {
    config: AdaptiveConfig,
    hosts: Partitions<Host>,
    /// Hosts whose probe interval is backed off, at most (a host dropped
    /// from the table is not subtracted): while none is, a first attempt's
    /// success has nothing to reset and takes no lock.
    backed_off: AtomicUsize,
    /// Routes being paced, at most (a host dropped from the table is not
    /// subtracted): while none is, a first attempt takes no lock to learn
    /// that it may go.
    paced: AtomicUsize,
}

/// When the next probe may go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Due {
    /// Not armed: the bucket has not run dry since the last reset.
    Unarmed,
    At(Instant),
    /// Beyond any representable instant: never.
    Never,
}

/// `now + d`, or never when that is not representable.
fn after(now: Instant, d: Duration) -> Due {
    now.checked_add(d).map_or(Due::Never, Due::At)
}

/// One host's state.
#[derive(Debug)]
struct Host {
    tokens: f64,
    /// First attempts not yet deposited: added all at once when a retry
    /// next asks, so that ten deposits of 0.1 make exactly one token.
    deposits: u64,
    /// Release rate, retries per second, as of `rate_at`.
    rate: f64,
    rate_at: Option<Instant>,
    /// The last success of a retry: the rate decays from a half-life after
    /// it.
    evidence: Option<Instant>,
    /// Released retries available now (paced by the rate).
    allowance: f64,
    /// When `allowance` was last refilled; never moves back.
    refilled: Option<Instant>,
    next_probe: Due,
    probe_interval: Duration,
    /// When the probe in flight was sent, if one is.
    probe_in_flight: Option<Instant>,
    /// Retries waiting, by when they started waiting, with when each last
    /// asked: the earliest one still asking goes first.
    waiters: BTreeMap<Instant, Instant>,
    /// Pacing, per route, while a route throttles or its quota is spent
    /// (boxed: most hosts never need it, and a host's size is what
    /// `max_partitions` bounds).
    paces: Option<Box<scope::Paces>>,
}

impl Host {
    fn fresh(c: &AdaptiveConfig) -> Self {
        Host {
            tokens: c.capacity,
            deposits: 0,
            rate: 0.0,
            rate_at: None,
            evidence: None,
            allowance: 0.0,
            refilled: None,
            next_probe: Due::Unarmed,
            probe_interval: c.probe_interval,
            probe_in_flight: None,
            waiters: BTreeMap::new(),
            paces: None,
        }
    }

    /// The release rate at `now`, decayed for the time without evidence.
    fn rate(&self, now: Instant) -> f64 {
        let Some(at) = self.rate_at else {
            return self.rate;
        };
        // Decay runs from a half-life after the last evidence, and never
        // twice over a stretch already folded into `rate`.
        let from = match self.evidence.and_then(|e| e.checked_add(RELEASE_HALF_LIFE)) {
            Some(quiet) => quiet.max(at),
            None => at,
        };
        let idle = now.saturating_duration_since(from).as_secs_f64();
        let rate = self.rate * 0.5f64.powf(idle / RELEASE_HALF_LIFE.as_secs_f64());
        if rate < 1.0 {
            0.0
        } else {
            rate
        }
    }

    /// Folds the decay up to `now` into the stored rate before changing it.
    fn settle_rate(&mut self, now: Instant) {
        let at = self.rate_at.map_or(now, |at| at.max(now));
        self.rate = self.rate(at);
        self.rate_at = Some(at);
    }

    /// Adds what the rate earned since the last refill; a burst is at most
    /// one poll interval's worth (and at least one retry). A `now` read
    /// before another thread's later one credits nothing, and never moves
    /// the refill time back.
    fn refill(&mut self, now: Instant, poll: Duration) {
        let rate = self.rate(now);
        if let Some(then) = self.refilled {
            let earned = rate * now.saturating_duration_since(then).as_secs_f64();
            let burst = (rate * poll.as_secs_f64()).max(1.0);
            self.allowance = (self.allowance + earned).min(burst);
            self.refilled = Some(then.max(now));
        } else {
            self.refilled = Some(now);
        }
    }

    /// Forgets the waiters at the head of the line that stopped asking.
    fn prune_waiters(&mut self, now: Instant, stale: Duration) {
        while let Some((&arrival, &seen)) = self.waiters.first_key_value() {
            if now.saturating_duration_since(seen) <= stale {
                break;
            }
            self.waiters.remove(&arrival);
        }
    }

    /// Deposits the pending first attempts. Adding them at once is adding
    /// them one by one: the cap only ever lowers a total that grows.
    fn deposit(&mut self, c: &AdaptiveConfig) {
        if self.deposits > 0 {
            #[allow(clippy::cast_precision_loss)] // exact below 2^53 first attempts
            let deposit = self.deposits as f64 * c.first_attempt_deposit;
            self.tokens = (self.tokens + deposit).min(c.capacity);
            self.deposits = 0;
        }
    }
}

impl AdaptiveAdmission {
    /// A new admission; each host starts with a full bucket.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming the setting when a number is negative or not
    /// finite, the capacity or a cost is zero, an interval is zero, the
    /// largest probe interval is below the first, the release step is
    /// between 0 and 1 or the highest release rate below 1 (a rate below
    /// one retry per second only ever releases probes), or no host may be
    /// kept.
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
        let step = finite("admission.release_step", config.release_step)?;
        if step != 0.0 && step < 1.0 {
            return Err(ConfigError::named(
                "admission.release_step",
                "must be 0 (only probes) or at least 1 per second",
            ));
        }
        if finite("admission.max_release_rate", config.max_release_rate)? < 1.0 {
            return Err(ConfigError::named(
                "admission.max_release_rate",
                "must be at least 1 per second",
            ));
        }
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
        if config.max_partitions == 0 {
            return Err(ConfigError::named(
                "admission.max_partitions",
                "must be at least 1",
            ));
        }
        Ok(AdaptiveAdmission {
            hosts: Partitions::new(Bounds {
                max: config.max_partitions,
                idle: config.partition_idle_expiry,
            }),
            backed_off: AtomicUsize::new(0),
            paced: AtomicUsize::new(0),
            config,
        })
    }

    /// Sets a host's probe interval, counting the hosts backed off.
    fn set_probe_interval(&self, h: &mut Host, interval: Duration) {
        let base = self.config.probe_interval;
        match (h.probe_interval > base, interval > base) {
            (false, true) => {
                self.backed_off.fetch_add(1, Ordering::Relaxed);
            }
            (true, false) => {
                self.backed_off.fetch_sub(1, Ordering::Relaxed);
            }
            _ => {}
        }
        h.probe_interval = interval;
    }

    /// Runs `f` on a host's state, made fresh if the host has none.
    fn host<R>(&self, p: Partition, now: Instant, f: impl FnOnce(&mut Host) -> R) -> R {
        self.hosts.with(p, now, || Host::fresh(&self.config), f)
    }

    /// Reads a host's state; a host with none reads as fresh.
    fn read<R>(&self, p: Partition, f: impl Fn(&Host) -> R) -> R {
        self.hosts
            .peek(p, &f)
            .unwrap_or_else(|| f(&Host::fresh(&self.config)))
    }

    /// The settings.
    pub fn config(&self) -> &AdaptiveConfig {
        &self.config
    }

    /// Tokens in a host's bucket now.
    pub fn tokens(&self, partition: Partition) -> f64 {
        self.read(partition, |h| {
            #[allow(clippy::cast_precision_loss)] // exact below 2^53 first attempts
            let pending = h.deposits as f64 * self.config.first_attempt_deposit;
            (h.tokens + pending).min(self.config.capacity)
        })
    }

    /// The rate, retries per second, at which evidence of recovery
    /// releases a host's waiting retries at `now` (0 while failures
    /// continue).
    pub fn release_rate(&self, partition: Partition, now: Instant) -> f64 {
        self.read(partition, |h| h.rate(now))
    }

    /// The interval before a host's next probe after its last one.
    pub fn probe_interval(&self, partition: Partition) -> Duration {
        self.read(partition, |h| h.probe_interval)
    }

    /// A hedge is paid from the bucket alone, and only while no retry
    /// waits and the host is not paced: never with a probe or a released
    /// retry, so that once an outage has drained the bucket hedging adds
    /// nothing, and never ahead of a retry in line. It never waits either
    /// (a hedge that is late is useless), so it takes no place in line.
    fn admit_hedge(
        h: &mut Host,
        c: &AdaptiveConfig,
        paced: bool,
        now: Instant,
        stale: Duration,
    ) -> Admission {
        if paced {
            return Admission::Refuse;
        }
        h.deposit(c);
        h.prune_waiters(now, stale);
        if h.waiters.is_empty() && h.tokens >= c.retry_cost {
            h.tokens -= c.retry_cost;
            return Admission::Admit(Grant::new(GrantSource::Hedge, c.retry_cost));
        }
        Admission::Refuse
    }

    /// Hosts whose state is kept now (at most `max_partitions`).
    pub fn partitions(&self) -> usize {
        self.hosts.len()
    }
}

#[cfg(test)]
mod tests;
