//! Leases: a live handler extends its lease and is never taken over; a claim
//! whose owner died (no heartbeat) is taken over after the lock timeout.
mod support;
use std::sync::Arc;
use std::time::Duration;
use support::{app, assert_lease_kept, post, req, send, Faulty, Harness};
use tower_idempotency::{ClaimOutcome, ClaimRequest, Fingerprint, StoredResponse};

both_stores!(
    live_handler_is_not_taken_over,
    live_handler_outlives_its_expiry,
    dead_owner_is_taken_over,
    owner_back_from_an_outage_keeps_its_key,
    owner_back_from_an_outage_longer_than_the_expiry_keeps_its_key,
    an_expired_record_in_progress_is_swept_in_two_steps,
    takeover_needs_same_fingerprint
);

fn waiting() -> axum::http::Request<axum::body::Body> {
    req("POST", "/payments", Some("k"), "a", &[("x-wait", "1")])
}

async fn live_handler_is_not_taken_over(h: Harness) {
    let store = Arc::new(Faulty::new(h.store.clone()));
    let (router, state) = app(h.heartbeat_layer(store.clone()));
    let started = state.started.notified();
    let r = router.clone();
    let slow = tokio::spawn(async move { send(&r, waiting()).await });
    started.await;
    // The handler runs far past the lock timeout but keeps extending its
    // lease, so a retry is told to wait, never run.
    assert_lease_kept(&h, &store, &router, "k", 3).await;
    state.proceed.notify_one();
    let first = slow.await.unwrap();
    assert_eq!(first.status, 201);
    let replay = send(&router, post("k", "a")).await;
    assert!(replay.replayed());
    assert_eq!(replay.body, first.body);
    assert_eq!(state.runs(), 1, "{}: a live handler was taken over", h.name);
}

async fn dead_owner_is_taken_over(h: Harness) {
    // Replica A claims and then never extends its lease (it died, or is cut
    // off from the store); replica B shares the store with the defaults.
    let mut dead = Faulty::new(h.store.clone());
    dead.no_heartbeat = true;
    let scope = h.scope.clone();
    let replica_a = tower_idempotency::IdempotencyLayer::builder(dead)
        .scope_with(move |_| format!("{scope}/"))
        .build()
        .unwrap();
    let (router_a, state_a) = app(replica_a);
    let (router_b, state_b) = app(h.layer());
    let started = state_a.started.notified();
    let stuck = tokio::spawn(async move { send(&router_a, waiting()).await });
    started.await;
    // Within the default lock timeout (5 s) the key is busy.
    h.advance(Duration::from_secs(4)).await;
    send(&router_b, post("k", "a")).await.assert_problem(409);
    // After it, the first retry finds the lease stale: its owner gets one
    // more lock timeout to come back (from an outage of the store, say) ...
    h.advance(Duration::from_secs(2)).await;
    send(&router_b, post("k", "a")).await.assert_problem(409);
    h.advance(Duration::from_secs(4)).await;
    send(&router_b, post("k", "a")).await.assert_problem(409);
    // ... and once it has not, replica B takes the claim over and runs the
    // handler.
    h.advance(Duration::from_secs(2)).await;
    let taken = send(&router_b, post("k", "a")).await;
    assert_eq!(taken.status, 201, "{}: {:?}", h.name, taken.body);
    assert!(!taken.replayed());
    // Replica A finishing late does not overwrite the stored response, and
    // does not answer as if it had won: its caller gets what the store
    // holds, the replay of replica B's run.
    state_a.proceed.notify_one();
    let late = stuck.await.unwrap();
    assert_eq!(late.status, 201);
    assert!(
        late.replayed(),
        "{}: the stale owner answered its own run",
        h.name
    );
    assert_eq!(late.body, taken.body);
    let replay = send(&router_b, post("k", "a")).await;
    assert!(replay.replayed());
    assert_eq!(replay.body, taken.body);
    assert_eq!(state_a.runs() + state_b.runs(), 2);
}

/// A handler that runs past the key's expiry keeps it: each heartbeat
/// renews the record's time to live as well as its lock.
async fn live_handler_outlives_its_expiry(h: Harness) {
    let store = Arc::new(Faulty::new(h.store.clone()));
    let layer = h
        .builder_over(store.clone())
        .lock_timeout(Duration::from_secs(3))
        .heartbeat_every(Duration::from_millis(5))
        .expiry(Duration::from_secs(15))
        .build()
        .unwrap();
    let (router, state) = app(layer);
    let started = state.started.notified();
    let r = router.clone();
    let slow = tokio::spawn(async move { send(&r, waiting()).await });
    started.await;
    // 40 s of store time, past the 15 s expiry: never taken over.
    assert_lease_kept(&h, &store, &router, "k", 4).await;
    state.proceed.notify_one();
    assert_eq!(slow.await.unwrap().status, 201);
    assert!(send(&router, post("k", "a")).await.replayed());
    assert_eq!(state.runs(), 1, "{}: a live handler was taken over", h.name);
}

