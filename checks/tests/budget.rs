//! Retry admission, shared by the whole client: the same behavioural tests
//! over every strategy, then the adaptive admission's state machine (wait,
//! probe, release, collapse) on a manual clock.

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest_safe_retry::admission::{
    AdaptiveAdmission, AdaptiveConfig, Admission, AttemptRecord, AttemptResult, GrantSource,
    NoAdmission, Partition, RetryAdmission, RetryKind, RetryRequest, TokenBucket,
    TokenBucketConfig,
};
use reqwest_safe_retry::retry::{retry, Outcome};
use reqwest_safe_retry::time::{Clock, ManualClock};
use reqwest_safe_retry::{Jitter, RetryMiddleware, RetryPolicy, RetryReport, StopReason};
use support::{client, ms, policy};

/// A fresh admission of each strategy, with `capacity` tokens where it has
/// a bucket.
fn adaptive(capacity: f64) -> Arc<dyn RetryAdmission> {
    Arc::new(
        AdaptiveAdmission::new(AdaptiveConfig {
            capacity,
            ..AdaptiveConfig::default()
        })
        .unwrap(),
    )
}

fn token_bucket(capacity: f64) -> Arc<dyn RetryAdmission> {
    Arc::new(
        TokenBucket::new(TokenBucketConfig {
            capacity,
            ..TokenBucketConfig::default()
        })
        .unwrap(),
    )
}

fn none(_capacity: f64) -> Arc<dyn RetryAdmission> {
    Arc::new(NoAdmission)
}

