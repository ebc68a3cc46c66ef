//! Settings are validated by build(); no duration makes the layer panic.
mod support;
use std::time::Duration;

use axum::http::StatusCode;
use support::{app, post, send, Harness};
use tower_idempotency::{IdempotencyLayer, MemoryStore};

both_stores!(duration_max_works);

#[test]
fn zero_durations_are_refused() {
    let zero = Duration::ZERO;
    let builder = || IdempotencyLayer::builder(MemoryStore::new());
    let err = builder().lock_timeout(zero).build().unwrap_err();
    assert_eq!(err.setting(), "lock_timeout");
    let err = builder().expiry(zero).build().unwrap_err();
    assert_eq!(err.setting(), "expiry");
    assert!(err.to_string().contains("longer than zero"), "{err}");
    let err = builder().heartbeat_every(zero).build().unwrap_err();
    assert_eq!(err.setting(), "heartbeat_every");
    // `Retry-After: 0` on every 409 and 503 would invite a loop hammering
    // the server; a patience of zero would give up on a store before its
    // first retry.
    let err = builder().retry_after(zero).build().unwrap_err();
    assert_eq!(err.setting(), "retry_after");
    let err = builder().completion_patience(zero).build().unwrap_err();
    assert_eq!(err.setting(), "completion_patience");
    let err = builder().request_body_timeout(zero).build().unwrap_err();
    assert_eq!(err.setting(), "request_body_timeout");
    // The shortest non-zero values are accepted.
    let short = Duration::from_nanos(1);
    assert!(builder().retry_after(short).build().is_ok());
    assert!(builder().completion_patience(short).build().is_ok());
}

#[test]
fn inconsistent_settings_are_refused() {
    let builder = || IdempotencyLayer::builder(MemoryStore::new());
    // A lease outliving its record would let a second claim in.
    let err = builder()
        .lock_timeout(Duration::from_secs(60))
        .expiry(Duration::from_secs(30))
        .build()
        .unwrap_err();
    assert_eq!(err.setting(), "lock_timeout");
    let err = builder().lock_timeout(Duration::MAX).build().unwrap_err();
    assert_eq!(err.setting(), "lock_timeout");
    let err = builder()
        .lock_timeout(Duration::from_secs(1))
        .heartbeat_every(Duration::from_secs(1))
        .build()
        .unwrap_err();
    assert_eq!(err.setting(), "heartbeat_every");
    // Releasing a success would run its effect again.
    let err = builder()
        .release_statuses([StatusCode::CREATED])
        .build()
        .unwrap_err();
    assert_eq!(err.setting(), "release_statuses");
    assert!(builder().build().is_ok());
}

async fn duration_max_works(h: Harness) {
    let layer = h
        .builder()
        .lock_timeout(Duration::MAX)
        .expiry(Duration::MAX)
        .retry_after(Duration::MAX)
        .build()
        .unwrap();
    let (router, state) = app(layer);
    assert_eq!(send(&router, post("k", "a")).await.status, 201);
    h.advance(Duration::from_secs(50 * 365 * 24 * 3600)).await;
    // Fifty years later the key is still remembered.
    assert!(send(&router, post("k", "a")).await.replayed(), "{}", h.name);
    assert_eq!(state.runs(), 1);
}

#[tokio::test]
async fn a_pool_without_connections_is_refused() {
    // Refused before any connection is attempted (the URL is unreachable).
    let err =
        tower_idempotency::PostgresStore::connect_with_pool_size("postgres://127.0.0.1:1/x", 0)
            .await
            .unwrap_err();
    assert!(err.to_string().contains("at least one connection"), "{err}");
}
