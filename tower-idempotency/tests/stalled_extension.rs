//! A lease extension that stalls (the store never answers it) must not
//! delay the extension of any other lease: leases are extended
//! independently, so one stuck call cannot let another live handler's lease
//! lapse and a retry run that handler twice.
mod support;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use support::{app, post, send, spawn_waiting, Harness};
use tokio::sync::Notify;
use tower_idempotency::{
    ClaimOutcome, ClaimRequest, IdempotencyStore, LeaseToken, StoreError, StoredResponse,
};

both_stores!(
    a_stalled_extension_delays_no_other_lease,
    a_panicking_extension_is_tried_again
);

/// Extending the lease of key `stuck` never returns; the first extension of
/// key `flaky` panics; every other call goes to the wrapped store.
struct Stalling {
    inner: Arc<dyn IdempotencyStore>,
    /// Extensions of every other key that returned.
    extends: AtomicUsize,
    /// Extensions of `stuck` that began (and never returned).
    stuck: AtomicUsize,
    /// The next extension of `flaky` panics.
    panic_next: AtomicBool,
    changed: Notify,
}

impl Stalling {
    /// Waits (bounded) until `counter` reaches `target`.
    async fn wait_for(&self, counter: &AtomicUsize, target: usize) {
        let reached = async {
            loop {
                let changed = self.changed.notified();
                tokio::pin!(changed);
                changed.as_mut().enable();
                if counter.load(Ordering::SeqCst) >= target {
                    return;
                }
                changed.await;
            }
        };
        tokio::time::timeout(Duration::from_secs(10), reached)
            .await
            .expect("the lease was never extended");
    }
}

#[async_trait::async_trait]
impl IdempotencyStore for Stalling {
    async fn claim(&self, request: ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError> {
        self.inner.claim(request).await
    }
    async fn complete(
        &self,
        scope: &str,
        key: &str,
        lease: LeaseToken,
        response: &StoredResponse,
    ) -> Result<bool, StoreError> {
        self.inner.complete(scope, key, lease, response).await
    }
    async fn extend_lease(
        &self,
        scope: &str,
        key: &str,
        lease: LeaseToken,
    ) -> Result<bool, StoreError> {
        if key == "stuck" {
            self.stuck.fetch_add(1, Ordering::SeqCst);
            self.changed.notify_waiters();
            return std::future::pending().await;
        }
        if key == "flaky" && self.panic_next.swap(false, Ordering::SeqCst) {
            panic!("extending the lease panicked on purpose");
        }
        let extended = self.inner.extend_lease(scope, key, lease).await;
        self.extends.fetch_add(1, Ordering::SeqCst);
        self.changed.notify_waiters();
        extended
    }
    async fn release(&self, scope: &str, key: &str, lease: LeaseToken) -> Result<bool, StoreError> {
        self.inner.release(scope, key, lease).await
    }
    async fn sweep_expired(&self) -> Result<u64, StoreError> {
        self.inner.sweep_expired().await
    }
}

async fn a_stalled_extension_delays_no_other_lease(h: Harness) {
    let store = Arc::new(Stalling {
        inner: h.store.clone(),
        extends: AtomicUsize::new(0),
        stuck: AtomicUsize::new(0),
        panic_next: AtomicBool::new(false),
        changed: Notify::new(),
    });
    let layer = h
        .builder_over(store.clone())
        .lock_timeout(Duration::from_secs(3))
        .heartbeat_every(Duration::from_millis(5))
        .build()
        .unwrap();
    let (router, state) = app(layer);

    // The handler of `stuck` starts first and its first extension stalls.
    let started = state.started.notified();
    let stuck = spawn_waiting(&router, "stuck", "a");
    started.await;
    store.wait_for(&store.stuck, 1).await;
    // Then the handler of `k` starts.
    let started = state.started.notified();
    let live = spawn_waiting(&router, "k", "a");
    started.await;

    for _ in 0..3 {
        // Far past the lock timeout ...
        h.advance(Duration::from_secs(10)).await;
        // ... `k`'s lease is extended all the same (twice, so at least once
        // after the clock moved) while `stuck`'s extension hangs ...
        let since = store.extends.load(Ordering::SeqCst);
        store.wait_for(&store.extends, since + 2).await;
        // ... so a duplicate of `k` waits and never runs.
        send(&router, post("k", "a")).await.assert_problem(409);
    }
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

/// An extension whose store call panics ends like one that failed: the
/// next tick extends the lease again, so the live handler keeps it.
async fn a_panicking_extension_is_tried_again(h: Harness) {
    let store = Arc::new(Stalling {
        inner: h.store.clone(),
        extends: AtomicUsize::new(0),
        stuck: AtomicUsize::new(0),
        panic_next: AtomicBool::new(true),
        changed: Notify::new(),
    });
    let layer = h
        .builder_over(store.clone())
        .lock_timeout(Duration::from_secs(3))
        .heartbeat_every(Duration::from_millis(5))
        .build()
        .unwrap();
    let (router, state) = app(layer);
    let started = state.started.notified();
    let live = spawn_waiting(&router, "flaky", "a");
    started.await;
    // The first extension panicked; later ones go through ...
    store.wait_for(&store.extends, 1).await;
    assert!(!store.panic_next.load(Ordering::SeqCst));
    h.advance(Duration::from_secs(10)).await;
    let since = store.extends.load(Ordering::SeqCst);
    store.wait_for(&store.extends, since + 2).await;
    // ... so far past the lock timeout the handler still owns its key.
    send(&router, post("flaky", "a")).await.assert_problem(409);
    state.proceed.notify_one();
    assert_eq!(live.await.unwrap().status, 201);
    assert!(send(&router, post("flaky", "a")).await.replayed());
    assert_eq!(state.runs(), 1, "{}", h.name);
}
