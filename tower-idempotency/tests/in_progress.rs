//! The same request while the first is still running gets 409 + Retry-After.
mod support;
use std::time::Duration;
use support::{app, post, send, spawn_waiting, Harness};

both_stores!(
    in_progress_is_409_with_retry_after,
    retry_after_is_configurable
);

async fn hold_and_probe(layer: tower_idempotency::IdempotencyLayer) -> support::Reply {
    let (router, state) = app(layer);
    let started = state.started.notified();
    let first = spawn_waiting(&router, "k", "a");
    started.await;
    let probe = send(&router, post("k", "a")).await;
    state.proceed.notify_one();
    let first = first.await.unwrap();
    assert_eq!(first.status, 201);
    assert!(!first.replayed());
    // Once finished, the retry is a replay.
    let after = send(&router, post("k", "a")).await;
    assert!(after.replayed());
    assert_eq!(after.body, first.body);
    assert_eq!(state.runs(), 1);
    probe
}

async fn in_progress_is_409_with_retry_after(h: Harness) {
    let probe = hold_and_probe(h.layer()).await;
    probe.assert_problem(409);
    assert_eq!(probe.headers["retry-after"], "1");
}

async fn retry_after_is_configurable(h: Harness) {
    let layer = h
        .builder()
        .retry_after(Duration::from_millis(4500))
        .build()
        .unwrap();
    let probe = hold_and_probe(layer).await;
    probe.assert_problem(409);
    assert_eq!(probe.headers["retry-after"], "5");
}
