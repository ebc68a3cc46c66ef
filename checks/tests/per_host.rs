//! Admission kept per host: one host's outage never delays or fails
//! another's retries, and one host's successes never release another's.
//! Then the adaptive state machine's open edges, each on a clock that only
//! moves when told to.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest_safe_retry::admission::{
    AdaptiveAdmission, AdaptiveConfig, Admission, AttemptRecord, AttemptResult, Grant, GrantSource,
    Partition, RetryAdmission, RetryKind, RetryRequest,
};
use reqwest_safe_retry::retry::{retry_in, Outcome};
use reqwest_safe_retry::time::{BoxFuture, Clock, ManualClock, Sleeper};
use reqwest_safe_retry::{Jitter, RequestOptions, RetryPolicy, StopReason};
use support::{client, ms, policy};

const A: Partition = Partition::SINGLE;

fn b() -> Partition {
    Partition::named("b")
}

fn retry_after(waited: Duration) -> RetryRequest {
    RetryRequest::new(RetryKind::Transient, waited)
}

const RETRY: RetryRequest = RetryRequest::new(RetryKind::Transient, Duration::ZERO);

fn adaptive(config: AdaptiveConfig) -> AdaptiveAdmission {
    AdaptiveAdmission::new(config).unwrap()
}

fn small(capacity: f64) -> AdaptiveAdmission {
    adaptive(AdaptiveConfig {
        capacity,
        ..AdaptiveConfig::default()
    })
}

fn source(a: Admission) -> Option<GrantSource> {
    match a {
        Admission::Admit(g) => Some(g.source()),
        _ => None,
    }
}

fn record(
    a: &AdaptiveAdmission,
    p: Partition,
    grant: Admission,
    result: AttemptResult,
    now: Instant,
) {
    let Admission::Admit(g) = grant else {
        panic!("not admitted: {grant:?}")
    };
    a.record(p, AttemptRecord::new(2, Some(g), result), now);
}

/// Runs the bucket dry, sends the first probe when due and records its
/// success; returns when.
fn first_probe_succeeds(a: &AdaptiveAdmission, p: Partition, start: Instant) -> Instant {
    assert!(matches!(a.admit(p, RETRY, start), Admission::Wait(_)));
    let t0 = start + ms(250);
    let probe = a.admit(p, RETRY, t0);
    assert_eq!(source(probe), Some(GrantSource::Probe));
    record(a, p, probe, AttemptResult::Success, t0);
    t0
}

/// Probes sent to a dead host `p` over `span`, asked every 20 ms, each
/// failing at once; `meanwhile` runs at every step.
fn probes_to_a_dead_host(
    a: &AdaptiveAdmission,
    p: Partition,
    t0: Instant,
    span: Duration,
    mut meanwhile: impl FnMut(Instant),
) -> u32 {
    let mut probes = 0;
    for i in 0..(span.as_millis() / 20) as u64 {
        let now = t0 + ms(i * 20);
        a.first_attempt(p, now);
        a.record(p, AttemptRecord::new(1, None, AttemptResult::Failure), now);
        let answer = a.admit(p, RETRY, now);
        if source(answer) == Some(GrantSource::Probe) {
            probes += 1;
        }
        if source(answer).is_some() {
            record(a, p, answer, AttemptResult::Failure, now);
        }
        meanwhile(now);
    }
    probes
}

// ---- Isolation.

#[test]
fn one_hosts_successes_never_reset_anothers_probe_back_off() {
    let t0 = Instant::now();
    let alone = small(0.001);
    let probes_alone = probes_to_a_dead_host(&alone, A, t0, Duration::from_secs(60), |_| {});
    let shared = small(0.001);
    let probes_shared = probes_to_a_dead_host(&shared, A, t0, Duration::from_secs(60), |now| {
        // A healthy host B, on the same admission, answers every call.
        shared.first_attempt(b(), now);
        shared.record(
            b(),
            AttemptRecord::new(1, None, AttemptResult::Success),
            now,
        );
    });
    assert_eq!(probes_shared, probes_alone);
    assert!(probes_alone <= 10, "{probes_alone}");
}

