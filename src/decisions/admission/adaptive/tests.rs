//! The adaptive admission's unit tests: hedges against the bucket, the
//! evidence and the waiting line.

use super::super::{AttemptRecord, AttemptResult, RetryAdmission, RetryKind, RetryRequest};
use super::*;
use crate::vocabulary::Route;

#[test]
fn a_host_costs_about_200_bytes() {
    // Its state, its last use and its key in the table, and the table's
    // control byte: what `max_partitions` documents.
    let per_host = std::mem::size_of::<Host>() + 16 + 8 + 1;
    assert!(per_host <= 200, "{per_host} bytes");
}

fn hedge() -> RetryRequest {
    RetryRequest::new(RetryKind::Hedge, Duration::ZERO)
}

fn retry(waited: Duration) -> RetryRequest {
    RetryRequest::new(RetryKind::Transient, waited)
}

#[test]
fn a_hedge_is_paid_from_the_bucket_and_never_waits() {
    let a = AdaptiveAdmission::new(AdaptiveConfig {
        capacity: 2.0,
        first_attempt_deposit: 0.0,
        ..AdaptiveConfig::default()
    })
    .unwrap();
    let p = Partition::named("h");
    let t0 = Instant::now();
    assert!(
        matches!(a.admit(p, hedge(), t0), Admission::Admit(g) if g.source() == GrantSource::Hedge)
    );
    assert!(matches!(a.admit(p, hedge(), t0), Admission::Admit(_)));
    // Dry: a retry would wait for a probe; a hedge is refused at once,
    // however long the host has been dry, and takes no place in line.
    assert_eq!(a.admit(p, hedge(), t0), Admission::Refuse);
    assert!(matches!(
        a.admit(p, retry(Duration::ZERO), t0),
        Admission::Wait(_)
    ));
    let later = t0 + Duration::from_secs(60);
    assert_eq!(a.admit(p, hedge(), later), Admission::Refuse);
    assert!(
        matches!(a.admit(p, retry(Duration::ZERO), later), Admission::Admit(g) if g.is_probe()),
        "the probe is still the retry's"
    );
    assert!(a.read(p, |h| h.waiters.is_empty()));
}

#[test]
fn a_hedges_answer_says_nothing_of_an_outage() {
    let a = AdaptiveAdmission::new(AdaptiveConfig::default()).unwrap();
    let p = Partition::named("h");
    let t0 = Instant::now();
    let Admission::Admit(grant) = a.admit(p, hedge(), t0) else {
        panic!("a full bucket admits a hedge");
    };
    for result in [AttemptResult::Success, AttemptResult::Failure] {
        a.record(p, AttemptRecord::new(1, Some(grant), result), t0);
        assert_eq!(a.release_rate(p, t0), 0.0, "{result:?}");
    }
    // A retry's success is evidence of recovery.
    let Admission::Admit(grant) = a.admit(p, retry(Duration::ZERO), t0) else {
        panic!("a full bucket admits a retry");
    };
    a.record(
        p,
        AttemptRecord::new(2, Some(grant), AttemptResult::Success),
        t0,
    );
    assert!(a.release_rate(p, t0) > 0.0);
}

#[test]
fn a_hedge_never_goes_ahead_of_a_waiting_retry() {
    let a = AdaptiveAdmission::new(AdaptiveConfig {
        capacity: 1.0,
        first_attempt_deposit: 0.5,
        ..AdaptiveConfig::default()
    })
    .unwrap();
    let p = Partition::named("h");
    let t0 = Instant::now();
    assert!(matches!(
        a.admit(p, retry(Duration::ZERO), t0),
        Admission::Admit(_)
    ));
    // A retry waits its turn (it asked twice, so it holds its place).
    let t1 = t0 + Duration::from_millis(10);
    assert!(matches!(
        a.admit(p, retry(Duration::ZERO), t0),
        Admission::Wait(_)
    ));
    assert!(matches!(a.admit(p, retry(t1 - t0), t1), Admission::Wait(_)));
    // Two first attempts refill one token: the waiting retry's, not a
    // hedge's.
    a.first_attempt(p, t1);
    a.first_attempt(p, t1);
    assert_eq!(a.admit(p, hedge(), t1), Admission::Refuse);
    assert!(matches!(
        a.admit(p, retry(t1 - t0), t1),
        Admission::Admit(_)
    ));
}

