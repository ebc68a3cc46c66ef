//! Hedging's unit tests: the delay, the budget, the settings.

use super::*;

const MS: Duration = Duration::from_millis(1);

fn host() -> Partition {
    Partition::named("a")
}

/// The time of a call: the hedger only compares them to find idle hosts.
fn at() -> Instant {
    Instant::now()
}

#[test]
fn no_delay_before_enough_samples() {
    let cfg = HedgeConfig::default();
    let h = Hedger::default();
    for _ in 0..99 {
        h.record(host(), 2 * MS, at());
    }
    assert_eq!(h.delay(&cfg, host()), None);
    h.record(host(), 2 * MS, at());
    assert!(h.delay(&cfg, host()).is_some());
}

#[test]
fn the_delay_is_the_hosts_p95_within_a_bucket() {
    let cfg = HedgeConfig::default();
    let h = Hedger::default();
    // 97 % at 2 ms, 3 % at 300 ms: p95 is in the fast cluster.
    for i in 0..1000 {
        h.record(host(), if i % 100 < 3 { 300 * MS } else { 2 * MS }, at());
    }
    let d = h.delay(&cfg, host()).unwrap();
    assert!(d >= 2 * MS && d <= 2 * MS * 5 / 4, "{d:?}");
    // Another host is not hedged on this one's samples.
    assert_eq!(h.delay(&cfg, Partition::named("b")), None);
}

#[test]
fn the_delay_keeps_its_floor_and_cap() {
    let cfg = HedgeConfig {
        min_samples: 1,
        min_delay: 5 * MS,
        max_delay: 50 * MS,
        ..HedgeConfig::default()
    };
    let h = Hedger::default();
    h.record(host(), MS / 10, at());
    assert_eq!(h.delay(&cfg, host()), Some(5 * MS));
    let h = Hedger::default();
    h.record(host(), Duration::from_secs(9), at());
    assert_eq!(h.delay(&cfg, host()), Some(50 * MS));
}

#[test]
fn recent_latency_outweighs_old() {
    let cfg = HedgeConfig {
        min_samples: 1,
        ..HedgeConfig::default()
    };
    let h = Hedger::default();
    for _ in 0..1000 {
        h.record(host(), 100 * MS, at());
    }
    for _ in 0..3000 {
        h.record(host(), 2 * MS, at());
    }
    assert!(h.delay(&cfg, host()).unwrap() < 3 * MS);
}

#[test]
fn the_budget_is_five_percent_of_first_attempts() {
    let h = Hedger::default();
    let mut hedges = 0;
    for _ in 0..1000 {
        h.first_attempt(&HedgeConfig::default(), host(), at());
        if h.spend(host(), at()) {
            hedges += 1;
        }
    }
    assert!((49..=50).contains(&hedges), "{hedges}");
    assert!(!h.spend(Partition::named("b"), at()));
}

#[test]
fn a_refused_hedge_is_given_back() {
    let h = Hedger::default();
    let cfg = HedgeConfig {
        max_extra_load: 1.0,
        ..HedgeConfig::default()
    };
    h.first_attempt(&cfg, host(), at());
    assert!(h.spend(host(), at()));
    assert!(!h.spend(host(), at()));
    h.refund(host(), at());
    assert!(h.spend(host(), at()));
}

#[test]
fn a_busy_host_stays_hedged_past_the_window() {
    // The counts are halved at the window; the most samples a host may
    // need must stay reachable after that.
    let cfg = HedgeConfig {
        min_samples: WINDOW / 2,
        ..HedgeConfig::default()
    };
    assert_eq!(cfg.validate(), Ok(()));
    let h = Hedger::default();
    for i in 0..5000u64 {
        // Spread over many buckets: halving each count must not lose
        // more than half of the total.
        h.record(
            host(),
            Duration::from_micros(60 + (i * 7919) % 90_000),
            at(),
        );
        if i >= 600 {
            assert!(h.delay(&cfg, host()).is_some(), "sample {i}");
        }
    }
}

