//! Every delay lies inside its mode's bounds, for any attempt and any seed;
//! a seeded run is reproducible.

mod support;

use std::time::Duration;

use proptest::prelude::*;
use rand::{rngs::StdRng, SeedableRng};
use reqwest_safe_retry::{Backoff, Jitter, ManualClock};
use support::{client, ms, policy};
use wiremock::MockServer;

fn jitter() -> impl Strategy<Value = Jitter> {
    prop_oneof![
        Just(Jitter::None),
        Just(Jitter::Full),
        Just(Jitter::Equal),
        Just(Jitter::Decorrelated),
        (0.0..=1.0f64).prop_map(Jitter::Proportional),
    ]
}

fn attempt() -> impl Strategy<Value = u32> {
    prop_oneof![0..64u32, Just(10_000u32), Just(u32::MAX), any::<u32>()]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn every_delay_lies_inside_its_bounds(
        jitter in jitter(),
        n in attempt(),
        seed in any::<u64>(),
        base_ms in 1u64..5_000,
        extra_ms in 0u64..600_000,
        multiplier in 1.0f64..10.0,
        prev_ms in 0u64..1_000_000,
    ) {
        let base = ms(base_ms);
        let cap = base + ms(extra_ms);
        let b = Backoff::from_parts(base, cap, multiplier, jitter).unwrap();
        let prev = ms(prev_ms);
        let mut rng = StdRng::seed_from_u64(seed);
        let d = b.delay(n, prev, &mut rng);
        let ceiling = b.ceiling(n);
        prop_assert!(ceiling <= cap && ceiling >= base.min(cap));
        match jitter {
            Jitter::None => prop_assert_eq!(d, ceiling),
            Jitter::Full => prop_assert!(d <= ceiling),
            Jitter::Equal => prop_assert!(d >= ceiling / 2 && d <= ceiling),
            Jitter::Decorrelated => {
                prop_assert!(d >= base && d <= cap);
                prop_assert!(d <= prev.max(base) * 3);
            }
            Jitter::Proportional(f) => {
                let lo = ceiling.as_secs_f64() * (1.0 - f) - 1e-9;
                let hi = ceiling.as_secs_f64() * (1.0 + f) + 1e-9;
                prop_assert!(d.as_secs_f64() >= lo && d.as_secs_f64() <= hi);
            }
            _ => unreachable!(),
        }
        let (lo, hi) = b.bounds(n, prev);
        prop_assert!(d >= lo && d <= hi, "{:?} outside [{:?}, {:?}]", d, lo, hi);
    }

    #[test]
    fn attempt_ten_thousand_gives_the_cap(
        base_ms in 1u64..1000, extra_ms in 0u64..100_000, multiplier in 1.01f64..10.0,
    ) {
        let b = Backoff::from_parts(ms(base_ms), ms(base_ms + extra_ms), multiplier, Jitter::None).unwrap();
        prop_assert_eq!(b.ceiling(10_000), ms(base_ms + extra_ms));
    }
}

#[test]
fn jitter_applies_at_the_cap_too() {
    // A fleet parked at the cap must not come back in lockstep.
    let b = Backoff::new(ms(100), Duration::from_secs(10)).unwrap();
    for jitter in [
        Jitter::Full,
        Jitter::Equal,
        Jitter::Decorrelated,
        Jitter::Proportional(0.2),
    ] {
        let b = b.with_jitter(jitter);
        let mut rng = StdRng::seed_from_u64(9);
        let delays: std::collections::HashSet<_> = (0..100)
            .map(|_| b.delay(10_000, Duration::from_secs(10), &mut rng))
            .collect();
        assert!(
            delays.len() > 90,
            "{jitter:?}: only {} distinct delays",
            delays.len()
        );
    }
}

async fn seeded_run(seed: u64, server: &MockServer) -> Vec<Duration> {
    let clock = ManualClock::new();
    let p = policy(&clock)
        .seed(seed)
        .max_attempts(6)
        .jitter(Jitter::Decorrelated)
        .no_budget()
        .build()
        .unwrap();
    let (c, _) = client(p);
    c.get(server.uri()).send().await.unwrap();
    clock.sleeps()
}

#[tokio::test]
async fn a_seeded_run_is_reproducible() {
    let server = support::answering(503).await;
    let a = seeded_run(42, &server).await;
    let b = seeded_run(42, &server).await;
    let c = seeded_run(43, &server).await;
    assert_eq!(a.len(), 5);
    assert_eq!(a, b);
    assert_ne!(a, c);
}

#[test]
fn full_jitter_is_the_default() {
    let p = reqwest_safe_retry::RetryPolicy::default();
    assert_eq!(p.backoff().jitter(), Jitter::Full);
}
