//! The release slots' unit tests: late answers, and a call's last attempt.

use std::time::{Duration, Instant};

use super::super::{spacing, Pace, MAX_LATE, RAMP_GROWTH, START_RATE};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Issue 51: a release answered later than the quickest answer may have
/// reached the server as much later than it was sent; the next slot comes
/// that much later too, or the next release, sent an interval after it,
/// would reach a limiter counting from the last it accepted too soon.
#[test]
fn a_late_answer_moves_the_next_slot_as_much_later() {
    let t0 = Instant::now();
    let mut p = Pace::begin(t0, Some(5.0), 10_000.0);
    let t1 = t0 + spacing(5.0);
    p.release(t1).unwrap();
    p.succeeded(t1 + ms(1), true);
    let t2 = t1 + spacing(5.0);
    assert_eq!(p.release(t2), Ok(()));
    // Answered 10 ms later than the first.
    p.succeeded(t2 + ms(11), true);
    let t3 = t2 + spacing(5.0);
    assert_eq!(p.release(t3), Err(ms(10)));
    assert_eq!(p.release(t3 + ms(10)), Ok(()));
    // Never more than half an interval, nor than MAX_LATE.
    p.succeeded(t3 + ms(10) + Duration::from_secs(1), true);
    let t4 = t3 + ms(10) + spacing(5.0);
    assert_eq!(p.release(t4), Err((spacing(5.0) / 2).min(MAX_LATE)));
}

/// With two releases in flight, which one an answer is for is not known:
/// it moves nothing.
#[test]
fn an_answer_with_two_releases_in_flight_moves_no_slot() {
    let t0 = Instant::now();
    let mut p = Pace::begin(t0, Some(5.0), 10_000.0);
    let t1 = t0 + spacing(5.0);
    p.release(t1).unwrap();
    p.succeeded(t1, true);
    let t2 = t1 + spacing(5.0);
    p.release(t2).unwrap();
    let t3 = t2 + spacing(5.0);
    p.release(t3).unwrap();
    p.succeeded(t3 + ms(30), true);
    assert_eq!(p.release(t3 + spacing(5.0)), Ok(()));
}

/// A pace held for a second, whose first release after the hold (at the
/// returned instant) succeeded at once: the ramp's next step is due.
fn after_a_hold() -> (Pace, Instant) {
    let t0 = Instant::now();
    let mut p = Pace::begin(t0, None, 10_000.0);
    p.hold(t0, Duration::from_secs(1));
    let t1 = t0 + Duration::from_secs(1);
    p.release(t1).unwrap();
    p.succeeded(t1, true);
    (p, t1)
}

/// A ramp's step that got through answered late may have arrived late (an
/// interval sent 172 ms after the last, arriving 212 ms after it): it
/// proves only the time since the release before it and that lateness,
/// not the rate it was spaced by.
#[test]
fn a_step_answered_late_proves_only_what_reached_the_server() {
    let (mut p, t1) = after_a_hold();
    assert_eq!(p.rate(), START_RATE * RAMP_GROWTH);
    let t2 = t1 + spacing(START_RATE * RAMP_GROWTH);
    p.release(t2).unwrap();
    p.succeeded(t2 + ms(40), true);
    let proven = 1.0 / (t2 - t1 + ms(40)).as_secs_f64();
    assert!(
        (p.rate() - proven * RAMP_GROWTH).abs() < 1e-9,
        "{}",
        p.rate()
    );
}

/// A call's last attempt does not go in a step faster than the fastest
/// rate that worked (the ramp's after a hold, which a fixed limit
/// refuses): it waits for a slot spaced by a rate that worked. Others may
/// take the step.
#[test]
fn a_last_attempt_waits_for_a_slot_at_a_rate_that_worked() {
    let (mut p, t1) = after_a_hold();
    let step = t1 + spacing(START_RATE * RAMP_GROWTH);
    let safe = t1 + spacing(START_RATE);
    let mut q = p.clone();
    assert!(p.release_last(step).is_err());
    assert!(p.release_last(safe - ms(1)).is_err());
    assert_eq!(p.release_last(safe), Ok(()));
    assert_eq!(q.release(step), Ok(()));
}
