//! Pacing's unit tests: the rate search against a leaky bucket, holds,
//! probes upward, and hostile numbers.

use super::*;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[test]
fn releases_are_spread_and_none_comes_before_the_hold() {
    let t0 = Instant::now();
    let mut p = Pace::begin(t0, Some(5.0), 10_000.0);
    p.hold(t0, Duration::from_secs(1));
    assert_eq!(p.release(t0), Err(Duration::from_secs(1)));
    let t1 = t0 + Duration::from_secs(1);
    assert_eq!(p.release(t1), Ok(()));
    // Everyone else waits, not one wave: asked again when the slot would
    // come were the release accepted (the rate ×3)…
    let sooner = spacing(5.0 * RAMP_GROWTH);
    assert_eq!(p.release(t1), Err(sooner));
    // …but with no answer yet, none goes before the slot.
    assert!(p.release(t1 + sooner).is_err());
    assert!(p.release(t1 + ms(200)).is_err(), "no margin for transit");
    assert_eq!(p.release(t1 + spacing(5.0)), Ok(()));
}

/// Issue 42: once a hold ends, every accepted release raises the rate
/// ×[`RAMP_GROWTH`] and brings the next slot in, so a queue of 40 held
/// behind a server that now accepts everything is gone within a few
/// hundred milliseconds, not at the starting rate (20 s at 2/s).
#[test]
fn after_a_hold_every_accepted_release_raises_the_rate() {
    let t0 = Instant::now();
    let mut p = Pace::begin(t0, None, 10_000.0);
    p.hold(t0, Duration::from_secs(2));
    let mut now = t0 + Duration::from_secs(2);
    let mut sent = Vec::new();
    while sent.len() < 40 {
        match p.release(now) {
            Ok(()) => {
                sent.push(now);
                p.succeeded(now, true);
            }
            Err(wait) => {
                assert!(!wait.is_zero());
                now += wait;
            }
        }
    }
    let took = sent[39] - sent[0];
    assert!(took <= ms(300), "{took:?}: {sent:?}");
    // Spread: one at a time, the second a grown interval after the first.
    assert!(sent[1] - sent[0] >= ms(160), "{sent:?}");
    assert!(sent.windows(2).all(|w| w[1] > w[0]), "{sent:?}");
}

/// A 429 to the first release after a hold says the hold's reason lasts
/// (the server is still closed), not that the rate was too high: it
/// holds again and lowers nothing. The next 429 does.
#[test]
fn a_429_to_the_first_release_after_a_hold_only_holds_again() {
    let t0 = Instant::now();
    let mut p = Pace::begin(t0, None, 10_000.0);
    p.hold(t0, Duration::from_secs(1));
    let t1 = t0 + Duration::from_secs(1);
    p.release(t1).unwrap();
    p.throttled(t1, true, true, Some(Duration::from_secs(1)));
    assert_eq!(p.rate(), START_RATE);
    assert_eq!(p.release(t1), Err(Duration::from_secs(1)));
    let t2 = t1 + Duration::from_secs(1);
    p.release(t2).unwrap();
    p.succeeded(t2, true);
    let t3 = t2 + ms(200);
    p.release(t3).unwrap();
    p.throttled(t3, true, true, None);
    assert!(p.rate() < START_RATE * RAMP_GROWTH, "{}", p.rate());
}

/// Issue 42: a 429 to a call the pacing did not send (a new call let
/// through) holds nothing once a hold was set: its caller sleeps its own
/// Retry-After, and the queue is not held until the latest of many
/// callers' hints after the server has recovered.
#[test]
fn new_calls_429s_do_not_stretch_the_hold() {
    let t0 = Instant::now();
    let mut p = Pace::begin(t0, None, 10_000.0);
    p.throttled(t0, false, true, Some(Duration::from_secs(1)));
    for i in 1..40 {
        p.throttled(t0 + ms(50 * i), false, true, Some(Duration::from_secs(1)));
    }
    assert_eq!(p.release(t0 + ms(500)), Err(ms(500)));
    assert_eq!(p.release(t0 + Duration::from_secs(1)), Ok(()));
}