/// The store's view of a failover: the owner could not reach the store for
/// longer than the lock timeout, and a retry reached it first after the
/// outage. The retry only marks the lease as seen stale; the owner's next
/// heartbeat, within a lock timeout of that, keeps the key.
async fn owner_back_from_an_outage_keeps_its_key(h: Harness) {
    let day = Duration::from_secs(24 * 3600);
    owner_back_keeps_its_key(&h, day, Duration::from_secs(7)).await;
}

/// Claims a key with a 5 s lock timeout and `ttl`, then three times: an
/// outage of `outage` (longer than the lock timeout), a retry that only
/// marks the lease seen stale, the owner's heartbeat within a lock timeout
/// of that, and a retry that finds the key still the owner's.
async fn owner_back_keeps_its_key(h: &Harness, ttl: Duration, outage: Duration) {
    let scope = h.stored_scope("");
    let claim = |fingerprint| ClaimRequest {
        scope: &scope,
        key: "k",
        fingerprint,
        lock_timeout: Duration::from_secs(5),
        ttl,
    };
    let mine = Fingerprint([1; 32]);
    let ClaimOutcome::Claimed { lease, .. } = h.store.claim(claim(mine)).await.unwrap() else {
        panic!("a new key is claimed")
    };
    for _ in 0..3 {
        h.advance(outage).await;
        let retry = h.store.claim(claim(mine)).await.unwrap();
        assert!(
            matches!(
                retry,
                ClaimOutcome::InProgress {
                    fingerprint_matches: true
                }
            ),
            "{}: {retry:?}",
            h.name
        );
        // The owner is back before a lock timeout has passed since.
        h.advance(Duration::from_secs(4)).await;
        assert!(h.store.extend_lease(&scope, "k", lease).await.unwrap());
        h.advance(Duration::from_secs(2)).await;
        let retry = h.store.claim(claim(mine)).await.unwrap();
        assert!(
            matches!(retry, ClaimOutcome::InProgress { .. }),
            "{}: the owner's key was taken over: {retry:?}",
            h.name
        );
    }
    let stored = StoredResponse::json(201, "{}");
    assert!(h.store.complete(&scope, "k", lease, &stored).await.unwrap());
}

async fn takeover_needs_same_fingerprint(h: Harness) {
    // A claim left by a crashed server, with a fingerprint no request of
    // this test matches.
    let scope = h.stored_scope("");
    let outcome = h
        .store
        .claim(ClaimRequest {
            scope: &scope,
            key: "k2",
            fingerprint: Fingerprint([0; 32]),
            lock_timeout: Duration::from_secs(30),
            ttl: Duration::from_secs(24 * 3600),
        })
        .await
        .unwrap();
    let ClaimOutcome::Claimed { lease, .. } = outcome else {
        panic!("expected to claim a new key, got {outcome:?}")
    };
    let (router, state) = app(h.layer());
    // 422 before and after the lock timeout (the key stays bound to its
    // first request until expiry).
    send(&router, post("k2", "a")).await.assert_problem(422);
    h.advance(Duration::from_secs(60)).await;
    send(&router, post("k2", "a")).await.assert_problem(422);
    assert_eq!(state.runs(), 0);
    // The stale lease can still be completed while nobody took it over.
    let stored = StoredResponse::json(201, "{}");
    assert!(h
        .store
        .complete(&scope, "k2", lease, &stored)
        .await
        .unwrap());
}

/// The same outage, longer than the key's expiry (6 s; the lock timeout
/// 5 s, which `build()` accepts): the expired record in progress is not
/// free. A retry only marks it seen stale, and the owner's heartbeat within
/// a lock timeout keeps it.
async fn owner_back_from_an_outage_longer_than_the_expiry_keeps_its_key(h: Harness) {
    owner_back_keeps_its_key(&h, Duration::from_secs(6), Duration::from_secs(12)).await;
}

/// The sweep follows the same two steps: an expired record in progress is
/// first marked seen stale; an owner that extends it keeps it; one not
/// extended for a time to live after the mark is deleted.
async fn an_expired_record_in_progress_is_swept_in_two_steps(h: Harness) {
    let scope = h.stored_scope("");
    let ClaimOutcome::Claimed { lease, .. } = h
        .store
        .claim(ClaimRequest {
            scope: &scope,
            key: "k",
            fingerprint: Fingerprint([2; 32]),
            lock_timeout: Duration::from_secs(5),
            ttl: Duration::from_secs(6),
        })
        .await
        .unwrap()
    else {
        panic!("a new key is claimed")
    };
    h.advance(Duration::from_secs(12)).await;
    assert_eq!(h.store.sweep_expired().await.unwrap(), 0, "{}", h.name);
    // The owner is back: its record stays.
    h.advance(Duration::from_secs(2)).await;
    assert!(h.store.extend_lease(&scope, "k", lease).await.unwrap());
    h.advance(Duration::from_secs(12)).await;
    assert_eq!(h.store.sweep_expired().await.unwrap(), 0, "{}", h.name);
    h.advance(Duration::from_secs(3)).await;
    assert_eq!(h.store.sweep_expired().await.unwrap(), 0, "{}", h.name);
    // A time to live after the mark, with no extension: gone.
    h.advance(Duration::from_secs(4)).await;
    assert_eq!(h.store.sweep_expired().await.unwrap(), 1, "{}", h.name);
    assert!(!h.store.extend_lease(&scope, "k", lease).await.unwrap());
}