/// A host whose every object is its own route keeps at most
/// MAX_PACED_ROUTES pacings, the newest among them (each throttled while
/// another route succeeds: limits per route, not one for the host).
#[test]
fn a_host_paces_at_most_sixty_four_routes() {
    let a = AdaptiveAdmission::new(AdaptiveConfig::default()).unwrap();
    let p = Partition::named("many-routes");
    let t0 = Instant::now();
    let routes: Vec<Route> = (0..100).map(|i| Route::named(&format!("/r{i}"))).collect();
    let fine = AttemptRecord::new(1, None, AttemptResult::Success).on_route(Route::named("/ok"));
    for (i, route) in routes.iter().enumerate() {
        let too_many = AttemptRecord::new(1, None, AttemptResult::Failure)
            .throttled(None)
            .too_fast()
            .on_route(*route);
        let at = t0 + Duration::from_millis(i as u64);
        a.record(p, too_many, at);
        a.record(p, fine, at);
    }
    assert!(!a.paced_as_one(p));
    let paced = routes
        .iter()
        .filter(|r| a.pace_rate(p, **r).is_some())
        .count();
    assert_eq!(paced, 64);
    assert!(a.pace_rate(p, routes[99]).is_some());
    assert!(a.pace_rate(p, routes[0]).is_none(), "the oldest made room");
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn too_many(path: &str) -> AttemptRecord {
    AttemptRecord::new(1, None, AttemptResult::Failure)
        .throttled(Some(Duration::from_secs(1)))
        .too_fast()
        .on_route(Route::of_path(path))
}

/// Issue 42: 429s from two routes of a host within a second, none of its
/// routes succeeding between them, prove a limit wider than a route (per
/// account or token): the routes that met it are paced as one, and so is
/// every route that throttles after, until it has been calm; then routes
/// are paced on their own.
#[test]
fn several_routes_throttled_and_none_succeeding_pace_the_host_as_one() {
    let a = AdaptiveAdmission::new(AdaptiveConfig::default()).unwrap();
    let p = Partition::named("account");
    let t0 = Instant::now();
    let other =
        RetryRequest::new(RetryKind::Throttled, Duration::ZERO).on_route(Route::of_path("/c"));
    a.record(p, too_many("/a"), t0);
    assert!(!a.paced_as_one(p));
    assert!(matches!(a.admit(p, other, t0), Admission::Admit(_)));
    a.record(p, too_many("/b"), t0 + ms(100));
    assert!(a.paced_as_one(p));
    // A route that throttles for the same owner joins the wider limit
    // (issue 51: one that never did is not held by it, `scope` tests).
    a.record(p, too_many("/c"), t0 + ms(100));
    assert_eq!(
        a.admit(p, other, t0 + ms(100)),
        Admission::Paced(Duration::from_secs(1))
    );
    assert!(a.pace_rate(p, Route::of_path("/c")).is_some());
    // Calm for the pacing's CALM after the hold: narrowed back.
    let later = t0 + Duration::from_secs(7);
    let fine = AttemptRecord::new(1, None, AttemptResult::Success).on_route(Route::of_path("/c"));
    a.record(p, fine, later);
    assert!(!a.paced_as_one(p));
    assert_eq!(a.pace_rate(p, Route::of_path("/c")), None);
}

/// One route throttled while another succeeds is that route's limit (as
/// today); so are 429s of two routes more than a second apart.
#[test]
fn a_route_throttled_while_others_succeed_is_paced_alone() {
    let a = AdaptiveAdmission::new(AdaptiveConfig::default()).unwrap();
    let p = Partition::named("per-route");
    let t0 = Instant::now();
    let fine = AttemptRecord::new(1, None, AttemptResult::Success).on_route(Route::of_path("/c"));
    a.record(p, too_many("/a"), t0);
    a.record(p, fine, t0 + ms(50));
    a.record(p, too_many("/b"), t0 + ms(100));
    assert!(!a.paced_as_one(p));
    let q = Partition::named("far-apart");
    a.record(q, too_many("/a"), t0);
    a.record(q, too_many("/b"), t0 + ms(1_500));
    assert!(!a.paced_as_one(q));
    let other =
        RetryRequest::new(RetryKind::Throttled, Duration::ZERO).on_route(Route::of_path("/c"));
    assert!(matches!(
        a.admit(p, other, t0 + ms(100)),
        Admission::Admit(_)
    ));
}

/// The instant the next retry on `path` is released at, asked from `now`
/// on, as often as the pacing says to wait; and its grant.
fn next_release(a: &AdaptiveAdmission, p: Partition, path: &str, now: Instant) -> (Instant, Grant) {
    let ask =
        RetryRequest::new(RetryKind::Throttled, Duration::ZERO).on_route(Route::of_path(path));
    let mut now = now;
    for _ in 0..100 {
        match a.admit(p, ask, now) {
            Admission::Admit(grant) => return (now, grant),
            Admission::Paced(wait) | Admission::Wait(wait) => now += wait,
            Admission::Refuse => panic!("a paced retry is never refused"),
        }
    }
    panic!("not released in 100 asks")
}

/// A release answered with neither a success nor a 429 (a 500, a reset)
/// is answered all the same: the releases after it are each alone in
/// flight again, so one answered late moves the next slot (issue 51's
/// rule). Before, such a release stayed "in flight" for good, and every
/// later answer was taken for one of two: no slot moved until the next
/// hold.
#[test]
fn a_release_answered_with_a_failure_is_no_longer_in_flight() {
    let ok = AttemptResult::Success;
    // The first release answered `first`, the third `late` later than the
    // second; the instant the fourth is released at.
    let fourth = |first: AttemptResult, late: Duration| {
        let a = AdaptiveAdmission::new(AdaptiveConfig::default()).unwrap();
        let p = Partition::named("paced");
        let route = Route::of_path("/a");
        let t0 = Instant::now();
        a.record(p, too_many("/a"), t0);
        let mut now = t0;
        for (n, result, took) in [(2, first, ms(1)), (2, ok, ms(1)), (2, ok, ms(1) + late)] {
            let (sent, grant) = next_release(&a, p, "/a", now);
            now = sent + took;
            let answer = AttemptRecord::new(n, Some(grant), result).on_route(route);
            a.record(p, answer, now);
        }
        next_release(&a, p, "/a", now).0
    };
    // The slot moves as late as the answer came (at most half an
    // interval, ~85 ms here); the rest of the pacing barely differs.
    for first in [ok, AttemptResult::Failure, AttemptResult::Other] {
        let moved = fourth(first, ms(20)).saturating_duration_since(fourth(first, Duration::ZERO));
        assert!(
            moved >= ms(15),
            "a release answered 20 ms late after one answered {first:?} moved no slot: \
             the fourth goes {moved:?} after the on-time run's",
        );
    }
}
