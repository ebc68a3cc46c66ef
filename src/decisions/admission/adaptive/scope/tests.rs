//! Whose limit an answer speaks of (issue 51): callers and named policies
//! are owners, and a wider pace holds only the routes that met it.

use std::time::{Duration, Instant};

use super::super::super::{
    Admission, AttemptRecord, AttemptResult, FirstAttemptPacing, RetryAdmission, RetryKind,
    RetryRequest,
};
use super::super::{AdaptiveAdmission, AdaptiveConfig};
use crate::signals::rate_limit::RateLimit;
use crate::vocabulary::{Partition, Route};

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn admission() -> AdaptiveAdmission {
    AdaptiveAdmission::new(AdaptiveConfig::default()).unwrap()
}

/// A 429 with `Retry-After: 1` on `route`, naming `policy` as spent.
fn too_many(route: Route, policy: Option<u64>) -> AttemptRecord {
    let record = AttemptRecord::new(1, None, AttemptResult::Failure)
        .throttled(Some(secs(1)))
        .too_fast()
        .on_route(route);
    match policy {
        Some(_) => record.with_rate_limit(RateLimit {
            remaining: Some(0),
            reset: Some(secs(30)),
            policy,
            ..RateLimit::default()
        }),
        None => record,
    }
}

/// A new call's first attempt, asked at `now`, as the default policy asks.
fn first(a: &AdaptiveAdmission, p: Partition, route: Route, now: Instant) -> Admission {
    a.admit_first(
        p,
        route,
        FirstAttemptPacing::SpentQuota,
        Duration::ZERO,
        now,
    )
}

fn held(admission: &Admission) -> bool {
    matches!(admission, Admission::Paced(_) | Admission::Wait(_))
}

/// Row 1: two routes spent under two differently named policies are two
/// limits; a third route, with no limit, is never held.
#[test]
fn two_named_policies_are_two_limits() {
    let a = admission();
    let p = Partition::named("api");
    let t0 = Instant::now();
    let (search, export) = (Route::of_path("/search"), Route::of_path("/export"));
    a.record(p, too_many(search, Some(1)), t0);
    a.record(p, too_many(export, Some(2)), t0);
    assert!(!a.paced_as_one(p), "two names, two limits");
    let orders = Route::of_path("/orders");
    assert!(!held(&first(&a, p, orders, t0 + Duration::from_millis(10))));
    assert_eq!(a.pace_rate(p, orders), None);
    // Each spent route holds its own new calls until its own reset.
    assert!(held(&first(&a, p, search, t0 + Duration::from_millis(10))));
    // The same name on two routes is one limit, paced as one.
    let q = Partition::named("one-policy");
    a.record(q, too_many(search, Some(1)), t0);
    a.record(q, too_many(export, Some(1)), t0);
    assert!(a.paced_as_one(q));
    assert!(!held(&first(&a, q, orders, t0 + Duration::from_millis(10))));
}

/// Row 3: one token's spent quota says nothing about another token's.
#[test]
fn a_callers_spent_quota_holds_no_other_caller() {
    let a = admission();
    let p = Partition::named("github");
    let t0 = Instant::now();
    let path = Route::of_path("/repos");
    let (ta, tb) = (
        path.for_caller(b"Bearer tenant-a"),
        path.for_caller(b"Bearer tenant-b"),
    );
    let last_allowed = AttemptRecord::new(1, None, AttemptResult::Success)
        .with_rate_limit(RateLimit {
            remaining: Some(0),
            reset: Some(secs(30)),
            ..RateLimit::default()
        })
        .on_route(ta);
    a.record(p, last_allowed, t0);
    assert!(held(&first(&a, p, ta, t0 + Duration::from_millis(10))));
    assert!(!held(&first(&a, p, tb, t0 + Duration::from_millis(10))));
    // Two callers' 429s on two routes are no evidence of one limit.
    a.record(p, too_many(Route::of_path("/a").for_caller(b"x"), None), t0);
    a.record(p, too_many(Route::of_path("/b").for_caller(b"y"), None), t0);
    assert!(!a.paced_as_one(p));
}

