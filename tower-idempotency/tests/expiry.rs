//! Keys expire after the window; expired keys are swept.
mod support;
use std::sync::Arc;
use std::time::Duration;
use support::{app, post, send, Harness};
use tower_idempotency::{spawn_sweeper, IdempotencyStore, ManualClock, MemoryStore};

both_stores!(expired_key_runs_again, custom_expiry_window, sweep);

async fn expired_key_runs_again(h: Harness) {
    let (router, state) = app(h.layer());
    assert_eq!(send(&router, post("k", "a")).await.status, 201);
    h.advance(Duration::from_secs(24 * 3600 - 1)).await;
    assert!(send(&router, post("k", "a")).await.replayed());
    h.advance(Duration::from_secs(2)).await;
    // Past 24 h the key is forgotten: even a different body is a new request.
    let again = send(&router, post("k", "b")).await;
    assert_eq!(again.status, 201);
    assert!(!again.replayed());
    assert_eq!(state.runs(), 2);
}

async fn custom_expiry_window(h: Harness) {
    let (router, state) = app(h.builder().expiry(Duration::from_secs(60)).build().unwrap());
    assert_eq!(send(&router, post("k", "a")).await.status, 201);
    h.advance(Duration::from_secs(59)).await;
    assert!(send(&router, post("k", "a")).await.replayed());
    h.advance(Duration::from_secs(1)).await;
    assert!(!send(&router, post("k", "a")).await.replayed());
    assert_eq!(state.runs(), 2);
}

async fn sweep(h: Harness) {
    let (router, state) = app(h.layer());
    for key in ["a", "b", "c"] {
        assert_eq!(send(&router, post(key, "x")).await.status, 201);
    }
    assert_eq!(h.store.sweep_expired().await.unwrap(), 0);
    h.advance(Duration::from_secs(12 * 3600)).await;
    assert_eq!(send(&router, post("d", "x")).await.status, 201);
    h.advance(Duration::from_secs(12 * 3600)).await;
    // a, b, c are exactly 24 h old: expired. d is 12 h old.
    match h.redis_records().await {
        // Redis deleted them by itself: nothing left to sweep.
        Some(records) => {
            assert_eq!(h.store.sweep_expired().await.unwrap(), 0);
            assert_eq!(records, 1);
        }
        None => assert_eq!(h.store.sweep_expired().await.unwrap(), 3),
    }
    assert_eq!(h.store.sweep_expired().await.unwrap(), 0);
    assert!(send(&router, post("d", "x")).await.replayed());
    assert!(!send(&router, post("a", "x")).await.replayed());
    assert_eq!(state.runs(), 5);
}

// Paused time (no socket here): the sweeper's interval and the waits below
// advance a virtual clock, nothing sleeps for real.
#[tokio::test(start_paused = true)]
async fn background_sweeper_deletes_expired_keys() {
    let clock = Arc::new(ManualClock::new());
    let store = MemoryStore::with_clock(clock.clone());
    let (router, _) = app(tower_idempotency::IdempotencyLayer::new(store.clone()));
    assert_eq!(send(&router, post("k", "x")).await.status, 201);
    assert_eq!(store.len(), 1);
    clock.advance(Duration::from_secs(25 * 3600));
    let sweeper = spawn_sweeper(
        Arc::new(store.clone()) as Arc<dyn IdempotencyStore>,
        Duration::from_millis(5),
    );
    for _ in 0..1000 {
        if store.is_empty() {
            break;
        }
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    sweeper.abort();
    assert!(store.is_empty());
}