/// Issue 42: a published window's average (`q=100;w=60`, 1.67/s) caps
/// the rate only while the quota is spent: past its reset, accepted
/// releases raise it. Where going faster after the reset is refused (the
/// average is the server's rate after all), the cap is kept.
#[test]
fn a_published_average_caps_only_while_the_quota_is_spent() {
    let t0 = Instant::now();
    let quota = 100.0 / 60.0;
    let mut p = Pace::begin(t0, Some(quota), 10_000.0);
    p.hold_spent_quota(t0, Duration::from_secs(3));
    let t1 = t0 + Duration::from_secs(3);
    p.release(t1).unwrap();
    p.succeeded(t1, true);
    assert!(p.rate() > quota * 2.0, "{}", p.rate());
    // A server whose average is its rate refuses the faster release…
    let t2 = t1 + spacing(p.rate());
    p.release(t2).unwrap();
    p.throttled(t2, true, true, None);
    // …and the cap is back, for good.
    assert_eq!(p.rate(), quota);
    let t3 = t2 + Duration::from_secs(5);
    p.release(t3).unwrap();
    p.succeeded(t3, true);
    assert_eq!(p.rate(), quota);
}

/// Releases `n` requests to a leaky bucket that admits one per
/// `1 / per_second` and throttles the rest; returns the rejections.
fn against_a_leaky_bucket(p: &mut Pace, t0: Instant, per_second: f64, n: u32) -> u32 {
    let interval = Duration::from_secs_f64(1.0 / per_second);
    let (mut now, mut last, mut rejected) = (t0, None::<Instant>, 0);
    for _ in 0..n {
        if let Err(wait) = p.release(now) {
            now += wait;
            p.release(now).unwrap();
        }
        if last.is_none_or(|l| now - l >= interval) {
            last = Some(now);
            p.succeeded(now, true);
        } else {
            rejected += 1;
            p.throttled(now, true, true, None);
        }
    }
    rejected
}

#[test]
fn the_search_finds_a_leaky_buckets_rate_from_below_in_a_few_rejections() {
    for per_second in [1.0, 5.0, 20.0, 333.0] {
        let t0 = Instant::now();
        let mut p = Pace::begin(t0, None, 10_000.0);
        let rejected = against_a_leaky_bucket(&mut p, t0, per_second, 60);
        // The search's steps, and a probe upward after 1 s and 10
        // releases, then 2 s and 20, ...
        assert!(rejected <= 9, "{per_second}/s: {rejected} rejected");
        let rate = p.rate();
        assert!(
            rate <= per_second * DISCOVER_GROWTH * 1.001 && rate >= per_second * 0.9,
            "{per_second}/s: settled at {rate}"
        );
        // Settled: the next 100 go through but for the rare probe upward
        // that follows a host that lifted its limit.
        let rejected =
            against_a_leaky_bucket(&mut p, t0 + Duration::from_secs(600), per_second, 100);
        assert!(
            rejected <= 3,
            "{per_second}/s: {rejected} rejected once settled"
        );
    }
    // A published quota is the starting rate: nothing is rejected.
    let t0 = Instant::now();
    let mut p = Pace::begin(t0, Some(5.0), 10_000.0);
    assert_eq!(against_a_leaky_bucket(&mut p, t0, 5.0, 100), 0);
}

#[test]
fn throttles_of_requests_sent_before_the_pacing_only_hold_it() {
    let t0 = Instant::now();
    let mut p = Pace::begin(t0, None, 10_000.0);
    p.throttled(t0, false, true, Some(Duration::from_secs(9)));
    assert_eq!(p.rate(), START_RATE);
    assert_eq!(p.release(t0 + ms(1)), Err(Duration::from_secs(9) - ms(1)));
}

