//! The generic engine: the same policy, budget and deadline over any async
//! operation.

#[path = "support/ledger.rs"]
mod ledger;

use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use ledger::Ledger;
use reqwest_safe_retry::admission::{AttemptResult, GrantSource, TokenBucketConfig};
use reqwest_safe_retry::retry::{retry, Outcome};
use reqwest_safe_retry::time::ManualClock;
use reqwest_safe_retry::{Jitter, RetryPolicy, StopReason};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn policy(clock: &ManualClock) -> reqwest_safe_retry::RetryPolicyBuilder {
    RetryPolicy::builder().manual_clock(clock).seed(3)
}

#[tokio::test]
async fn retries_until_success_and_reports_each_delay() {
    let clock = ManualClock::new();
    let p = policy(&clock).max_attempts(5).build().unwrap();
    let mut seen = Vec::new();
    let (value, report) = retry(&p, |ctx| {
        seen.push(ctx.attempt());
        async move {
            if ctx.attempt() < 4 {
                Outcome::transient("refused")
            } else {
                Outcome::success("connected")
            }
        }
    })
    .await;
    assert_eq!(value, "connected");
    assert_eq!(seen, [1, 2, 3, 4]);
    assert_eq!(report.attempts(), 4);
    assert_eq!(report.delays(), clock.sleeps());
    assert_eq!(report.stop_reason(), StopReason::Success);
    assert_eq!(report.idempotency_key(), None);
}

#[tokio::test]
async fn a_permanent_outcome_stops_at_once() {
    let clock = ManualClock::new();
    let p = policy(&clock).build().unwrap();
    let (value, report) = retry(&p, |_| async {
        Outcome::permanent(Err::<(), _>("bad password"))
    })
    .await;
    assert_eq!(value, Err("bad password"));
    assert_eq!(report.attempts(), 1);
    assert_eq!(report.stop_reason(), StopReason::Permanent);
    assert!(clock.sleeps().is_empty());
}

#[tokio::test]
async fn a_server_hint_is_a_floor() {
    let clock = ManualClock::new();
    let p = policy(&clock).backoff(ms(1), ms(1)).build().unwrap();
    let (_, report) = retry(&p, |ctx| async move {
        if ctx.attempt() == 1 {
            Outcome::transient(()).with_retry_after(Duration::from_secs(2))
        } else {
            Outcome::success(())
        }
    })
    .await;
    let slept = report.delays()[0];
    assert!(
        slept >= Duration::from_secs(2) && slept <= ms(2400),
        "{slept:?}"
    );
    assert_eq!(report.retry_after_honoured(), 1);
}

#[tokio::test]
async fn the_context_tells_each_attempt_its_timeout() {
    let clock = ManualClock::new();
    let p = policy(&clock)
        .max_attempts(10)
        .backoff(ms(300), ms(300))
        .jitter(Jitter::None)
        .deadline(ms(1000))
        .attempt_timeout(ms(600))
        .min_attempt_window(ms(50))
        .build()
        .unwrap();
    let mut timeouts = Vec::new();
    let (_, report) = retry(&p, |ctx| {
        timeouts.push((ctx.timeout(), ctx.time_left()));
        async { Outcome::transient(()) }
    })
    .await;
    assert_eq!(
        timeouts,
        [
            (Some(ms(600)), Some(ms(1000))),
            (Some(ms(600)), Some(ms(700))),
            (Some(ms(400)), Some(ms(400))),
            (Some(ms(100)), Some(ms(100))),
        ]
    );
    assert_eq!(report.stop_reason(), StopReason::Deadline);
}

#[tokio::test]
async fn timeouts_can_cost_more_budget() {
    let clock = ManualClock::new();
    let p = policy(&clock)
        .max_attempts(10)
        .token_bucket(TokenBucketConfig {
            capacity: 10.0,
            first_attempt_deposit: 0.0,
            timeout_cost: 5.0,
            ..TokenBucketConfig::default()
        })
        .build()
        .unwrap();
    let (_, report) = retry(&p, |_| async { Outcome::transient(()).timed_out() }).await;
    // 10 tokens buy two retries after a timeout.
    assert_eq!(report.attempts(), 3);
    assert_eq!(report.stop_reason(), StopReason::BudgetExhausted);
}

