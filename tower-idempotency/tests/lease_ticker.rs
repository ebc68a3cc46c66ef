//! The lease ticker stops when no handler runs and starts again with the
//! next claim: a handler that starts after an idle spell still has its
//! lease extended. Paused time: the ticker's sleeps advance a virtual
//! clock, nothing sleeps for real.
mod support;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use support::{app, post, send, spawn_waiting, Faulty, Harness};

#[tokio::test(start_paused = true)]
async fn leases_are_extended_again_after_an_idle_spell() {
    let h = Harness::memory().await;
    let store = Arc::new(Faulty::new(h.store.clone()));
    let layer = h
        .builder_over(store.clone())
        .lock_timeout(Duration::from_secs(3))
        .heartbeat_every(Duration::from_millis(5))
        .build()
        .unwrap();
    let (router, state) = app(layer);

    for round in 0..3 {
        let key = format!("k{round}");
        // Idle long enough for the ticker to find nothing and stop.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let started = state.started.notified();
        let waiting = spawn_waiting(&router, &key, "a");
        started.await;
        h.advance(Duration::from_secs(10)).await;
        store
            .wait_extends(store.extends.load(Ordering::SeqCst), 2)
            .await;
        send(&router, post(&key, "a")).await.assert_problem(409);
        state.proceed.notify_one();
        assert_eq!(waiting.await.unwrap().status, 201);
    }
    assert_eq!(state.runs(), 3);
}