#[test]
fn a_host_that_admits_nothing_is_not_paced_after_its_hold() {
    let t0 = Instant::now();
    let mut p = Pace::begin(t0, None, 10_000.0);
    p.hold(t0, Duration::from_secs(1));
    assert!(p.governs(t0));
    let t1 = t0 + Duration::from_secs(2);
    for i in 0..DOWN_AFTER {
        assert!(p.governs(t1), "after {i} throttled releases");
        p.throttled(t1, true, false, None);
    }
    assert!(!p.governs(t1));
    // One success: it is rate-limited after all.
    p.succeeded(t1, true);
    assert!(p.governs(t1));
}

/// A 429's Retry-After holds the releases even once pacing is
/// releasing (issue 29, finding 6).
#[test]
fn a_retry_after_holds_the_releases_once_they_have_begun() {
    let t0 = Instant::now();
    let mut p = Pace::begin(t0, Some(10.0), 10_000.0);
    assert_eq!(p.release(t0 + spacing(10.0)), Ok(()));
    let t1 = t0 + spacing(10.0) + ms(10);
    p.throttled(t1, true, true, Some(Duration::from_secs(3)));
    assert_eq!(p.release(t1 + ms(500)), Err(ms(2_500)));
}

#[test]
fn hostile_holds_and_rates_never_overflow() {
    let t0 = Instant::now();
    let mut p = Pace::begin(t0, Some(f64::INFINITY), f64::MAX);
    p.hold(t0, Duration::MAX);
    assert!(p.release(t0).is_err());
    let mut p = Pace::begin(t0, Some(1e300), 1e300);
    for _ in 0..10_000 {
        p.succeeded(t0, true);
    }
    assert!(p.release(t0).is_ok());
    assert!(p.release(t0).is_ok() || p.release(t0).is_err());
}

/// A route whose limit lifts is followed within a few releases: after a
/// calm probe interval the search goes upward again (issue 29, finding 3).
#[test]
fn a_lifted_limit_is_followed_upward() {
    let t0 = Instant::now();
    let mut p = Pace::begin(t0, None, 10_000.0);
    against_a_leaky_bucket(&mut p, t0, 5.0, 60);
    assert!(p.rate() < 6.0, "{}", p.rate());
    let t1 = t0 + Duration::from_secs(30);
    // The wait before a probe has doubled with each probe refused while
    // the limit held: at most 640 releases, here a few dozen.
    let rejected = against_a_leaky_bucket(&mut p, t1, 200.0, 100);
    // Found from below in the search's few steps, as at the start.
    assert!(rejected <= 5, "{rejected} rejected");
    assert!(p.rate() > 150.0, "still at {} after 100 releases", p.rate());
}

/// A 503 with Retry-After, whatever the rate, neither drags the rate down
/// nor holds the releases (issue 29, finding 4); a 429's Retry-After holds
/// them whenever it comes.
#[test]
fn a_503_neither_slows_the_rate_nor_holds_once_releasing() {
    let t0 = Instant::now();
    let mut p = Pace::begin(t0, Some(10.0), 10_000.0);
    let t1 = t0 + spacing(10.0);
    assert_eq!(p.release(t1), Ok(()));
    p.throttled(t1 + ms(10), true, false, Some(Duration::from_secs(1)));
    assert_eq!(p.rate(), 10.0);
    let t2 = t1 + spacing(10.0);
    assert_eq!(p.release(t2), Ok(()));
    p.throttled(t2 + ms(10), true, true, Some(Duration::from_secs(1)));
    assert!(p.rate() < 10.0);
    assert!(p.release(t2 + ms(700)).is_err());
    assert_eq!(p.release(t2 + ms(1_010)), Ok(()));
}

/// The end of a hold is not the end of the pacing: the queue behind it
/// goes out at the rate, and the pacing ends only once calm for CALM
/// after the hold with nobody held back (issue 29, finding 2).
#[test]
fn pacing_outlives_its_hold_and_ends_when_nobody_waits() {
    let t0 = Instant::now();
    let mut p = Pace::begin(t0, None, 10_000.0);
    p.throttled(t0, false, true, Some(Duration::from_secs(6)));
    let t6 = t0 + Duration::from_secs(6);
    assert!(!p.ended(t6));
    assert_eq!(p.release(t6), Ok(()));
    assert!(
        p.release(t6).is_err(),
        "a second request in the same instant"
    );
    assert!(!p.ended(t6 + CALM - ms(1)));
    // Asked and denied at 6 s: not before a second without a denial.
    let t_end = t6 + CALM;
    assert!(p.ended(t_end));
    // Someone held back half a second before: not yet.
    let mut q = p.clone();
    let _ = q.release(t_end - ms(500));
    assert!(q.release(t_end - ms(500)).is_err());
    assert!(!q.ended(t_end));
    assert!(q.ended(t_end + ms(500)));
}

