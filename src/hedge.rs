//! Hedging's parts (issue 17), kept out of the attempt loop: the
//! configuration, the per-host latency tracker that gives the hedge delay,
//! and the extra-load budget.
//!
//! Not wired into the engine or the middleware yet, and not exported: no
//! request is hedged. This step adds the parts, tested on their own; the
//! next sends the second copy (raced against the first, admitted by the
//! same admission as retries), adds `RetryPolicyBuilder::hedge` and the
//! per-request override, and exports `HedgeConfig`.
#![allow(dead_code)] // Called by the middleware once hedging is wired in.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use http::Method;

use crate::admission::Partition;
use crate::idempotency::is_idempotent;
use crate::runtime::lock;

/// Hedging's settings: when a second copy of a slow request is sent.
/// Off unless a policy (or a request) sets one.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct HedgeConfig {
    /// The latency percentile, per host, after which the second copy goes
    /// (0.95: p95).
    pub(crate) percentile: f64,
    /// The shortest hedge delay, whatever the percentile says.
    pub(crate) min_delay: Duration,
    /// The longest hedge delay.
    pub(crate) max_delay: Duration,
    /// Samples a host needs before it is hedged at all.
    pub(crate) min_samples: u32,
    /// Extra load allowed, as a fraction of first attempts (0.05: 5 %).
    pub(crate) max_extra_load: f64,
    /// Hedge PUT and DELETE too (GET, HEAD, OPTIONS and TRACE always are).
    pub(crate) idempotent_methods: bool,
    /// Hedge requests that carry an idempotency key (a server with Stripe
    /// semantics answers the later copy 409 "in progress").
    pub(crate) keyed: bool,
}

impl Default for HedgeConfig {
    fn default() -> Self {
        HedgeConfig {
            percentile: 0.95,
            min_delay: Duration::from_millis(1),
            max_delay: Duration::from_secs(1),
            min_samples: 100,
            max_extra_load: 0.05,
            idempotent_methods: false,
            keyed: false,
        }
    }
}

impl HedgeConfig {
    /// Whether the safety rule lets a request of `method` be hedged.
    /// An unkeyed POST (or PATCH) never is.
    pub(crate) fn may_hedge(&self, method: &Method, keyed: bool) -> bool {
        let safe = matches!(
            *method,
            Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE
        );
        safe || (is_idempotent(method) && self.idempotent_methods) || (keyed && self.keyed)
    }
}

/// Buckets of the latency histogram.
const BUCKETS: usize = 64;
/// The lower bound of the first bucket, in microseconds.
const FIRST_US: f64 = 50.0;
/// Each bucket is this much wider than the one before.
const GROWTH: f64 = 1.25;
/// Counts are halved when they reach this total: recent latency weighs most.
const WINDOW: u32 = 1000;
/// The most hedges a host may save up.
const MAX_TOKENS: f64 = 10.0;
/// Hosts tracked at most; a host beyond them is not hedged.
const MAX_HOSTS: usize = 10_000;

/// One host's recent latencies (a fixed-size histogram) and hedge budget.
#[derive(Debug, Clone)]
struct Host {
    counts: [u32; BUCKETS],
    total: u32,
    tokens: f64,
}

impl Host {
    fn new() -> Self {
        Host {
            counts: [0; BUCKETS],
            total: 0,
            tokens: 0.0,
        }
    }

    fn record(&mut self, latency: Duration) {
        self.counts[bucket(latency)] += 1;
        self.total += 1;
        if self.total >= WINDOW {
            self.total = 0;
            for c in &mut self.counts {
                *c /= 2;
                self.total += *c;
            }
        }
    }

    /// The upper bound of the bucket holding the `p` percentile.
    fn percentile(&self, p: f64) -> Duration {
        // Casts: `total` is below WINDOW, the rank at most `total`.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let rank = (f64::from(self.total) * p.clamp(0.0, 1.0)).ceil() as u32;
        let mut seen = 0;
        for (i, c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank.max(1) {
                return upper(i);
            }
        }
        upper(BUCKETS - 1)
    }
}

fn bucket(latency: Duration) -> usize {
    let us = latency.as_secs_f64() * 1e6;
    if us <= FIRST_US {
        return 0;
    }
    // Casts: the logarithm of a finite positive ratio, clamped below BUCKETS.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let i = ((us / FIRST_US).ln() / GROWTH.ln()).floor() as usize + 1;
    i.min(BUCKETS - 1)
}

fn upper(i: usize) -> Duration {
    // `i` is below BUCKETS, so the exponent fits an i32.
    let exp = i32::try_from(i).unwrap_or(i32::MAX);
    Duration::from_secs_f64(FIRST_US * GROWTH.powi(exp) / 1e6)
}

/// The per-host latency tracker and extra-load budget, shared by every
/// clone of a policy.
#[derive(Debug)]
pub(crate) struct Hedger {
    config: HedgeConfig,
    hosts: Mutex<HashMap<Partition, Host>>,
}