#[tokio::test]
async fn the_grpc_preset_reconnects_with_growing_jittered_delays() {
    let clock = ManualClock::new();
    let p = RetryPolicy::grpc_connection_backoff()
        .manual_clock(&clock)
        .seed(1)
        .build()
        .unwrap();
    let (_, report) = retry(&p, |ctx| async move {
        if ctx.attempt() <= 12 {
            Outcome::transient(())
        } else {
            Outcome::success(())
        }
    })
    .await;
    assert_eq!(report.attempts(), 13);
    let mut off_ceiling = 0;
    for (n, d) in report.delays().iter().enumerate() {
        let ceiling = (1.6f64.powi(n as i32)).min(120.0);
        let secs = d.as_secs_f64();
        assert!(
            secs >= ceiling * 0.8 - 1e-9 && secs <= ceiling * 1.2 + 1e-9,
            "retry {n}: {secs}"
        );
        if (secs - ceiling).abs() > 1e-6 {
            off_ceiling += 1;
        }
    }
    assert!(
        off_ceiling >= 10,
        "±20 % jitter moves the delays off the ceiling"
    );
}

#[tokio::test]
async fn the_grpc_preset_gives_each_connect_at_least_20_s_and_the_next_backoff() {
    let clock = ManualClock::new();
    let p = RetryPolicy::grpc_connection_backoff()
        .manual_clock(&clock)
        .seed(1)
        .build()
        .unwrap();
    let mut timeouts = Vec::new();
    retry(&p, |ctx| {
        timeouts.push(ctx.timeout().unwrap().as_secs_f64());
        async move {
            if ctx.attempt() < 12 {
                Outcome::transient(())
            } else {
                Outcome::success(())
            }
        }
    })
    .await;
    for (n, t) in timeouts.iter().enumerate() {
        let ceiling = 1.6f64.powi(n as i32).min(120.0);
        assert!(
            (t - ceiling.max(20.0)).abs() < 1e-6,
            "attempt {}: {t}",
            n + 1
        );
    }
    assert_eq!(timeouts[0], 20.0);
    assert!(timeouts[11] > 20.0);
}

#[tokio::test]
async fn each_call_starts_again_from_the_initial_delay() {
    let clock = ManualClock::new();
    let p = RetryPolicy::grpc_connection_backoff()
        .manual_clock(&clock)
        .build()
        .unwrap();
    for _ in 0..3 {
        let (_, report) = retry(&p, |ctx| async move {
            if ctx.attempt() < 6 {
                Outcome::transient(())
            } else {
                Outcome::success(())
            }
        })
        .await;
        let first = report.delays()[0].as_secs_f64();
        assert!((0.8..=1.2).contains(&first), "{first}");
    }
}

#[tokio::test]
async fn decorrelated_delays_grow_from_the_previous_one() {
    let clock = ManualClock::new();
    let p = policy(&clock)
        .max_attempts(12)
        .backoff(ms(10), Duration::from_secs(100))
        .jitter(Jitter::Decorrelated)
        .no_deadline()
        .no_budget()
        .build()
        .unwrap();
    let (_, report) = retry(&p, |_| async { Outcome::transient(()) }).await;
    let delays = report.delays();
    for pair in delays.windows(2) {
        assert!(
            pair[1] <= (pair[0] * 3).max(ms(10)) && pair[1] >= ms(10),
            "{pair:?}"
        );
    }
    // Stuck at the base, no delay could pass 3 × base.
    assert!(delays.iter().any(|d| *d > ms(30)), "{delays:?}");
}

#[tokio::test]
async fn each_default_policy_seeds_its_own_generator() {
    let mut runs = Vec::new();
    for _ in 0..2 {
        let clock = ManualClock::new();
        let p = RetryPolicy::builder()
            .manual_clock(&clock)
            .max_attempts(6)
            .no_budget()
            .build()
            .unwrap();
        let (_, report) = retry(&p, |_| async { Outcome::transient(()) }).await;
        runs.push(report.delays().to_vec());
    }
    assert_ne!(
        runs[0], runs[1],
        "identical seeds recreate synchronized retries"
    );
}

#[tokio::test(start_paused = true)]
async fn the_default_sleeper_uses_tokio_time() {
    // Paused tokio time: no socket is involved, so the clock auto-advances.
    let p = RetryPolicy::builder()
        .backoff(Duration::from_secs(5), Duration::from_secs(5))
        .jitter(Jitter::None)
        .build()
        .unwrap();
    let start = tokio::time::Instant::now();
    let (_, report) = retry(&p, |ctx| async move {
        if ctx.attempt() == 1 {
            Outcome::transient(())
        } else {
            Outcome::success(())
        }
    })
    .await;
    assert_eq!(report.delays(), [Duration::from_secs(5)]);
    assert_eq!(start.elapsed(), Duration::from_secs(5));
}