#[test]
fn one_hosts_outage_never_drains_anothers_tokens() {
    let a = small(10.0);
    let t0 = Instant::now();
    for _ in 0..10 {
        assert_eq!(source(a.admit(A, RETRY, t0)), Some(GrantSource::Token));
    }
    assert!(matches!(a.admit(A, RETRY, t0), Admission::Wait(_)));
    assert_eq!(a.tokens(A), 0.0);
    // B's bucket is whole, and its retry goes out at once.
    assert_eq!(a.tokens(b()), 10.0);
    assert_eq!(source(a.admit(b(), RETRY, t0)), Some(GrantSource::Token));
}

#[test]
fn one_hosts_successes_never_release_anothers_retries() {
    let a = small(0.001);
    let t0 = Instant::now();
    // B recovers and its release rate grows …
    let t1 = first_probe_succeeds(&a, b(), t0);
    let released = Grant::new(GrantSource::Released, 0.0);
    for _ in 0..100 {
        a.record(
            b(),
            AttemptRecord::new(2, Some(released), AttemptResult::Success),
            t1,
        );
    }
    assert!(a.release_rate(b(), t1) > 100.0);
    // … while A's stays at zero: its retries wait for their own probe.
    assert_eq!(a.release_rate(A, t1), 0.0);
    assert!(matches!(a.admit(A, RETRY, t1 + ms(10)), Admission::Wait(_)));
}

/// Drains a partition by running failing operations through the engine.
async fn drain(p: &RetryPolicy, partition: Partition) {
    for _ in 0..12 {
        let (_, report) = retry_in(p, partition, |_| async { Outcome::transient(()) }).await;
        assert_eq!(report.stop_reason(), StopReason::AttemptsExhausted);
    }
}

#[tokio::test]
async fn through_the_engine_a_dead_partition_never_holds_back_another() {
    let clock = ManualClock::new();
    let p = policy(&clock).max_attempts(2).build().unwrap();
    drain(&p, A).await;
    // A's bucket is empty: its next retry waits.
    let (_, report) = retry_in(&p, A, |_| async { Outcome::transient(()) }).await;
    assert!(report.admission_wait() > Duration::ZERO, "{report:?}");
    // B's retry goes out at once.
    let (value, report) = retry_in(&p, b(), |ctx| async move {
        if ctx.attempt() == 1 {
            Outcome::transient(Err(()))
        } else {
            Outcome::success(Ok(()))
        }
    })
    .await;
    assert_eq!(value, Ok(()));
    assert_eq!(report.admission_wait(), Duration::ZERO);
}

#[tokio::test]
async fn the_middleware_partitions_by_host_unless_the_request_names_one() {
    let dead = support::answering(503).await;
    let flaky = support::answering(503).await;
    let clock = ManualClock::new();
    let p = policy(&clock)
        .max_attempts(2)
        .backoff(ms(1), ms(1))
        .jitter(Jitter::None)
        .build()
        .unwrap();
    let (client, _) = client(p);
    for _ in 0..12 {
        client.get(dead.uri()).send().await.unwrap();
    }
    let report = |r: &reqwest::Response| {
        r.extensions()
            .get::<reqwest_safe_retry::RetryReport>()
            .unwrap()
            .clone()
    };
    // The dead host's retries now wait; the other host's do not.
    let r = client.get(dead.uri()).send().await.unwrap();
    assert!(report(&r).admission_wait() > Duration::ZERO);
    let r = client.get(flaky.uri()).send().await.unwrap();
    let url: reqwest::Url = flaky.uri().parse().unwrap();
    assert_eq!(report(&r).partition(), Partition::of_url(&url));
    assert_eq!(report(&r).attempts(), 2);
    assert_eq!(report(&r).admission_wait(), Duration::ZERO);
    // Named into the dead host's partition, the other host's retries wait
    // with it.
    let shared = Partition::named("both");
    for _ in 0..12 {
        client
            .get(dead.uri())
            .with_extension(RequestOptions::new().partition(shared))
            .send()
            .await
            .unwrap();
    }
    let r = client
        .get(flaky.uri())
        .with_extension(RequestOptions::new().partition(shared))
        .send()
        .await
        .unwrap();
    assert!(report(&r).admission_wait() > Duration::ZERO);
    assert_eq!(report(&r).partition(), shared);
}