impl Hedger {
    pub(crate) fn new(config: HedgeConfig) -> Self {
        Hedger {
            config,
            hosts: Mutex::new(HashMap::new()),
        }
    }

    pub(crate) fn config(&self) -> &HedgeConfig {
        &self.config
    }

    /// A first attempt to `host` earns the budget its share.
    pub(crate) fn first_attempt(&self, host: Partition) {
        self.with_host(host, |h| {
            h.tokens = (h.tokens + self.config.max_extra_load).min(MAX_TOKENS);
        });
    }

    /// An attempt to `host` answered after `latency`.
    pub(crate) fn record(&self, host: Partition, latency: Duration) {
        self.with_host(host, |h| h.record(latency));
    }

    /// How long to wait before hedging a request to `host`: `None` before
    /// enough samples.
    pub(crate) fn delay(&self, host: Partition) -> Option<Duration> {
        let c = &self.config;
        let hosts = lock(&self.hosts);
        let h = hosts.get(&host)?;
        if h.total < c.min_samples {
            return None;
        }
        Some(
            h.percentile(c.percentile)
                .clamp(c.min_delay, c.max_delay.max(c.min_delay)),
        )
    }

    /// Spends one hedge of `host`'s budget: `false` when none is left.
    pub(crate) fn spend(&self, host: Partition) -> bool {
        let mut hosts = lock(&self.hosts);
        match hosts.get_mut(&host) {
            Some(h) if h.tokens >= 1.0 => {
                h.tokens -= 1.0;
                true
            }
            _ => false,
        }
    }

    fn with_host(&self, host: Partition, f: impl FnOnce(&mut Host)) {
        let mut hosts = lock(&self.hosts);
        if let Some(h) = hosts.get_mut(&host) {
            f(h);
        } else if hosts.len() < MAX_HOSTS {
            f(hosts.entry(host).or_insert_with(Host::new));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn host() -> Partition {
        Partition::named("a")
    }

    #[test]
    fn no_delay_before_enough_samples() {
        let h = Hedger::new(HedgeConfig::default());
        for _ in 0..99 {
            h.record(host(), 2 * MS);
        }
        assert_eq!(h.delay(host()), None);
        h.record(host(), 2 * MS);
        assert!(h.delay(host()).is_some());
    }

    #[test]
    fn the_delay_is_the_hosts_p95_within_a_bucket() {
        let h = Hedger::new(HedgeConfig::default());
        // 97 % at 2 ms, 3 % at 300 ms: p95 is in the fast cluster.
        for i in 0..1000 {
            h.record(host(), if i % 100 < 3 { 300 * MS } else { 2 * MS });
        }
        let d = h.delay(host()).unwrap();
        assert!(d >= 2 * MS && d <= 2 * MS * 5 / 4, "{d:?}");
        // Another host is not hedged on this one's samples.
        assert_eq!(h.delay(Partition::named("b")), None);
    }

    #[test]
    fn the_delay_keeps_its_floor_and_cap() {
        let cfg = HedgeConfig {
            min_samples: 1,
            min_delay: 5 * MS,
            max_delay: 50 * MS,
            ..HedgeConfig::default()
        };
        let h = Hedger::new(cfg);
        h.record(host(), MS / 10);
        assert_eq!(h.delay(host()), Some(5 * MS));
        let h = Hedger::new(cfg);
        h.record(host(), Duration::from_secs(9));
        assert_eq!(h.delay(host()), Some(50 * MS));
    }

    #[test]
    fn recent_latency_outweighs_old() {
        let cfg = HedgeConfig {
            min_samples: 1,
            ..HedgeConfig::default()
        };
        let h = Hedger::new(cfg);
        for _ in 0..1000 {
            h.record(host(), 100 * MS);
        }
        for _ in 0..3000 {
            h.record(host(), 2 * MS);
        }
        assert!(h.delay(host()).unwrap() < 3 * MS);
    }

    #[test]
    fn the_budget_is_five_percent_of_first_attempts() {
        let h = Hedger::new(HedgeConfig::default());
        let mut hedges = 0;
        for _ in 0..1000 {
            h.first_attempt(host());
            if h.spend(host()) {
                hedges += 1;
            }
        }
        assert!((49..=50).contains(&hedges), "{hedges}");
        assert!(!h.spend(Partition::named("b")));
    }

    #[test]
    fn only_what_the_safety_rule_lets_us_repeat() {
        let off = HedgeConfig::default();
        let on = HedgeConfig {
            idempotent_methods: true,
            keyed: true,
            ..off
        };
        assert!(off.may_hedge(&Method::GET, false));
        assert!(!off.may_hedge(&Method::PUT, false));
        assert!(on.may_hedge(&Method::PUT, false));
        assert!(!off.may_hedge(&Method::POST, true));
        assert!(on.may_hedge(&Method::POST, true));
        assert!(!on.may_hedge(&Method::POST, false));
        assert!(!on.may_hedge(&Method::PATCH, false));
    }
}
