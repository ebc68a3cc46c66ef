//! Self-fencing: a handler learns that its lease may be lost before any
//! other replica can take its key over, and a handler that checks
//! [`IdempotencyContext::still_held`] right before its effect never runs
//! that effect after a takeover: the one-replica partition of issue 31
//! (only the owner loses the store; the other replica marks the lease
//! stale and takes it over while the owner's handler still runs).
//!
//! Two replicas share one `MemoryStore` through wrappers, one of which can
//! be cut off. Paused time; the store's clock follows tokio's, so the
//! store's lease times and the layer's move together, and nothing sleeps
//! for real.
mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Extension, State};
use axum::http::{HeaderMap, Request, StatusCode};
use axum::routing;
use axum::Router;
use support::{send, Faulty, Reply, TokioClock};
use tokio::sync::Notify;
use tokio::time::Instant;
use tower_idempotency::{IdempotencyContext, IdempotencyLayer, IdempotencyStore, MemoryStore};

/// The layer's default lock timeout.
const LOCK_TIMEOUT: Duration = Duration::from_secs(5);

/// A payments service whose effect (a charge, outside the store) runs only
/// while its handler still holds the key.
#[derive(Clone, Default)]
struct Shop {
    /// Charges made.
    charges: Arc<AtomicUsize>,
    /// Each run's context and when it started.
    runs: Arc<Mutex<Vec<(IdempotencyContext, Instant)>>>,
    /// Signalled when a handler with `x-wait` has started.
    started: Arc<Notify>,
    /// Handlers with `x-wait` wait for this before their effect.
    proceed: Arc<Notify>,
}

impl Shop {
    fn runs(&self) -> Vec<(IdempotencyContext, Instant)> {
        self.runs.lock().unwrap().clone()
    }
}

async fn charge(
    State(shop): State<Shop>,
    Extension(ctx): Extension<IdempotencyContext>,
    headers: HeaderMap,
) -> StatusCode {
    shop.runs
        .lock()
        .unwrap()
        .push((ctx.clone(), Instant::now()));
    if headers.contains_key("x-wait") {
        let proceed = shop.proceed.notified();
        shop.started.notify_one();
        proceed.await;
    }
    // Right before the effect.
    if !ctx.still_held() {
        return StatusCode::SERVICE_UNAVAILABLE;
    }
    shop.charges.fetch_add(1, Ordering::SeqCst);
    StatusCode::CREATED
}

fn replica(layer: IdempotencyLayer, shop: &Shop) -> Router {
    Router::new()
        .route("/payments", routing::post(charge))
        .with_state(shop.clone())
        .layer(layer)
}