/// Runs one operation under `p` whose attempts end as `script` says
/// (`'t'` transient, `'T'` throttled, `'s'` success; the last repeats).
async fn scripted(p: &RetryPolicy, script: &'static str) -> reqwest_safe_retry::RetryReport {
    let (_, report) = retry(p, |ctx| async move {
        let i = (ctx.attempt() as usize - 1).min(script.len() - 1);
        match script.as_bytes()[i] {
            b's' => Outcome::success(()),
            b'T' => Outcome::transient(()).throttled(),
            _ => Outcome::transient(()),
        }
    })
    .await;
    report
}

#[tokio::test]
async fn the_aws_preset_backs_off_from_50_ms_and_from_1_s_when_throttled() {
    let clock = ManualClock::new();
    let p = RetryPolicy::aws_standard()
        .manual_clock(&clock)
        .seed(5)
        .build()
        .unwrap();
    assert_eq!(p.max_attempts(), 3);
    assert_eq!(p.backoff().cap(), Duration::from_secs(20));
    let mut transient = Vec::new();
    let mut throttled = Vec::new();
    for _ in 0..200 {
        transient.extend_from_slice(scripted(&p, "ts").await.delays());
        throttled.extend_from_slice(scripted(&p, "Ts").await.delays());
    }
    // Full jitter: U(0, 50 ms) after a transient error, U(0, 1 s) after a
    // throttling answer.
    assert!(transient.iter().all(|d| *d <= ms(50)));
    assert!(transient.iter().any(|d| *d > ms(40)));
    assert!(throttled.iter().all(|d| *d <= ms(1000)));
    assert!(throttled.iter().filter(|d| **d > ms(50)).count() > 150);
}

#[tokio::test]
async fn the_aws_quota_charges_14_and_5_refunds_successes_and_credits_clean_calls() {
    let clock = ManualClock::new();
    let p = RetryPolicy::aws_standard()
        .manual_clock(&clock)
        .seed(5)
        .build()
        .unwrap();
    // A retry that succeeds gets its 14 tokens back: the quota stays full.
    for _ in 0..100 {
        assert_eq!(scripted(&p, "ts").await.stop_reason(), StopReason::Success);
    }
    // 500 tokens buy 35 transient retries (14 each), then none.
    let mut retries = 0;
    for _ in 0..30 {
        retries += scripted(&p, "t").await.attempts() - 1;
    }
    assert_eq!(retries, 35);
    assert_eq!(
        scripted(&p, "t").await.stop_reason(),
        StopReason::BudgetExhausted
    );
    // 10 tokens left; a throttled retry costs 5: two of them.
    assert_eq!(scripted(&p, "T").await.attempts(), 3);
    assert_eq!(scripted(&p, "T").await.attempts(), 1);
    // Each success that needed no retry credits one token: 14 of them buy
    // one transient retry.
    for _ in 0..13 {
        scripted(&p, "s").await;
    }
    assert_eq!(scripted(&p, "t").await.attempts(), 1);
    scripted(&p, "s").await;
    assert_eq!(scripted(&p, "t").await.attempts(), 2);
}

/// A retry admitted and then dropped by its caller (a timeout around the
/// call, `select!`) is told to admission as `Other`, with its grant: the
/// place it was given (a paced release in flight, the host's one probe)
/// is freed at once, not when a lease runs out. A first attempt, sent
/// under no grant, tells nothing when dropped.
#[tokio::test]
async fn an_admitted_retry_dropped_by_its_caller_is_told_to_admission() {
    let clock = ManualClock::new();
    let told = Arc::new(Ledger::default());
    let p = policy(&clock)
        .shared_admission(told.clone())
        .build()
        .unwrap();
    // The second attempt never ends: the call is dropped while it is sent.
    let call = retry(&p, |ctx| async move {
        if ctx.attempt() == 1 {
            Outcome::transient(())
        } else {
            std::future::pending().await
        }
    });
    assert!(call.now_or_never().is_none(), "the second attempt pends");
    let told: Vec<_> = told
        .records
        .lock()
        .unwrap()
        .iter()
        .map(|r| (r.attempt(), r.result(), r.grant().map(|g| g.source())))
        .collect();
    assert_eq!(
        told,
        [
            (1, AttemptResult::Failure, None),
            (2, AttemptResult::Other, Some(GrantSource::Token)),
        ]
    );
    // Dropped at its first attempt: nothing to tell.
    let told = Arc::new(Ledger::default());
    let p = policy(&clock)
        .shared_admission(told.clone())
        .build()
        .unwrap();
    let call = retry(&p, |_| std::future::pending::<Outcome<()>>());
    assert!(call.now_or_never().is_none());
    assert!(told.records.lock().unwrap().is_empty());
}