/// Runs each behavioural test once per strategy, as `both_stores!` does for
/// the server's stores.
macro_rules! every_admission {
    ($($test:ident),* $(,)?) => {
        mod adaptive_admission {
            $(#[tokio::test] async fn $test() { super::$test(super::adaptive, true).await })*
        }
        mod token_bucket_admission {
            $(#[tokio::test] async fn $test() { super::$test(super::token_bucket, true).await })*
        }
        mod no_admission {
            $(#[tokio::test] async fn $test() { super::$test(super::none, false).await })*
        }
    };
}

every_admission!(
    first_attempts_are_never_held_back,
    a_transient_failure_is_retried_to_success,
    an_outage_is_bounded_by_the_budget,
    clones_of_the_client_share_one_admission,
    no_token_is_spent_on_a_deadline_give_up,
);

type Make = fn(f64) -> Arc<dyn RetryAdmission>;

fn report(r: &reqwest::Response) -> RetryReport {
    r.extensions().get::<RetryReport>().unwrap().clone()
}

async fn first_attempts_are_never_held_back(make: Make, _bounded: bool) {
    let server = support::answering(503).await;
    let clock = ManualClock::new();
    let p = policy(&clock)
        .max_attempts(1)
        .shared_admission(make(0.001))
        .build()
        .unwrap();
    let (c, _) = client(p.clone());
    for _ in 0..50 {
        let r = c.get(server.uri()).send().await.unwrap();
        assert_eq!(report(&r).stop_reason(), StopReason::AttemptsExhausted);
    }
    assert_eq!(server.received_requests().await.unwrap().len(), 50);
    assert!(clock.sleeps().is_empty(), "nothing waited");
    assert_eq!(p.metrics().snapshot().waits, 0);
}

async fn a_transient_failure_is_retried_to_success(make: Make, _bounded: bool) {
    let server = wiremock::MockServer::start().await;
    wiremock::Mock::given(wiremock::matchers::any())
        .respond_with(wiremock::ResponseTemplate::new(503))
        .up_to_n_times(1)
        .mount(&server)
        .await;
    wiremock::Mock::given(wiremock::matchers::any())
        .respond_with(wiremock::ResponseTemplate::new(200))
        .mount(&server)
        .await;
    let clock = ManualClock::new();
    let p = policy(&clock).shared_admission(make(10.0)).build().unwrap();
    let (c, _) = client(p.clone());
    let r = c.get(server.uri()).send().await.unwrap();
    let rep = report(&r);
    assert_eq!(
        (rep.attempts(), rep.stop_reason()),
        (2, StopReason::Success)
    );
    let m = p.metrics().snapshot();
    assert_eq!((m.retries, m.admissions, m.budget_rejections), (1, 1, 0));
}

async fn an_outage_is_bounded_by_the_budget(make: Make, bounded: bool) {
    let server = support::answering(503).await;
    let clock = ManualClock::new();
    // 200 operations, one after another, each with up to 5 attempts.
    let p = policy(&clock)
        .max_attempts(5)
        .deadline(Duration::from_secs(5))
        .shared_admission(make(10.0))
        .build()
        .unwrap();
    let (c, _) = client(p.clone());
    for _ in 0..200 {
        c.get(server.uri()).send().await.unwrap();
    }
    let received = server.received_requests().await.unwrap().len();
    let m = p.metrics().snapshot();
    assert_eq!(m.retries as usize, received - 200);
    if bounded {
        // 10 tokens + 200 × 0.1, plus (adaptive) the probes: one per 1 s at
        // most, and the clock moved less than 200 × 5 s.
        let probes = m.probes as usize;
        assert!(received <= 200 + 30 + probes, "{received} attempts");
        assert!(probes * 1000 <= clock.elapsed().as_millis() as usize + 1000);
        assert!(received >= 200 + 10, "the initial tokens were spent");
        assert!(m.budget_rejections >= 150, "{m:?}");
        assert!(received < 300, "{received}: near a tenth, not 5×");
    } else {
        assert_eq!(received, 1000);
    }
}

async fn clones_of_the_client_share_one_admission(make: Make, bounded: bool) {
    let failing = support::answering(503).await;
    let clock = ManualClock::new();
    let p = policy(&clock)
        .max_attempts(2)
        .deadline(ms(500))
        .shared_admission(make(1.0))
        .build()
        .unwrap();
    let (a, _) = client(p.clone());
    let b = a.clone();
    let (other_client_same_policy, _) = client(p.clone());
    let first = a.get(failing.uri()).send().await.unwrap();
    assert_eq!(report(&first).attempts(), 2);
    let mut last = None;
    for c in [&b, &other_client_same_policy] {
        last = Some(report(&c.get(failing.uri()).send().await.unwrap()));
    }
    let m = p.metrics().snapshot();
    assert_eq!(m.calls, 3);
    if bounded {
        // The one token is gone (and the adaptive admission's one probe):
        // the last clone finds nothing left.
        let last = last.unwrap();
        assert_eq!(last.stop_reason(), StopReason::BudgetExhausted, "{last:?}");
        assert!(m.admissions <= 2 && m.budget_rejections >= 1, "{m:?}");
    } else {
        assert_eq!(m.admissions, 3);
    }
}

async fn no_token_is_spent_on_a_deadline_give_up(make: Make, _bounded: bool) {
    let admission = make(1.0);
    let server = support::answering(503).await;
    let clock = ManualClock::new();
    // The first backoff (400 ms) plus the window (100 ms) does not fit in
    // 450 ms: the operation gives up before asking for admission.
    let p = policy(&clock)
        .backoff(ms(400), ms(400))
        .jitter(Jitter::None)
        .deadline(ms(450))
        .shared_admission(admission.clone())
        .build()
        .unwrap();
    let (c, _) = client(p.clone());
    let r = c.get(server.uri()).send().await.unwrap();
    assert_eq!(report(&r).stop_reason(), StopReason::Deadline);
    // The token is still there: the next retry is admitted at once.
    let now = Instant::now();
    let retry = RetryRequest::new(RetryKind::Transient, Duration::ZERO);
    match admission.admit(P, retry, now) {
        Admission::Admit(g) => assert_ne!(g.source(), GrantSource::Probe),
        other => panic!("{other:?}"),
    }
    assert_eq!(p.metrics().snapshot().admissions, 0);
}

// ---- The adaptive admission's state machine, deterministic.

fn small(capacity: f64) -> AdaptiveAdmission {
    AdaptiveAdmission::new(AdaptiveConfig {
        capacity,
        first_attempt_deposit: 0.1,
        ..AdaptiveConfig::default()
    })
    .unwrap()
}

/// The one partition these state-machine tests use.
const P: Partition = Partition::SINGLE;

const RETRY: RetryRequest = RetryRequest::new(RetryKind::Transient, Duration::ZERO);

fn source(a: Admission) -> Option<GrantSource> {
    match a {
        Admission::Admit(g) => Some(g.source()),
        _ => None,
    }
}

fn outcome(a: &AdaptiveAdmission, grant: Admission, result: AttemptResult, now: Instant) {
    let Admission::Admit(g) = grant else {
        panic!("not admitted: {grant:?}")
    };
    a.record(P, AttemptRecord::new(2, Some(g), result), now);
}

/// Runs the bucket dry, sends the first probe when it is due and records
/// its success; returns when.
fn first_probe_succeeds(a: &AdaptiveAdmission) -> Instant {
    let start = Instant::now();
    assert!(matches!(a.admit(P, RETRY, start), Admission::Wait(_)));
    let t0 = start + ms(250);
    let probe = a.admit(P, RETRY, t0);
    assert_eq!(source(probe), Some(GrantSource::Probe));
    outcome(a, probe, AttemptResult::Success, t0);
    t0
}

#[test]
fn an_empty_bucket_waits_instead_of_refusing() {
    let a = small(1.0);
    let t0 = Instant::now();
    assert_eq!(source(a.admit(P, RETRY, t0)), Some(GrantSource::Token));
    // Neither a token nor a probe is due: wait one poll interval.
    assert_eq!(a.admit(P, RETRY, t0), Admission::Wait(ms(20)));
    // Close to the first probe (250 ms after the bucket ran dry), the wait
    // ends at it.
    assert_eq!(a.admit(P, RETRY, t0 + ms(240)), Admission::Wait(ms(10)));
    assert_eq!(
        source(a.admit(P, RETRY, t0 + ms(250))),
        Some(GrantSource::Probe)
    );
    // A retry that already waited the longest it may is refused.
    let tired = RetryRequest::new(RetryKind::Transient, Duration::from_secs(10));
    assert_eq!(a.admit(P, tired, t0 + ms(100)), Admission::Refuse);
}

#[test]
fn probes_go_out_at_the_floor_rate_and_back_off_while_they_fail() {
    let a = small(0.001);
    let t0 = Instant::now();
    let mut probes = Vec::new();
    // Ask every 10 ms for 60 s; every probe fails at once.
    for i in 0..6000u64 {
        let now = t0 + ms(i * 10);
        let answer = a.admit(P, RETRY, now);
        if let Some(GrantSource::Probe) = source(answer) {
            probes.push(i * 10);
            outcome(&a, answer, AttemptResult::Failure, now);
        }
    }
    // 250 ms after the bucket ran dry, then 0.5, 1, 2, 4, 8, 16, 16…
    // seconds after each failure.
    assert_eq!(
        probes,
        [250, 750, 1_750, 3_750, 7_750, 15_750, 31_750, 47_750]
    );
    assert_eq!(a.probe_interval(P), Duration::from_secs(16));
    // A success resets the interval and makes a probe due at once.
    let now = t0 + Duration::from_secs(50);
    a.record(P, AttemptRecord::new(1, None, AttemptResult::Success), now);
    assert_eq!(a.probe_interval(P), ms(250));
    assert_eq!(source(a.admit(P, RETRY, now)), Some(GrantSource::Probe));
}

/// Asks every millisecond from `from` for `span`, records each admitted
/// retry's result at once, and returns (released admissions, probes).
fn ask_every_ms(
    a: &AdaptiveAdmission,
    from: Instant,
    span: Duration,
    result: AttemptResult,
) -> (u32, u32) {
    let (mut released, mut probes) = (0, 0);
    for i in 0..span.as_millis() as u64 {
        let now = from + ms(i);
        let answer = a.admit(P, RETRY, now);
        match source(answer) {
            Some(GrantSource::Released) => released += 1,
            Some(GrantSource::Probe) => probes += 1,
            _ => continue,
        }
        outcome(a, answer, result, now);
    }
    (released, probes)
}

#[test]
fn a_successful_probe_releases_waiting_retries_with_slow_start() {
    let a = small(0.001);
    let t0 = first_probe_succeeds(&a);
    assert_eq!(a.release_rate(P, t0), 10.0);
    // Nothing is released in a burst: the first retry after 100 ms.
    assert!(matches!(a.admit(P, RETRY, t0 + ms(99)), Admission::Wait(_)));
    // While they succeed, each success raises the rate by 10/s: the number
    // released per 100 ms grows exponentially.
    let mut per_window = Vec::new();
    for w in 0..6 {
        let (released, _) =
            ask_every_ms(&a, t0 + ms(99 + 100 * w), ms(100), AttemptResult::Success);
        per_window.push(released);
    }
    // Asking once a millisecond bounds a window at 100.
    assert_eq!(per_window[0], 3);
    for w in per_window.windows(2) {
        assert!(w[1] >= (2 * w[0]).min(100), "{per_window:?}");
    }
    assert_eq!(per_window[5], 100);
}

#[test]
fn failures_collapse_the_release_rate() {
    let a = small(0.001);
    let t0 = Instant::now();
    let released = reqwest_safe_retry::admission::Grant::new(GrantSource::Released, 0.0);
    for _ in 0..20 {
        a.record(
            P,
            AttemptRecord::new(2, Some(released), AttemptResult::Success),
            t0,
        );
    }
    assert_eq!(a.release_rate(P, t0), 200.0);
    let fail = AttemptRecord::new(2, Some(released), AttemptResult::Failure);
    a.record(P, fail, t0);
    assert_eq!(a.release_rate(P, t0), 100.0);
    // A first attempt's failure is no retry failing: nothing collapses.
    a.record(P, AttemptRecord::new(1, None, AttemptResult::Failure), t0);
    assert_eq!(a.release_rate(P, t0), 100.0);
    // Halving below one per second leaves only probes.
    for _ in 0..7 {
        a.record(P, fail, t0);
    }
    assert_eq!(a.release_rate(P, t0), 0.0);
    let (released, probes) = ask_every_ms(
        &a,
        t0 + ms(1),
        Duration::from_secs(2),
        AttemptResult::Failure,
    );
    assert_eq!(released, 0);
    assert!(probes <= 3, "{probes}");
}

#[test]
fn released_retries_track_a_rate_limited_server() {
    // The server takes 100 retries per second and fails the rest: the
    // release rate settles near that instead of growing without end or
    // collapsing to zero.
    let a = small(0.001);
    let t0 = first_probe_succeeds(&a);
    let mut served_this_second = 0;
    let mut per_second = Vec::new();
    for i in 1..5000u64 {
        let now = t0 + ms(i);
        if i % 1000 == 0 {
            per_second.push(served_this_second);
            served_this_second = 0;
        }
        let answer = a.admit(P, RETRY, now);
        if source(answer).is_none() {
            continue;
        }
        let ok = served_this_second < 100;
        served_this_second += 1;
        let result = if ok {
            AttemptResult::Success
        } else {
            AttemptResult::Failure
        };
        outcome(&a, answer, result, now);
    }
    // After the ramp, every second sends 100 to 200 retries.
    assert!(
        per_second[1..].iter().all(|&n| (100..=200).contains(&n)),
        "{per_second:?}"
    );
}

#[test]
fn a_fresh_admission_is_a_warmed_one() {
    let fresh = small(10.0);
    let warmed = small(10.0);
    let t0 = Instant::now();
    for _ in 0..1000 {
        warmed.first_attempt(P, t0);
        warmed.record(P, AttemptRecord::new(1, None, AttemptResult::Success), t0);
    }
    assert_eq!(fresh.tokens(P), warmed.tokens(P));
    assert_eq!(fresh.release_rate(P, t0), warmed.release_rate(P, t0));
    for _ in 0..12 {
        assert_eq!(
            source(fresh.admit(P, RETRY, t0)),
            source(warmed.admit(P, RETRY, t0))
        );
    }
}

// ---- Through the engine, on a manual clock.

#[tokio::test]
async fn a_retry_waits_for_admission_and_the_report_says_how_long() {
    let clock = ManualClock::new();
    let admission = Arc::new(small(0.001));
    let p = policy(&clock)
        .backoff(ms(10), ms(10))
        .jitter(Jitter::None)
        .max_attempts(3)
        .shared_admission(admission.clone())
        .build()
        .unwrap();
    // Use up the probe.
    let _ = admission.admit(P, RETRY, clock.now());
    let (_, report) = retry(&p, |ctx| async move {
        if ctx.attempt() < 2 {
            Outcome::transient(())
        } else {
            Outcome::success(())
        }
    })
    .await;
    assert_eq!(report.stop_reason(), StopReason::Success);
    // Slept 10 ms of backoff, then waited until the next probe was due.
    assert_eq!(report.delays(), [ms(10)]);
    assert_eq!(report.admission_wait(), ms(240));
    assert_eq!(report.elapsed(), ms(250));
    let m = p.metrics().snapshot();
    assert_eq!((m.waits, m.probes, m.admissions), (1, 1, 1));
}

/// A host's end that answers 200, or 503 while its switch is on, with no
/// socket.
#[derive(Clone, Default)]
struct Switch(Arc<AtomicBool>);

#[async_trait::async_trait]
impl reqwest_middleware::Middleware for Switch {
    async fn handle(
        &self,
        _: reqwest::Request,
        _: &mut http::Extensions,
        _: reqwest_middleware::Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        let status = if self.0.load(Ordering::Relaxed) {
            503
        } else {
            200
        };
        let answer = http::Response::builder().status(status).body("").unwrap();
        Ok(reqwest::Response::from(answer))
    }
}

/// Every first attempt through the middleware deposits into its host's
/// bucket, one that succeeds too: the success path takes the admission's
/// lock for it, and a success path that skipped it would leave the bucket
/// as the outage left it. After an outage has run the bucket dry, twenty
/// calls that succeed fund the two retries of the next call that fails,
/// which then waits for nothing.
#[tokio::test]
async fn calls_that_succeed_fund_their_hosts_retries() {
    let clock = ManualClock::new();
    let admission = Arc::new(small(10.0));
    let p = policy(&clock)
        .max_attempts(3)
        .shared_admission(admission.clone())
        .build()
        .unwrap();
    let server = Switch::default();
    let c = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(RetryMiddleware::new(p))
        .with(server.clone())
        .build();
    let url = "http://a.example/items/17";
    let host = Partition::of_url(&url.parse().unwrap());
    for _ in 0..10 {
        let token = admission.admit(host, RETRY, clock.now());
        assert_eq!(source(token), Some(GrantSource::Token));
    }
    assert_eq!(admission.tokens(host), 0.0);
    for _ in 0..20 {
        let r = c.get(url).send().await.unwrap();
        assert_eq!(report(&r).stop_reason(), StopReason::Success);
    }
    let tokens = admission.tokens(host);
    assert!((tokens - 2.0).abs() < 1e-9, "{tokens}");
    server.0.store(true, Ordering::Relaxed);
    let r = c.get(url).send().await.unwrap();
    let rep = report(&r);
    assert_eq!(
        (rep.attempts(), rep.stop_reason()),
        (3, StopReason::AttemptsExhausted)
    );
    assert_eq!(rep.admission_wait(), Duration::ZERO);
    // Its own first attempt deposited too: 2 + 0.1 − 2 retries.
    let tokens = admission.tokens(host);
    assert!((tokens - 0.1).abs() < 1e-9, "{tokens}");
}

#[tokio::test]
async fn a_wait_that_meets_the_deadline_ends_with_budget_exhausted() {
    let clock = ManualClock::new();
    let admission = Arc::new(small(0.001));
    let p = policy(&clock)
        .backoff(ms(10), ms(10))
        .jitter(Jitter::None)
        .deadline(ms(200))
        .min_attempt_window(ms(100))
        .shared_admission(admission.clone())
        .build()
        .unwrap();
    let _ = admission.admit(P, RETRY, clock.now());
    let mut attempts = 0;
    let (_, report) = retry(&p, |_| {
        attempts += 1;
        async { Outcome::transient(()) }
    })
    .await;
    assert_eq!(attempts, 1, "no retry was sent");
    assert_eq!(report.stop_reason(), StopReason::BudgetExhausted);
    // It waited until exactly one attempt window was left, no longer.
    assert_eq!(clock.elapsed(), ms(100));
    assert_eq!(report.admission_wait(), ms(90));
    let m = p.metrics().snapshot();
    assert_eq!((m.budget_rejections, m.admissions, m.retries), (1, 0, 0));
}

#[tokio::test]
async fn the_fail_fast_bucket_refuses_before_sleeping() {
    let clock = ManualClock::new();
    let p = policy(&clock)
        .token_bucket(TokenBucketConfig {
            capacity: 1.0,
            first_attempt_deposit: 0.0,
            ..TokenBucketConfig::default()
        })
        .build()
        .unwrap();
    let (_, first) = retry(&p, |_| async { Outcome::transient(()) }).await;
    assert_eq!(first.attempts(), 2);
    let slept = clock.sleeps().len();
    let (_, second) = retry(&p, |_| async { Outcome::transient(()) }).await;
    assert_eq!(second.attempts(), 1);
    assert_eq!(second.stop_reason(), StopReason::BudgetExhausted);
    assert_eq!(clock.sleeps().len(), slept, "no sleep before failing fast");
}

#[test]
fn adaptive_admission_is_the_default() {
    let p = RetryPolicy::default();
    assert!(format!("{:?}", p.admission()).starts_with("AdaptiveAdmission"));
}

#[tokio::test]
async fn a_timeout_costs_what_the_bucket_charges_for_one_through_http() {
    // A server that never answers: each attempt times out (100 ms, real
    // time: the cost is checked, not the timing).
    let (addr, count) = support::faulty_server(support::Fault::Hang).await;
    let clock = ManualClock::new();
    let p = policy(&clock)
        .max_attempts(10)
        .attempt_timeout(ms(100))
        .token_bucket(TokenBucketConfig {
            capacity: 10.0,
            first_attempt_deposit: 0.0,
            timeout_cost: 5.0,
            ..TokenBucketConfig::default()
        })
        .build()
        .unwrap();
    let (c, _) = client(p);
    let (err, report) = support::send_failing(c.get(format!("http://{addr}/"))).await;
    assert!(err.is_timeout());
    // 10 tokens at 5 per timeout: two retries, not nine.
    assert_eq!(report.attempts(), 3);
    assert_eq!(report.stop_reason(), StopReason::BudgetExhausted);
    assert_eq!(count.load(std::sync::atomic::Ordering::SeqCst), 3);
}