#[test]
fn the_table_of_hosts_is_bounded() {
    let a = adaptive(AdaptiveConfig {
        max_partitions: 1_000,
        ..AdaptiveConfig::default()
    });
    let t0 = Instant::now();
    for i in 0..100_000u64 {
        let p = Partition::named(&format!("host-{i}"));
        let now = t0 + ms(i);
        a.first_attempt(p, now);
        a.record(p, AttemptRecord::new(1, None, AttemptResult::Success), now);
    }
    assert!(a.partitions() <= 1_000, "{}", a.partitions());
}

// ---- The state machine's open edges.

#[test]
fn an_unrepresentable_probe_interval_never_makes_every_retry_a_probe() {
    let a = adaptive(AdaptiveConfig {
        capacity: 0.001,
        probe_interval: Duration::MAX,
        max_probe_interval: Duration::MAX,
        ..AdaptiveConfig::default()
    });
    let t0 = Instant::now();
    let probes = (0..1_000)
        .filter(|i| source(a.admit(A, RETRY, t0 + ms(*i))) == Some(GrantSource::Probe))
        .count();
    assert_eq!(probes, 0);
    // An unbounded back-off still backs off.
    let a = adaptive(AdaptiveConfig {
        capacity: 0.001,
        max_probe_interval: Duration::MAX,
        ..AdaptiveConfig::default()
    });
    assert!(probes_to_a_dead_host(&a, A, t0, Duration::from_secs(60), |_| {}) <= 10);
}

#[test]
fn degenerate_release_settings_are_refused() {
    for (config, setting) in [
        (
            AdaptiveConfig {
                release_step: 1e-30,
                ..AdaptiveConfig::default()
            },
            "admission.release_step",
        ),
        (
            AdaptiveConfig {
                max_release_rate: 1e-30,
                ..AdaptiveConfig::default()
            },
            "admission.max_release_rate",
        ),
    ] {
        assert_eq!(
            AdaptiveAdmission::new(config).unwrap_err().setting(),
            setting
        );
        let built = RetryPolicy::builder().adaptive_admission(config).build();
        assert_eq!(built.unwrap_err().setting(), setting);
    }
    // The smallest accepted rate waits without panicking.
    let a = adaptive(AdaptiveConfig {
        capacity: 0.001,
        release_step: 1.0,
        max_release_rate: 1.0,
        ..AdaptiveConfig::default()
    });
    let t0 = first_probe_succeeds(&a, A, Instant::now());
    assert!(matches!(a.admit(A, RETRY, t0 + ms(1)), Admission::Wait(_)));
}

/// Retries released to `n` retries asking at the same instant.
fn released_at_once(a: &AdaptiveAdmission, now: Instant, n: usize) -> usize {
    (0..n)
        .filter(|_| source(a.admit(A, RETRY, now)) == Some(GrantSource::Released))
        .count()
}

#[test]
fn the_release_rate_decays_while_idle() {
    let t0 = Instant::now();
    let warmed = small(0.001);
    let t1 = first_probe_succeeds(&warmed, A, t0);
    let released = Grant::new(GrantSource::Released, 0.0);
    for _ in 0..2_000 {
        warmed.record(
            A,
            AttemptRecord::new(2, Some(released), AttemptResult::Success),
            t1,
        );
    }
    assert_eq!(warmed.release_rate(A, t1), 10_000.0);
    // An idle hour later, nothing new is known: no wave of releases.
    let later = t1 + Duration::from_secs(3_600);
    assert_eq!(warmed.release_rate(A, later), 0.0);
    assert_eq!(released_at_once(&warmed, later, 1_000), 0);
    let fresh = small(0.001);
    assert_eq!(released_at_once(&fresh, later, 1_000), 0);
    // Within the half-life the rate holds.
    let busy = small(0.001);
    let t1 = first_probe_succeeds(&busy, A, t0);
    busy.record(
        A,
        AttemptRecord::new(2, Some(released), AttemptResult::Success),
        t1,
    );
    assert_eq!(busy.release_rate(A, t1 + ms(900)), 20.0);
}

