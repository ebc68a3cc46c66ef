//! Deadline propagation, outbound: a call made inside an inherited scope
//! ends when the caller stops waiting, every attempt says how long that is,
//! and the generic `retry` inherits the same way.

mod support;

use std::time::Duration;

use futures_util::future::join_all;
use reqwest_safe_retry::admission::Partition;
use reqwest_safe_retry::deadline::InheritedDeadline;
use reqwest_safe_retry::retry::{retry, retry_if_time, Outcome};
use reqwest_safe_retry::time::ManualClock;
use reqwest_safe_retry::{Jitter, RetryError, RetryPolicy, RetryReport, StopReason};
use support::{client, ms, policy};
use wiremock::ResponseTemplate;

fn left_on_the_wire(received: &[wiremock::Request]) -> Vec<u64> {
    received
        .iter()
        .map(|r| {
            r.headers["request-timeout-ms"]
                .to_str()
                .unwrap()
                .parse()
                .unwrap()
        })
        .collect()
}

#[tokio::test]
async fn a_call_in_a_scope_ends_with_the_callers_time_and_says_so_on_every_attempt() {
    let server = support::answering_with(ResponseTemplate::new(503)).await;
    let clock = ManualClock::new();
    let p = policy(&clock)
        .max_attempts(10)
        .backoff(ms(250), ms(250))
        .jitter(Jitter::None)
        .deadline(Duration::from_secs(30))
        .no_budget()
        .build()
        .unwrap();
    let (c, recorder) = client(p);
    let scope = InheritedDeadline::after(ms(600));
    let response = scope
        .clone()
        .scope(async { c.get(server.uri()).send().await.unwrap() })
        .await;
    let report = response.extensions().get::<RetryReport>().unwrap();
    // 600 ms, not 30 s: after the second attempt a 250 ms sleep and the
    // 100 ms attempt window no longer fit.
    assert_eq!(report.stop_reason(), StopReason::Deadline);
    assert_eq!(report.attempts(), 2);
    let left = left_on_the_wire(&server.received_requests().await.unwrap());
    // Read once, on the real clock, when the call started: a little under
    // 600 ms; then exactly one sleep less on the policy's clock.
    assert!((550..=600).contains(&left[0]), "{left:?}");
    assert_eq!(left[1], left[0] - 250, "{left:?}");
    // Each attempt's timeout is bounded by the inherited time too.
    let timeouts: Vec<_> = recorder
        .timeouts()
        .into_iter()
        .map(Option::unwrap)
        .collect();
    assert!(
        timeouts[0] <= ms(600) && timeouts[0] >= ms(left[0]),
        "{timeouts:?}"
    );
    assert_eq!(timeouts[0] - timeouts[1], ms(250));
    // The scope learned that the call gave up (the inbound layer reads it).
    assert_eq!(scope.gave_up(), Some(StopReason::Deadline));
}

#[tokio::test]
async fn a_shorter_deadline_of_the_calls_own_wins_and_outside_a_scope_nothing_changes() {
    let server = support::answering_with(ResponseTemplate::new(200)).await;
    let clock = ManualClock::new();
    let (c, _) = client(policy(&clock).deadline(ms(300)).build().unwrap());
    InheritedDeadline::after(Duration::from_secs(10))
        .scope(async { c.get(server.uri()).send().await.unwrap() })
        .await;
    c.get(server.uri()).send().await.unwrap();
    let left = left_on_the_wire(&server.received_requests().await.unwrap());
    assert_eq!(left, [300, 300]);
}

#[tokio::test(start_paused = true)]
async fn the_generic_retry_inherits_the_deadline_too() {
    // Tokio's paused clock: the policy's default clock and sleeper follow
    // it, and the sleeps end at once.
    let policy = RetryPolicy::builder()
        .max_attempts(10)
        .backoff(ms(250), ms(250))
        .jitter(Jitter::None)
        .attempt_timeout(Duration::from_secs(5))
        .no_budget()
        .build()
        .unwrap();
    let scope = InheritedDeadline::after(ms(600));
    let (seen, report) = scope
        .clone()
        .scope(retry(&policy, |ctx| async move {
            Outcome::transient((ctx.time_left(), ctx.timeout()))
        }))
        .await;
    // 600, 350 and 100 ms left: a third sleep and attempt window (350 ms)
    // no longer fit.
    assert_eq!(report.attempts(), 3);
    assert_eq!(report.stop_reason(), StopReason::Deadline);
    // The last attempt's view, its timeout bounded by the time left.
    assert_eq!(seen, (Some(ms(100)), Some(ms(100))));
    assert_eq!(scope.gave_up(), Some(StopReason::Deadline));
    // Outside the scope: the policy's own 30 s.
    let (seen, _) = retry(
        &policy,
        |ctx| async move { Outcome::success(ctx.time_left()) },
    )
    .await;
    assert_eq!(seen, Some(Duration::from_secs(30)));
}