fn pay(key: &str, wait: bool) -> Request<Body> {
    let mut request = Request::post("/payments")
        .header("idempotency-key", key)
        .header("content-type", "application/json");
    if wait {
        request = request.header("x-wait", "1");
    }
    request.body(Body::from(r#"{"amount":1}"#)).unwrap()
}

/// Retries on `router` every 100 ms until the answer is neither 409 nor
/// 503.
async fn retry_until_answered(router: &Router, key: &str) -> Reply {
    loop {
        let reply = send(router, pay(key, false)).await;
        if reply.status != StatusCode::CONFLICT && reply.status != StatusCode::SERVICE_UNAVAILABLE {
            return reply;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A store shared by replicas, on a clock that follows tokio's.
fn shared_store() -> Arc<dyn IdempotencyStore> {
    Arc::new(MemoryStore::with_clock(Arc::new(TokioClock::new())))
}

/// Waits for `told`, failing the test (not hanging it) if it never comes.
async fn within(limit: Duration, told: impl std::future::Future<Output = ()>, never: &str) {
    if tokio::time::timeout(limit, told).await.is_err() {
        panic!("{never}");
    }
}

#[tokio::test(start_paused = true)]
async fn an_owner_cut_off_from_the_store_is_told_before_its_key_can_be_taken_over() {
    let store = shared_store();
    // The owner's heartbeats are answered a second after the store made
    // them: the lease counts from when they were sent, not answered.
    let mut slow = Faulty::new(store.clone());
    slow.extend_reply_delay = Duration::from_secs(1);
    let (to_a, to_b) = (Arc::new(slow), Arc::new(Faulty::new(store.clone())));
    let shop = Shop::default();
    let a = replica(IdempotencyLayer::from_arc(to_a.clone()), &shop);
    let b = replica(IdempotencyLayer::from_arc(to_b.clone()), &shop);

    let started = shop.started.notified();
    let first = tokio::spawn({
        let a = a.clone();
        async move { send(&a, pay("k", true)).await }
    });
    started.await;
    let (owner, _) = shop.runs()[0].clone();
    assert!(owner.still_held());
    assert!(owner.epoch() > 0);
    // A few heartbeats get through; then only the owner loses the store.
    to_a.wait_extends(0, 2).await;
    to_a.cut_off.store(true, Ordering::SeqCst);
    let cut_at = Instant::now();
    let retries = tokio::spawn({
        let b = b.clone();
        async move { retry_until_answered(&b, "k").await }
    });

    within(
        LOCK_TIMEOUT * 4,
        owner.lost(),
        "the owner was never told it may have lost its key",
    )
    .await;
    let told_at = Instant::now();
    assert!(!owner.still_held());
    assert!(
        told_at - cut_at <= LOCK_TIMEOUT,
        "told {:?} after the cut, more than a lock timeout",
        told_at - cut_at
    );

    // The other replica takes the key over, a lock timeout after the
    // owner was told at the earliest, and charges.
    let taken_over = retries.await.unwrap();
    assert_eq!(taken_over.status, StatusCode::CREATED);
    let runs = shop.runs();
    assert_eq!(runs.len(), 2, "the other replica ran the handler once");
    let (successor, started_at) = runs[1].clone();
    assert!(
        started_at >= told_at + LOCK_TIMEOUT,
        "taken over {:?} after the owner was told, less than a lock timeout",
        started_at - told_at
    );
    assert!(
        successor.epoch() > owner.epoch(),
        "the takeover's epoch {} is not above the owner's {}",
        successor.epoch(),
        owner.epoch()
    );

    // The owner's handler goes on, checks before its effect, and skips it.
    to_a.cut_off.store(false, Ordering::SeqCst);
    shop.proceed.notify_one();
    let owners_answer = first.await.unwrap();
    assert_eq!(shop.charges.load(Ordering::SeqCst), 1, "charged twice");
    // Its caller gets the successor's answer, not its own 503.
    assert_eq!(owners_answer.status, StatusCode::CREATED);
    assert!(owners_answer.replayed());
    assert!(!owner.still_held());
}

/// A live lease, its heartbeats going through, stays held however long
/// its handler runs: with the defaults (a heartbeat every third of the
/// 5 s lock timeout) and with a lock timeout of one's own (the heartbeat
/// follows it). A heartbeat as slow as the lock timeout would let the
/// lease lapse between two of them.
#[tokio::test(start_paused = true)]
async fn a_live_lease_stays_held_however_long_its_handler_runs() {
    let custom = IdempotencyLayer::builder_from_arc(shared_store())
        .lock_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    for layer in [IdempotencyLayer::from_arc(shared_store()), custom] {
        let shop = Shop::default();
        let router = replica(layer, &shop);
        let started = shop.started.notified();
        let waiting = tokio::spawn(async move { send(&router, pay("k", true)).await });
        started.await;
        let (ctx, _) = shop.runs()[0].clone();
        tokio::select! {
            () = ctx.lost() => panic!("a live lease was reported lost"),
            () = tokio::time::sleep(LOCK_TIMEOUT * 10) => {}
        }
        assert!(ctx.still_held());
        shop.proceed.notify_one();
        assert_eq!(waiting.await.unwrap().status, StatusCode::CREATED);
        assert_eq!(shop.charges.load(Ordering::SeqCst), 1);
    }
}

/// An outage of the store longer than twice the completion patience: the
/// response cannot be kept, nor its marker, and the caller is told `410`
/// ("never runs again"). The owner keeps its lease and keeps trying the
/// marker for as long as it lives, so once the store is back a retry gets
/// the same `410`, and the handler never runs again.
#[tokio::test(start_paused = true)]
async fn an_owner_keeps_its_key_until_its_marker_is_stored() {
    let store = shared_store();
    let (to_a, to_b) = (
        Arc::new(Faulty::new(store.clone())),
        Arc::new(Faulty::new(store.clone())),
    );
    let shop = Shop::default();
    let layer = |to: &Arc<Faulty>| {
        IdempotencyLayer::builder_from_arc(to.clone())
            .completion_patience(Duration::from_secs(2))
            .build()
            .unwrap()
    };
    let a = replica(layer(&to_a), &shop);
    let b = replica(layer(&to_b), &shop);

    let started = shop.started.notified();
    let first = tokio::spawn(async move { send(&a, pay("k", true)).await });
    started.await;
    // The whole store goes away, for both replicas, right after the
    // effect; it is back long after the owner gave up the response and
    // the marker.
    for to in [&to_a, &to_b] {
        to.cut_off.store(true, Ordering::SeqCst);
    }
    shop.proceed.notify_one();
    let answer = first.await.unwrap();
    answer.assert_problem(410);
    assert_eq!(shop.charges.load(Ordering::SeqCst), 1);
    tokio::time::sleep(LOCK_TIMEOUT * 6).await;
    for to in [&to_a, &to_b] {
        to.cut_off.store(false, Ordering::SeqCst);
    }

    // Retries on the other replica, for many lock timeouts: every one
    // gets the marker (after at most a few 409s), none runs the handler.
    let mut last = retry_until_answered(&b, "k").await;
    for _ in 0..5 {
        tokio::time::sleep(LOCK_TIMEOUT * 3).await;
        last = send(&b, pay("k", false)).await;
    }
    last.assert_problem(410);
    assert!(last.replayed());
    assert_eq!(shop.runs().len(), 1, "the handler ran again after its 410");
    assert_eq!(shop.charges.load(Ordering::SeqCst), 1);
}

/// The store saying the lease is gone (here, the key deleted under its
/// owner) tells the owner at the next heartbeat, not a lock timeout later.
#[tokio::test(start_paused = true)]
async fn the_store_saying_the_lease_is_gone_tells_the_owner_at_once() {
    let store = shared_store();
    let shop = Shop::default();
    let router = replica(IdempotencyLayer::from_arc(store.clone()), &shop);
    let started = shop.started.notified();
    let waiting = tokio::spawn(async move { send(&router, pay("k", true)).await });
    started.await;
    let (ctx, _) = shop.runs()[0].clone();
    tokio::time::sleep(LOCK_TIMEOUT * 2).await;
    assert!(ctx.still_held());
    assert!(store
        .release(ctx.scope(), ctx.key(), ctx.lease())
        .await
        .unwrap());
    let released_at = Instant::now();
    within(LOCK_TIMEOUT * 4, ctx.lost(), "never told").await;
    let heartbeat = LOCK_TIMEOUT / 3;
    assert!(
        released_at.elapsed() <= heartbeat,
        "told {:?} after the store lost the lease, more than a heartbeat",
        released_at.elapsed()
    );
    assert!(!ctx.still_held());
    shop.proceed.notify_one();
    // Its own answer is not the key's: the caller is told to retry.
    waiting.await.unwrap().assert_problem(409);
    assert_eq!(shop.charges.load(Ordering::SeqCst), 0);
}