#[test]
fn at_most_one_probe_is_in_flight() {
    let a = small(0.001);
    let t0 = Instant::now();
    // A host that hangs: no probe ever reports back within 10 s.
    let probes = (0..1_000u64)
        .filter(|i| source(a.admit(A, RETRY, t0 + ms(i * 10))) == Some(GrantSource::Probe))
        .count();
    assert_eq!(probes, 1);
}

#[test]
fn a_probe_that_reports_frees_its_place() {
    let a = small(0.001);
    let t0 = Instant::now();
    assert!(matches!(a.admit(A, RETRY, t0), Admission::Wait(_)));
    let probe = a.admit(A, RETRY, t0 + ms(250));
    assert_eq!(source(probe), Some(GrantSource::Probe));
    // A permanent answer says nothing of the host, but ends the probe.
    record(&a, A, probe, AttemptResult::Other, t0 + ms(300));
    assert_eq!(
        source(a.admit(A, RETRY, t0 + ms(500))),
        Some(GrantSource::Probe)
    );
}

#[test]
fn the_first_probe_waits_the_probe_interval() {
    let a = small(1.0);
    let t0 = Instant::now();
    assert_eq!(source(a.admit(A, RETRY, t0)), Some(GrantSource::Token));
    assert!(matches!(a.admit(A, RETRY, t0), Admission::Wait(_)));
    assert!(matches!(
        a.admit(A, RETRY, t0 + ms(249)),
        Admission::Wait(_)
    ));
    assert_eq!(
        source(a.admit(A, RETRY, t0 + ms(250))),
        Some(GrantSource::Probe)
    );
}

#[test]
fn a_now_applied_out_of_order_credits_nothing_twice() {
    let a = small(0.001);
    let t0 = first_probe_succeeds(&a, A, Instant::now());
    // 10 per second: one release in 100 ms.
    assert_eq!(
        source(a.admit(A, RETRY, t0 + ms(100))),
        Some(GrantSource::Released)
    );
    // A thread that read the clock earlier applies its `now` late …
    assert!(matches!(a.admit(A, RETRY, t0), Admission::Wait(_)));
    // … and the same 100 ms are not credited again.
    assert!(matches!(
        a.admit(A, RETRY, t0 + ms(100)),
        Admission::Wait(_)
    ));
}

#[test]
fn waiters_are_released_in_arrival_order() {
    let a = small(0.001);
    let t0 = Instant::now();
    // 60 retries start waiting 3 ms apart; the host recovers at 250 ms.
    let n = 60u64;
    let arrivals: Vec<Instant> = (0..n).map(|i| t0 + ms(i * 3)).collect();
    let mut next_ask: Vec<Option<Instant>> = arrivals.iter().copied().map(Some).collect();
    let mut order = Vec::new();
    for step in 0..20_000u64 {
        let now = t0 + ms(step);
        // Later arrivals ask first within a millisecond: the most chances
        // to overtake.
        for i in (0..n as usize).rev() {
            let Some(due) = next_ask[i] else { continue };
            if due > now {
                continue;
            }
            let answer = a.admit(A, retry_after(now - arrivals[i]), now);
            match answer {
                Admission::Admit(_) => {
                    record(&a, A, answer, AttemptResult::Success, now);
                    order.push((i, now));
                    next_ask[i] = None;
                }
                Admission::Wait(w) => next_ask[i] = Some(now + w),
                _ => panic!("refused {i} at {step} ms"),
            }
        }
        if order.len() == n as usize {
            break;
        }
    }
    assert_eq!(order.len(), n as usize);
    // With k releases available at once, the first k in line may go in
    // any order; no retry waits more than a poll interval (20 ms) behind
    // one that arrived after it.
    let mut admitted = vec![t0; n as usize];
    for &(i, at) in &order {
        admitted[i] = at;
    }
    let late = (0..n as usize)
        .filter(|&i| (i + 1..n as usize).any(|j| admitted[i] > admitted[j] + ms(20)))
        .count();
    assert_eq!(late, 0, "{order:?}");
}

#[test]
fn a_release_burst_is_one_poll_intervals_worth() {
    let a = small(0.001);
    let t0 = first_probe_succeeds(&a, A, Instant::now());
    let released = Grant::new(GrantSource::Released, 0.0);
    for _ in 0..99 {
        a.record(
            A,
            AttemptRecord::new(2, Some(released), AttemptResult::Success),
            t0,
        );
    }
    assert_eq!(a.release_rate(A, t0), 1_000.0);
    // 100 ms unasked earns 100, but at most 20 ms' worth (20) go at once.
    assert_eq!(released_at_once(&a, t0 + ms(100), 1_000), 20);
}

