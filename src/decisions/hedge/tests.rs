//! Hedging's unit tests: the delay, the budget, the settings.

use super::*;

const MS: Duration = Duration::from_millis(1);

fn host() -> Partition {
    Partition::named("a")
}

#[test]
fn no_delay_before_enough_samples() {
    let cfg = HedgeConfig::default();
    let h = Hedger::default();
    for _ in 0..99 {
        h.record(host(), 2 * MS);
    }
    assert_eq!(h.delay(&cfg, host()), None);
    h.record(host(), 2 * MS);
    assert!(h.delay(&cfg, host()).is_some());
}

#[test]
fn the_delay_is_the_hosts_p95_within_a_bucket() {
    let cfg = HedgeConfig::default();
    let h = Hedger::default();
    // 97 % at 2 ms, 3 % at 300 ms: p95 is in the fast cluster.
    for i in 0..1000 {
        h.record(host(), if i % 100 < 3 { 300 * MS } else { 2 * MS });
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
    h.record(host(), MS / 10);
    assert_eq!(h.delay(&cfg, host()), Some(5 * MS));
    let h = Hedger::default();
    h.record(host(), Duration::from_secs(9));
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
        h.record(host(), 100 * MS);
    }
    for _ in 0..3000 {
        h.record(host(), 2 * MS);
    }
    assert!(h.delay(&cfg, host()).unwrap() < 3 * MS);
}

#[test]
fn the_budget_is_five_percent_of_first_attempts() {
    let h = Hedger::default();
    let mut hedges = 0;
    for _ in 0..1000 {
        h.first_attempt(&HedgeConfig::default(), host());
        if h.spend(host()) {
            hedges += 1;
        }
    }
    assert!((49..=50).contains(&hedges), "{hedges}");
    assert!(!h.spend(Partition::named("b")));
}

#[test]
fn a_refused_hedge_is_given_back() {
    let h = Hedger::default();
    let cfg = HedgeConfig {
        max_extra_load: 1.0,
        ..HedgeConfig::default()
    };
    h.first_attempt(&cfg, host());
    assert!(h.spend(host()));
    assert!(!h.spend(host()));
    h.refund(host());
    assert!(h.spend(host()));
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
        h.record(host(), Duration::from_micros(60 + (i * 7919) % 90_000));
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
