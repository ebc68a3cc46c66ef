//! Every delay lies inside its mode's bounds, for any attempt and any seed;
//! a seeded run is reproducible.

mod support;

use std::time::Duration;

use proptest::prelude::*;
use rand::{rngs::StdRng, SeedableRng};
use reqwest_safe_retry::retry::Backoff;
use reqwest_safe_retry::time::ManualClock;
use reqwest_safe_retry::Jitter;
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

/// Draws `n` delays at attempt `k` and returns them as fractions of the
/// ceiling.
fn fractions(jitter: Jitter, k: u32, n: usize) -> Vec<f64> {
    let b = Backoff::new(ms(100), Duration::from_secs(10))
        .unwrap()
        .with_jitter(jitter);
    let ceiling = b.ceiling(k).as_secs_f64();
    let mut rng = StdRng::seed_from_u64(11);
    (0..n)
        .map(|_| b.delay(k, b.base(), &mut rng).as_secs_f64() / ceiling)
        .collect()
}

/// Asserts the samples are uniform over `[lo, hi]`: ten equal bins each
/// hold 10 % ± 1.5 % of them, and none falls outside.
fn assert_uniform(samples: &[f64], lo: f64, hi: f64, what: &str) {
    let mut bins = [0usize; 10];
    for &x in samples {
        assert!(x >= lo - 1e-9 && x <= hi + 1e-9, "{what}: {x} outside");
        let i = (((x - lo) / (hi - lo)) * 10.0).floor() as usize;
        bins[i.min(9)] += 1;
    }
    let n = samples.len() as f64;
    for (i, &count) in bins.iter().enumerate() {
        let share = count as f64 / n;
        assert!((share - 0.1).abs() < 0.015, "{what}: bin {i} holds {share}");
    }
}

#[test]
fn equal_jitter_is_uniform_over_the_upper_half_of_the_ceiling() {
    for k in [0, 3, 10_000] {
        let f = fractions(Jitter::Equal, k, 40_000);
        assert_uniform(&f, 0.5, 1.0, "equal");
        // Not a point mass at either end.
        let mean = f.iter().sum::<f64>() / f.len() as f64;
        assert!((mean - 0.75).abs() < 0.01, "{mean}");
    }
}

#[test]
fn proportional_jitter_is_uniform_around_the_ceiling() {
    for k in [0, 3, 10_000] {
        let f = fractions(Jitter::Proportional(0.2), k, 40_000);
        assert_uniform(&f, 0.8, 1.2, "proportional");
        let mean = f.iter().sum::<f64>() / f.len() as f64;
        assert!((mean - 1.0).abs() < 0.01, "{mean}");
    }
}

#[test]
fn full_jitter_is_uniform_below_the_ceiling() {
    let f = fractions(Jitter::Full, 4, 40_000);
    assert_uniform(&f, 0.0, 1.0, "full");
}