#[test]
fn first_attempts_deposit_a_tenth_of_a_token_each() {
    let a = small(1.0);
    let t0 = Instant::now();
    assert_eq!(source(a.admit(A, RETRY, t0)), Some(GrantSource::Token));
    for _ in 0..5 {
        a.first_attempt(A, t0);
    }
    assert_eq!(a.tokens(A), 0.5);
    for _ in 0..5 {
        a.first_attempt(A, t0);
    }
    assert_eq!(source(a.admit(A, RETRY, t0)), Some(GrantSource::Token));
}

// ---- Through the engine: the deadline and the wait are measured.

/// Sleeps longer than asked: `extra` plus `num/den` of the request.
#[derive(Clone)]
struct Late {
    clock: ManualClock,
    extra: Duration,
    num: u32,
    den: u32,
}

impl Sleeper for Late {
    fn sleep(&self, d: Duration) -> BoxFuture<()> {
        self.clock.sleep(d + self.extra + d * self.num / self.den)
    }
}

#[tokio::test]
async fn a_late_sleeper_never_starts_an_attempt_past_its_window() {
    let clock = ManualClock::new();
    let late = Late {
        clock: clock.clone(),
        extra: ms(200),
        num: 0,
        den: 1,
    };
    let p = RetryPolicy::builder()
        .clock(clock.clone())
        .sleeper(late)
        .seed(1)
        .max_attempts(5)
        .backoff(ms(50), ms(50))
        .jitter(Jitter::None)
        .deadline(ms(300))
        .min_attempt_window(ms(100))
        .build()
        .unwrap();
    let start = clock.now();
    let mut begun = Vec::new();
    let (_, report) = retry_in(&p, A, |ctx| {
        begun.push((clock.now() - start, ctx.time_left()));
        async { Outcome::transient(()) }
    })
    .await;
    // The backoff asked 50 ms and took 250: 50 ms left, less than the
    // window an attempt needs, so none starts.
    assert_eq!(begun.len(), 1, "{begun:?}");
    assert_eq!(report.attempts(), 1);
    assert_eq!(report.stop_reason(), StopReason::Deadline);
    assert_eq!(clock.now() - start, ms(250));
}

#[tokio::test]
async fn the_admission_wait_is_the_time_elapsed_not_the_waits_asked() {
    let clock = ManualClock::new();
    // Every sleep takes a tenth longer than asked.
    let late = Late {
        clock: clock.clone(),
        extra: Duration::ZERO,
        num: 1,
        den: 10,
    };
    let admission = Arc::new(adaptive(AdaptiveConfig {
        capacity: 0.001,
        probe_interval: Duration::from_secs(3_600),
        max_probe_interval: Duration::from_secs(3_600),
        ..AdaptiveConfig::default()
    }));
    let p = RetryPolicy::builder()
        .clock(clock.clone())
        .sleeper(late)
        .seed(1)
        .max_attempts(2)
        .backoff(ms(10), ms(10))
        .jitter(Jitter::None)
        .deadline(Duration::from_secs(60))
        .shared_admission(admission)
        .build()
        .unwrap();
    let start = clock.now();
    let (_, report) = retry_in(&p, A, |_| async { Outcome::transient(()) }).await;
    assert_eq!(report.stop_reason(), StopReason::BudgetExhausted);
    let elapsed = clock.now() - start;
    // 10 s of admission wait (10 ms of backoff, 11 ms slept), ended by the
    // longest admission wait, not by the 60 s deadline.
    assert!(
        report.admission_wait() >= Duration::from_secs(10),
        "{report:?}"
    );
    assert!(
        report.admission_wait() <= Duration::from_secs(10) + ms(25),
        "{report:?}"
    );
    assert_eq!(report.admission_wait() + ms(11), elapsed);
}