#[test]
fn settings_out_of_range_are_refused() {
    let ok = HedgeConfig::default();
    assert_eq!(ok.validate(), Ok(()));
    let bad = [
        (
            "hedge.percentile",
            HedgeConfig {
                percentile: 0.0,
                ..ok
            },
        ),
        (
            "hedge.percentile",
            HedgeConfig {
                percentile: 1.5,
                ..ok
            },
        ),
        (
            "hedge.percentile",
            HedgeConfig {
                percentile: f64::NAN,
                ..ok
            },
        ),
        (
            "hedge.max_delay",
            HedgeConfig {
                max_delay: Duration::ZERO,
                ..ok
            },
        ),
        (
            "hedge.max_delay",
            HedgeConfig {
                min_delay: 2 * ok.max_delay,
                ..ok
            },
        ),
        (
            "hedge.min_samples",
            HedgeConfig {
                min_samples: 0,
                ..ok
            },
        ),
        (
            "hedge.min_samples",
            HedgeConfig {
                min_samples: WINDOW / 2 + 1,
                ..ok
            },
        ),
        (
            "hedge.max_extra_load",
            HedgeConfig {
                max_extra_load: -0.1,
                ..ok
            },
        ),
        (
            "hedge.max_extra_load",
            HedgeConfig {
                max_extra_load: f64::INFINITY,
                ..ok
            },
        ),
    ];
    for (setting, cfg) in bad {
        let err = cfg.validate().unwrap_err();
        assert_eq!(err.setting(), setting, "{cfg:?}");
    }
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

/// A host beyond the table's 10 000 is hedged too: the table makes room
/// by dropping the least recently used (no new host was ever hedged once
/// 10 000 had been seen). A host in use all along keeps its record.
#[test]
fn a_new_host_is_hedged_after_ten_thousand_others() {
    let cfg = HedgeConfig {
        min_samples: 1,
        max_extra_load: 1.0,
        ..HedgeConfig::default()
    };
    let h = Hedger::default();
    let t0 = Instant::now();
    let hot = Partition::named("hot");
    for i in 0..MAX_HOSTS as u64 {
        let now = t0 + Duration::from_millis(i);
        h.record(Partition::named(&i.to_string()), 2 * MS, now);
        h.first_attempt(&cfg, hot, now);
    }
    let now = t0 + Duration::from_secs(60);
    let new = Partition::named("new");
    h.record(new, 2 * MS, now);
    assert!(h.delay(&cfg, new).is_some());
    h.first_attempt(&cfg, new, now);
    assert!(h.spend(new, now));
    // The hot host's budget is still there: ten saved hedges.
    assert_eq!((0..20).filter(|_| h.spend(hot, now)).count(), 10);
    // And the table stayed within its bounds.
    assert!(h.hosts.len() <= MAX_HOSTS, "{}", h.hosts.len());
}

/// Old outliers age out: 42 slow answers, one in each bucket from 3 ms
/// up, then 2 395 answers of 2 ms. Halving rounded up kept a count of one
/// in every outlier's bucket for ever, and the p95 stayed among them
/// (79 ms here, 155 ms in the run).
#[test]
fn old_outliers_leave_the_percentile() {
    let cfg = HedgeConfig::default();
    let h = Hedger::default();
    for k in 0..42 {
        let us = FIRST_US * GROWTH.powf(f64::from(18 + k) - 0.5);
        h.record(host(), Duration::from_secs_f64(us / 1e6), at());
    }
    for _ in 0..2_395 {
        h.record(host(), 2 * MS, at());
    }
    let d = h.delay(&cfg, host()).unwrap();
    assert!(d <= 2 * MS * 5 / 4, "{d:?}");
}

/// The delay is the configured percentile, not another: latencies spread
/// evenly from 1 to 100 ms put p95 at 95 ms (p47.5, say, is 48 ms).
#[test]
fn the_delay_is_the_p95_of_a_spread_of_latencies() {
    let cfg = HedgeConfig::default();
    let h = Hedger::default();
    for i in 0..500u64 {
        h.record(host(), Duration::from_millis(i % 100 + 1), at());
    }
    let d = h.delay(&cfg, host()).unwrap();
    assert!(d >= 95 * MS && d <= 95 * MS * 5 / 4, "{d:?}");
    // And another percentile asked for is that one.
    let median = HedgeConfig {
        percentile: 0.5,
        ..cfg
    };
    let d = h.delay(&median, host()).unwrap();
    assert!(d >= 50 * MS && d <= 50 * MS * 5 / 4, "{d:?}");
}

/// A host saves up at most ten hedges, however many first attempts (or
/// refunds) earned more.
#[test]
fn a_host_saves_up_ten_hedges_at_most() {
    let cfg = HedgeConfig {
        max_extra_load: 1.0,
        ..HedgeConfig::default()
    };
    let h = Hedger::default();
    for _ in 0..100 {
        h.first_attempt(&cfg, host(), at());
    }
    assert_eq!((0..100).filter(|_| h.spend(host(), at())).count(), 10);
    for _ in 0..100 {
        h.refund(host(), at());
    }
    assert_eq!((0..100).filter(|_| h.spend(host(), at())).count(), 10);
}
