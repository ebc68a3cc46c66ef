//! A lease extension that stalls (the store never answers it) must not
//! delay the extension of any other lease: leases are extended
//! independently, so one stuck call cannot let another live handler's lease
//! lapse and a retry run that handler twice. An extension that panics ends
//! like one that failed: the next tick tries again.
mod support;
use std::sync::Arc;

use support::{app, assert_lease_kept, post, send, spawn_waiting, Faulty, Harness};

both_stores!(
    a_stalled_extension_delays_no_other_lease,
    a_panicking_extension_is_tried_again
);

async fn a_stalled_extension_delays_no_other_lease(h: Harness) {
    let mut store = Faulty::new(h.store.clone());
    store.stalled_key = Some("stuck");
    let store = Arc::new(store);
    let (router, state) = app(h.heartbeat_layer(store.clone()));

    // The handler of `stuck` starts first and its first extension stalls.
    let started = state.started.notified();
    let stuck = spawn_waiting(&router, "stuck", "a");
    started.await;
    store.wait_stalled(1).await;
    // Then the handler of `k` starts ...
    let started = state.started.notified();
    let live = spawn_waiting(&router, "k", "a");
    started.await;
    // ... and far past the lock timeout keeps its lease while `stuck`'s
    // extension hangs.
    assert_lease_kept(&h, &store, &router, "k", 3).await;
    assert_eq!(state.runs(), 2, "{}", h.name);

    // Both handlers finish; `k`'s response is what its retry gets.
    state.proceed.notify_one();
    state.proceed.notify_one();
    let (stuck, live) = (stuck.await.unwrap(), live.await.unwrap());
    assert_eq!(stuck.status, 201, "{}: {:?}", h.name, stuck.body);
    assert_eq!(live.status, 201, "{}: {:?}", h.name, live.body);
    let replay = send(&router, post("k", "a")).await;
    assert!(replay.replayed(), "{}: `k` ran twice", h.name);
    assert_eq!(replay.body, live.body);
    assert_eq!(state.runs(), 2, "{}", h.name);
}

async fn a_panicking_extension_is_tried_again(h: Harness) {
    let store = Faulty::new(h.store.clone());
    *store.panic_next_extend.lock().unwrap() = Some("flaky");
    let store = Arc::new(store);
    let (router, state) = app(h.heartbeat_layer(store.clone()));
    let started = state.started.notified();
    let live = spawn_waiting(&router, "flaky", "a");
    started.await;
    // The first extension panicked; later ones go through ...
    store.wait_extends(0, 1).await;
    assert!(store.panic_next_extend.lock().unwrap().is_none());
    // ... so far past the lock timeout the handler still owns its key.
    assert_lease_kept(&h, &store, &router, "flaky", 1).await;
    state.proceed.notify_one();
    assert_eq!(live.await.unwrap().status, 201);
    assert!(send(&router, post("flaky", "a")).await.replayed());
    assert_eq!(state.runs(), 1, "{}", h.name);
}