/// A 429 to a call let through unpaced (a new wave's first attempts)
/// says the route's limit binds now: the probe upward waits a calm
/// interval from it, and the queue behind it goes at the rate that works,
/// not at a faster one whose 429 would hold everyone for its Retry-After.
#[test]
fn a_429_to_a_first_attempt_postpones_the_probe_upward() {
    let t0 = Instant::now();
    let mut p = Pace::begin(t0, None, 10_000.0);
    p.good = Some(5.0);
    p.bad = Some(6.0);
    p.rate = 5.0;
    p.calm_releases = PROBE_RELEASES - 1;
    let t1 = t0 + Duration::from_secs(10);
    // Calm for a probe interval: the next success probes upward…
    let mut calm = p.clone();
    calm.succeeded(t1, true);
    assert!(calm.rate() > 6.0, "{}", calm.rate());
    // …unless a first attempt was just told "too many".
    p.throttled(t1, false, true, Some(Duration::from_secs(1)));
    p.succeeded(t1 + Duration::from_secs(1), true);
    assert_eq!(p.rate(), 5.0);
}

/// However many 429s come, the rate never falls below one release per two
/// seconds: a route that admits anything at all is still reached.
#[test]
fn the_rate_has_a_floor() {
    let t0 = Instant::now();
    let mut p = Pace::begin(t0, None, 10_000.0);
    let mut now = t0;
    for _ in 0..12 {
        if let Err(wait) = p.release(now) {
            now += wait;
            p.release(now).unwrap();
        }
        p.throttled(now, true, true, None);
    }
    assert_eq!(p.rate(), 0.5);
}

/// A 429 sets the rate back no lower than the successes per second seen
/// since the throttling began: what the route admitted is known to work.
#[test]
fn a_429_never_sets_the_rate_below_what_was_admitted() {
    let t0 = Instant::now();
    let mut p = Pace::begin(t0, None, 10_000.0);
    // 16 successes in the 2 s since the throttling began: 8 per second;
    // the best a release did was 4 per second, sent at 10.
    for _ in 0..16 {
        p.succeeded(t0, false);
    }
    p.good = Some(4.0);
    p.slot_rate = 10.0;
    p.throttled(t0 + Duration::from_secs(2), true, true, None);
    assert_eq!(p.rate(), 8.0);
}

/// 429s that do not follow the rate (a balancer answering every other
/// request so, whatever the rate) contradict the rates the route admitted:
/// after three of them the route is no longer paced, at the best rate that
/// worked, and a 429's Retry-After no longer holds it. A leaky bucket's
/// 429s never come at a rate it admitted (the search test above).
#[test]
fn a_429_whatever_the_rate_ends_the_pacing() {
    let t0 = Instant::now();
    let mut p = Pace::begin(t0, None, 10_000.0);
    let mut now = t0;
    let mut governed = Vec::new();
    for i in 0..40 {
        if !p.governs(now) {
            break;
        }
        if let Err(wait) = p.release(now) {
            now += wait;
            p.release(now).unwrap();
        }
        if i % 2 == 0 {
            p.succeeded(now, true);
        } else {
            p.throttled(now, true, true, None);
        }
        governed.push(p.rate());
    }
    assert!(!p.governs(now), "still paced at {governed:?}");
    assert!(governed.len() <= 8, "paced for {governed:?}");
    assert!(p.rate() >= START_RATE, "left at {}", p.rate());
    p.throttled(now, false, true, Some(Duration::from_secs(5)));
    assert!(!p.governs(now + ms(1)), "a 429's hint holds it again");
}
