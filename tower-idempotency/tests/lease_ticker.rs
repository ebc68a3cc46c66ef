//! The lease ticker stops when no handler runs and starts again with the
//! next claim: a handler that starts after an idle spell still has its
//! lease extended. Paused time: the ticker's sleeps advance a virtual
//! clock, nothing sleeps for real.
mod support;
use std::sync::Arc;
use std::time::Duration;

use support::{app, assert_lease_kept, spawn_waiting, Faulty, Harness};

#[tokio::test(start_paused = true)]
async fn leases_are_extended_again_after_an_idle_spell() {
    let h = Harness::memory().await;
    let store = Arc::new(Faulty::new(h.store.clone()));
    let (router, state) = app(h.heartbeat_layer(store.clone()));

    for round in 0..3 {
        let key = format!("k{round}");
        // Idle long enough for the ticker to find nothing and stop.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let started = state.started.notified();
        let waiting = spawn_waiting(&router, &key, "a");
        started.await;
        assert_lease_kept(&h, &store, &router, &key, 1).await;
        state.proceed.notify_one();
        assert_eq!(waiting.await.unwrap().status, 201);
    }
    assert_eq!(state.runs(), 3);
}

/// The layer's defaults (`IdempotencyLayer::new`, no builder) extend a
/// running handler's lease every third of the 5 s lock timeout: at least
/// five times in 10 s (a heartbeat at the lock timeout or later would make
/// one or two, and let the lease go stale between them).
#[tokio::test(start_paused = true)]
async fn the_default_heartbeat_is_a_third_of_the_lock_timeout() {
    let h = Harness::memory().await;
    let store = Arc::new(Faulty::new(h.store.clone()));
    let (router, state) = app(tower_idempotency::IdempotencyLayer::from_arc(store.clone()));
    let started = state.started.notified();
    let waiting = spawn_waiting(&router, "k", "a");
    started.await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let extends = store.extends.load(std::sync::atomic::Ordering::SeqCst);
    assert!((5..=7).contains(&extends), "{extends} extensions in 10 s");
    state.proceed.notify_one();
    assert_eq!(waiting.await.unwrap().status, 201);
}