#[tokio::test(start_paused = true)]
async fn a_spawned_task_inherits_only_what_it_is_given() {
    let policy = RetryPolicy::default();
    let left = |policy: RetryPolicy| async move {
        retry(
            &policy,
            |ctx| async move { Outcome::success(ctx.time_left()) },
        )
        .await
        .0
    };
    InheritedDeadline::after(ms(800))
        .scope(async {
            let alone = tokio::spawn(left(policy.clone())).await.unwrap();
            assert_eq!(alone, Some(Duration::from_secs(30)), "not inherited");
            let scope = InheritedDeadline::current().unwrap();
            let carried = tokio::spawn(scope.scope(left(policy.clone())))
                .await
                .unwrap();
            assert_eq!(carried, Some(ms(800)));
        })
        .await;
}

/// The generic engine has no value to return without its operation: it
/// calls it once, and the operation sees that no time is left.
#[tokio::test(start_paused = true)]
async fn a_generic_call_that_starts_with_no_time_left_makes_one_attempt_with_none() {
    let policy = RetryPolicy::default();
    let scope = InheritedDeadline::after(ms(100));
    let (seen, report) = scope
        .scope(async {
            tokio::time::sleep(ms(150)).await; // the handler's own work
            retry(
                &policy,
                |ctx| async move { Outcome::transient(ctx.timeout()) },
            )
            .await
        })
        .await;
    assert_eq!(seen, Some(Duration::ZERO));
    assert_eq!(report.attempts(), 1);
    assert_eq!(report.stop_reason(), StopReason::Deadline);
}

/// `retry_if_time` does not call a generic operation that has no room for
/// an attempt (no time at all, or less than the window); with room, it
/// runs as `retry_in` does.
#[tokio::test(start_paused = true)]
async fn the_generic_engine_runs_nothing_without_room_when_asked() {
    let policy = RetryPolicy::default(); // an attempt's window: 100 ms
    let mut runs = 0;
    for left in [Duration::ZERO, ms(99)] {
        let scope = InheritedDeadline::after(left);
        let op = |_| {
            runs += 1;
            async { Outcome::success(()) }
        };
        let call = retry_if_time(&policy, Partition::named("db"), op);
        let (value, report) = scope.clone().scope(call).await;
        assert_eq!(value, None, "{left:?}");
        assert_eq!(report.attempts(), 0);
        assert_eq!(report.stop_reason(), StopReason::Deadline);
        assert_eq!(report.partition(), Partition::named("db"));
        assert_eq!(scope.gave_up(), Some(StopReason::Deadline));
    }
    assert_eq!(runs, 0);
    let m = policy.metrics().snapshot();
    assert_eq!((m.calls, m.deadline_give_ups, m.final_failures), (2, 2, 2));
    let room = InheritedDeadline::after(ms(100));
    let call = retry_if_time(&policy, Partition::SINGLE, |ctx| async move {
        Outcome::success(ctx.time_left())
    });
    let (value, report) = room.scope(call).await;
    assert_eq!(value, Some(Some(ms(100))));
    assert_eq!(report.stop_reason(), StopReason::Success);
}

/// A call with no room for an attempt sends nothing: its inherited
/// deadline is spent or shorter than the minimum attempt window (a
/// caller's own short deadline is sent: `deadline.rs`). It ends at once, `deadline`, with a `RetryError` that is a
/// timeout, and the scope notes the give-up (its layer then answers "do
/// not retry"). Twenty at once, as a handler fanning out would make them.
#[tokio::test]
async fn a_call_without_room_for_an_attempt_sends_nothing() {
    let server = support::answering_with(ResponseTemplate::new(200)).await;
    let clock = ManualClock::new();
    let p = policy(&clock).min_attempt_window(ms(100)).build().unwrap();
    let (c, recorder) = client(p.clone());
    // With room for its attempt, a call reaches the server; its connection
    // stays open, where a zero timeout no longer stops a request leaving.
    let room = InheritedDeadline::after(ms(150));
    let sent = room.scope(c.get(server.uri()).send()).await.unwrap();
    assert_eq!(sent.status(), 200);
    assert_eq!(server.received_requests().await.unwrap().len(), 1);
    let handed_down = recorder.timeouts().len();
    let spent = InheritedDeadline::after(Duration::ZERO);
    let calls = (0..20).map(|_| support::send_failing(c.get(server.uri())));
    let mut ended = spent.clone().scope(join_all(calls)).await;
    // Time left, but less than an attempt's window: inherited, or its own.
    let short = InheritedDeadline::after(ms(50));
    ended.push(
        short
            .scope(support::send_failing(c.get(server.uri())))
            .await,
    );
    for (err, report) in &ended {
        let refused = RetryError::from_middleware(err).expect("refused before it was sent");
        assert!(refused.is_timeout(), "{err}");
        assert_eq!(refused.report(), report);
        assert_eq!(report.stop_reason(), StopReason::Deadline);
        assert_eq!(report.attempts(), 0);
        assert!(report.delays().is_empty());
    }
    assert_eq!(spent.gave_up(), Some(StopReason::Deadline));
    assert_eq!(
        recorder.timeouts().len(),
        handed_down,
        "nothing handed down"
    );
    // Counted as calls given up for the deadline, with no attempt.
    let m = p.metrics().snapshot();
    assert_eq!(
        (m.calls, m.deadline_give_ups, m.final_failures),
        (22, 21, 21)
    );
    assert_eq!(m.attempts_per_call.iter().sum::<u64>(), 1);
    assert_eq!(server.received_requests().await.unwrap().len(), 1);
}
