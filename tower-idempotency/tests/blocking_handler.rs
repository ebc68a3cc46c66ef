//! A handler that blocks its worker thread (a synchronous call, a long CPU
//! loop) for longer than the lock timeout, inside `block_in_place` as tokio
//! asks of blocking code, keeps its lease: the lease is extended from
//! another worker meanwhile, so a duplicate gets 409 and the handler never
//! runs twice.
//!
//! Without `block_in_place` no library can promise that: a worker blocked
//! right after it drove the runtime's I/O and timer driver leaves the
//! driver to nobody while the other workers sleep, and every timer and
//! socket of the runtime stops (a CI run hung here exactly so, the other
//! worker parked on its condition variable). `block_in_place` hands the
//! worker's duties to another thread first.
mod support;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post as route_post;
use axum::Router;
use support::{assert_lease_kept, post, send, Faulty, Harness};
use tokio::sync::Notify;

#[derive(Clone)]
struct Blocking {
    runs: Arc<AtomicUsize>,
    started: Arc<Notify>,
    /// The handler blocks its thread until the test sends on this channel.
    proceed: Arc<Mutex<mpsc::Receiver<()>>>,
}

async fn blocking_handler(State(state): State<Blocking>, body: Bytes) -> (StatusCode, String) {
    let run = state.runs.fetch_add(1, Ordering::SeqCst) + 1;
    state.started.notify_one();
    // Blocks the worker thread, not just this task: nothing else can run on
    // this thread until the test lets go.
    tokio::task::block_in_place(|| {
        let _ = state
            .proceed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .recv();
    });
    (
        StatusCode::CREATED,
        format!("run {run}: {}", String::from_utf8_lossy(&body)),
    )
}

async fn blocking_handler_keeps_its_lease(h: Harness) {
    let store = Arc::new(Faulty::new(h.store.clone()));
    let layer = h.heartbeat_layer(store.clone());
    let (proceed_tx, proceed_rx) = mpsc::channel();
    let state = Blocking {
        runs: Arc::new(AtomicUsize::new(0)),
        started: Arc::new(Notify::new()),
        proceed: Arc::new(Mutex::new(proceed_rx)),
    };
    let router = Router::new()
        .route("/payments", route_post(blocking_handler))
        .with_state(state.clone())
        .layer(layer);

    let started = state.started.notified();
    let r = router.clone();
    // On a worker of the 2-worker runtime: it will block that worker.
    let first = tokio::spawn(async move { send(&r, post("k", "a")).await });
    started.await;
    // Far past the lock timeout while the handler blocks, its lease is
    // extended all the same and a duplicate is told to wait, never run.
    assert_lease_kept(&h, &store, &router, "k", 3).await;
    proceed_tx.send(()).unwrap();
    let first = first.await.unwrap();
    assert_eq!(first.status, 201, "{}: {:?}", h.name, first.body);
    let replay = send(&router, post("k", "a")).await;
    assert!(replay.replayed(), "{}: the handler ran again", h.name);
    assert_eq!(replay.body, first.body);
    assert_eq!(state.runs.load(Ordering::SeqCst), 1, "{}", h.name);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory() {
    blocking_handler_keeps_its_lease(Harness::memory().await).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres() {
    let h = Harness::postgres().await;
    let cleanup = h.cleanup();
    blocking_handler_keeps_its_lease(h).await;
    cleanup.run().await;
}