/// Row 2: a wider pace holds the routes that met it; a route succeeding
/// beside them is never held by it, its retries are the outage
/// admission's (a one-off 503 retried at once, not after the hold).
#[test]
fn a_wider_pace_holds_only_its_members() {
    let a = admission();
    let p = Partition::named("shop");
    let t0 = Instant::now();
    let (search, export) = (Route::of_path("/search"), Route::of_path("/export"));
    let orders = Route::of_path("/orders");
    a.record(p, too_many(search, None), t0);
    a.record(p, too_many(export, None), t0);
    assert!(a.paced_as_one(p));
    let later = t0 + secs(3);
    let fine = AttemptRecord::new(1, None, AttemptResult::Success).on_route(orders);
    a.record(p, fine, later);
    let after_503 = RetryRequest::new(RetryKind::Transient, Duration::ZERO).on_route(orders);
    assert!(matches!(a.admit(p, after_503, later), Admission::Admit(_)));
    assert_eq!(a.pace_rate(p, orders), None);
    let always = FirstAttemptPacing::Always;
    let new_call = a.admit_first(p, orders, always, Duration::ZERO, later);
    assert!(!held(&new_call), "{new_call:?}");
    // A route that then throttles for the same owner joins the pace.
    let items = Route::of_path("/items");
    a.record(p, too_many(items, None), later);
    let throttled = RetryRequest::new(RetryKind::Throttled, Duration::ZERO).on_route(items);
    assert!(a.pace_rate(p, items).is_some());
    assert_eq!(a.pace_rate(p, items), a.pace_rate(p, search));
    // One release slot, shared: the next throttled retry of either waits.
    assert!(matches!(a.admit(p, throttled, later), Admission::Admit(_)));
    let search_retry = RetryRequest::new(RetryKind::Throttled, Duration::ZERO).on_route(search);
    assert!(held(&a.admit(p, search_retry, later)));
}

/// A member's new calls are held only by a quota reported spent to it:
/// no route's reset is copied to routes that never met it.
#[test]
fn no_members_reset_is_copied_to_another() {
    let a = admission();
    let p = Partition::named("account");
    let t0 = Instant::now();
    let (spent, plain) = (Route::of_path("/a"), Route::of_path("/b"));
    a.record(p, too_many(spent, Some(7)), t0);
    let plain_429 = too_many(plain, None).with_rate_limit(RateLimit {
        remaining: Some(0),
        reset: None,
        policy: Some(7),
        ..RateLimit::default()
    });
    a.record(p, plain_429, t0);
    assert!(a.paced_as_one(p));
    let soon = t0 + secs(2);
    assert!(held(&first(&a, p, spent, soon)), "its own quota is spent");
    assert!(!held(&first(&a, p, plain, soon)), "told only 429");
}

/// Another caller's throttled route does not join a wider limit: it is
/// paced on its own, by its own hold.
#[test]
fn another_callers_route_does_not_join() {
    let a = admission();
    let p = Partition::named("two-tenants");
    let t0 = Instant::now();
    let x = |path: &str| Route::of_path(path).for_caller(b"Bearer x");
    a.record(p, too_many(x("/a"), None), t0);
    a.record(p, too_many(x("/b"), None), t0);
    assert!(a.paced_as_one(p));
    // Tenant y's 429 half a second later holds its route until 1.5 s.
    let yc = Route::of_path("/c").for_caller(b"Bearer y");
    a.record(p, too_many(yc, None), t0 + Duration::from_millis(500));
    let retry = RetryRequest::new(RetryKind::Throttled, Duration::ZERO).on_route(yc);
    let asked = a.admit(p, retry, t0 + Duration::from_millis(1_200));
    assert!(held(&asked), "y's own hold, not x's limit: {asked:?}");
    let x_retry = RetryRequest::new(RetryKind::Throttled, Duration::ZERO).on_route(x("/b"));
    let x_asked = a.admit(p, x_retry, t0 + Duration::from_millis(1_200));
    assert!(matches!(x_asked, Admission::Admit(_)), "{x_asked:?}");
}
