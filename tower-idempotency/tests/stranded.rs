//! No status and no store error strands a key: a release that fails is
//! tried again, as a completion is, and a record in progress whose owner
//! is provably gone passes to the corrected request, whatever its
//! fingerprint, after the takeover's two steps.
mod support;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use support::{app, post, req, send, Faulty, Harness};
use tower_idempotency::{ClaimOutcome, ClaimRequest, Fingerprint, StoredResponse};

both_stores!(
    a_failed_release_is_tried_again,
    a_dead_owners_key_passes_to_the_corrected_request
);

/// The handler refuses the request (400, a release status) and the
/// store's release fails once: the key is freed all the same, so the
/// corrected request under the same key runs (not `422 key_reused` for
/// the whole expiry).
async fn a_failed_release_is_tried_again(h: Harness) {
    let store = Arc::new(Faulty::new(h.store.clone()));
    store.failing_releases.store(1, Ordering::SeqCst);
    let layer = h.builder_over(store.clone()).build().unwrap();
    let (router, state) = app(layer);
    let rejected = req(
        "POST",
        "/payments",
        Some("k"),
        "bad",
        &[("x-status", "400")],
    );
    assert_eq!(send(&router, rejected).await.status, 400, "{}", h.name);
    let corrected = send(&router, post("k", "good")).await;
    assert_eq!(corrected.status, 201, "{}: {:?}", h.name, corrected.body);
    assert_eq!(state.runs(), 2);
    assert_eq!(store.releases.load(Ordering::SeqCst), 2, "{}", h.name);
    // The corrected request's answer is the key's from now on.
    assert!(send(&router, post("k", "good")).await.replayed());
}

/// An owner that died before settling its key (its release never
/// arrived, or its process went away): once its lease has been seen stale
/// for a lock timeout, a request with another body takes the key over.
/// While the owner may be alive, the other body is refused (422).
async fn a_dead_owners_key_passes_to_the_corrected_request(h: Harness) {
    let scope = h.stored_scope("");
    let lock_timeout = Duration::from_secs(5);
    let claimed = h
        .store
        .claim(ClaimRequest {
            scope: &scope,
            key: "k",
            fingerprint: Fingerprint([0; 32]),
            lock_timeout,
            ttl: Duration::from_secs(24 * 3600),
        })
        .await
        .unwrap();
    let ClaimOutcome::Claimed { lease, .. } = claimed else {
        panic!("{}: {claimed:?}", h.name)
    };
    let (router, state) = app(h.layer());
    // The owner may be alive: refused.
    send(&router, post("k", "a")).await.assert_problem(422);
    // Stale: the first claim to see it so marks it, and waits.
    h.advance(lock_timeout + Duration::from_secs(1)).await;
    send(&router, post("k", "a")).await.assert_problem(422);
    assert_eq!(state.runs(), 0);
    // A lock timeout later, with no heartbeat since: the owner is gone.
    h.advance(lock_timeout + Duration::from_secs(1)).await;
    let taken = send(&router, post("k", "a")).await;
    assert_eq!(taken.status, 201, "{}: {:?}", h.name, taken.body);
    assert_eq!(state.runs(), 1);
    // The dead owner's lease no longer stores anything.
    let late = StoredResponse::json(201, "{}");
    assert!(!h.store.complete(&scope, "k", lease, &late).await.unwrap());
    assert!(send(&router, post("k", "a")).await.replayed());
}