#[test]
fn a_blips_waiting_retries_are_all_released_soon_after_it() {
    // 400 retries start waiting within 100 ms; the host fails until 1 s,
    // then answers everything. Each asks again when told.
    let a = small(10.0);
    let t0 = Instant::now();
    let n = 400u64;
    let arrivals: Vec<Instant> = (0..n)
        .map(|i| t0 + Duration::from_micros(i * 250))
        .collect();
    let mut next_ask: Vec<Option<Instant>> = arrivals.iter().copied().map(Some).collect();
    let mut last = t0;
    let mut step = 0u64;
    while next_ask.iter().any(Option::is_some) {
        let now = t0 + Duration::from_micros(step * 500);
        step += 1;
        assert!(step < 40_000, "still waiting after 20 s");
        // Later arrivals ask first within a step, as they may.
        for i in (0..n as usize).rev() {
            let Some(due) = next_ask[i] else { continue };
            if due > now {
                continue;
            }
            let answer = a.admit(A, retry_after(now - arrivals[i]), now);
            match answer {
                Admission::Admit(_) => {
                    let ok = now >= t0 + Duration::from_secs(1);
                    let result = if ok {
                        AttemptResult::Success
                    } else {
                        AttemptResult::Failure
                    };
                    record(&a, A, answer, result, now);
                    if ok {
                        next_ask[i] = None;
                        last = now;
                    } else {
                        // Failed: it backs off 100 ms and asks again.
                        next_ask[i] = Some(now + ms(100));
                    }
                }
                Admission::Wait(w) => next_ask[i] = Some(now + w),
                _ => panic!("refused {i}"),
            }
        }
    }
    eprintln!("all released by {:?}", last - t0);
    assert!(last - t0 <= Duration::from_secs(3), "{:?}", last - t0);
}

/// Each dry spell's first probe waits the probe interval, not only the
/// first spell's: after the host recovered and the bucket refilled, the
/// next time it runs dry the probe does not go at once.
#[test]
fn every_dry_spell_probes_after_the_interval() {
    let a = small(1.0);
    let p = b();
    let t0 = Instant::now();
    assert_eq!(source(a.admit(p, RETRY, t0)), Some(GrantSource::Token));
    assert!(matches!(a.admit(p, RETRY, t0), Admission::Wait(_)));
    let probe = a.admit(p, RETRY, t0 + ms(250));
    assert_eq!(source(probe), Some(GrantSource::Probe));
    let Admission::Admit(grant) = probe else {
        unreachable!()
    };
    a.record(
        p,
        AttemptRecord::new(2, Some(grant), AttemptResult::Success),
        t0 + ms(260),
    );
    // An hour of healthy first attempts refills the bucket.
    let t1 = t0 + Duration::from_secs(3600);
    for _ in 0..100 {
        a.first_attempt(p, t1);
    }
    assert_eq!(source(a.admit(p, RETRY, t1)), Some(GrantSource::Token));
    // Dry again: the next retry waits; the probe goes 250 ms later.
    let next = a.admit(p, RETRY, t1);
    assert!(matches!(next, Admission::Wait(_)), "{next:?} at once");
    assert_eq!(
        source(a.admit(p, RETRY, t1 + ms(250))),
        Some(GrantSource::Probe)
    );
}

/// A probe whose caller dropped it never reports: with an unbounded
/// admission wait its slot is still freed (within 30 s), so the host is
/// probed again.
#[test]
fn a_lost_probe_frees_its_slot_even_with_an_unbounded_wait() {
    let a = adaptive(AdaptiveConfig {
        capacity: 1.0,
        max_admission_wait: Duration::MAX,
        ..AdaptiveConfig::default()
    });
    let p = b();
    let t0 = Instant::now();
    assert_eq!(source(a.admit(p, RETRY, t0)), Some(GrantSource::Token));
    assert!(matches!(a.admit(p, RETRY, t0), Admission::Wait(_)));
    assert_eq!(
        source(a.admit(p, RETRY, t0 + ms(250))),
        Some(GrantSource::Probe)
    );
    // The probe's caller went away: nothing is recorded. A day later the
    // host is probed again.
    let later = t0 + Duration::from_secs(24 * 3600);
    let mut probed = false;
    for i in 0..10 {
        if source(a.admit(p, RETRY, later + ms(i * 100))) == Some(GrantSource::Probe) {
            probed = true;
            break;
        }
    }
    assert!(probed, "the host was never probed again");
}
