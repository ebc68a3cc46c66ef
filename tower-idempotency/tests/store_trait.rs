//! The `IdempotencyStore` contract, checked directly against both stores.
mod support;
use std::time::Duration;
use support::Harness;
use tower_idempotency::{ClaimOutcome, ClaimRequest, Fingerprint, LeaseToken, StoredResponse};

both_stores!(
    claim_complete_replay,
    complete_owned_is_complete,
    release_and_reclaim,
    lock_timeout_takeover,
    extended_lease_is_not_taken_over,
    expiry,
    epochs_only_go_up
);

const A: Fingerprint = Fingerprint([1; 32]);
const B: Fingerprint = Fingerprint([2; 32]);

fn claim_req<'a>(scope: &'a str, key: &'a str, fingerprint: Fingerprint) -> ClaimRequest<'a> {
    ClaimRequest {
        scope,
        key,
        fingerprint,
        lock_timeout: Duration::from_secs(30),
        ttl: Duration::from_secs(3600),
    }
}

async fn claimed(h: &Harness, key: &str, fp: Fingerprint) -> LeaseToken {
    match h.store.claim(claim_req(&h.scope, key, fp)).await.unwrap() {
        ClaimOutcome::Claimed { lease, .. } => lease,
        other => panic!("{}: expected Claimed, got {other:?}", h.name),
    }
}

fn response() -> StoredResponse {
    StoredResponse::new(
        201,
        vec![
            ("content-type".into(), "application/json".into()),
            ("x-a".into(), "1".into()),
        ],
        &b"{\"id\":1}\x00\xff"[..],
    )
}

/// A claim of `key` finds `response()` stored, and says whether `fp` is
/// the fingerprint it was stored with.
async fn assert_replays(h: &Harness, key: &str, fp: Fingerprint, matches: bool) {
    let state = h.store.claim(claim_req(&h.scope, key, fp)).await.unwrap();
    assert_eq!(
        state,
        ClaimOutcome::Completed {
            response: response(),
            fingerprint_matches: matches
        },
        "{}",
        h.name
    );
}

async fn claim_complete_replay(h: Harness) {
    let s = h.scope.as_str();
    let lease = claimed(&h, "k", A).await;
    let state = h.store.claim(claim_req(s, "k", A)).await.unwrap();
    assert_eq!(
        state,
        ClaimOutcome::InProgress {
            fingerprint_matches: true
        }
    );
    let state = h.store.claim(claim_req(s, "k", B)).await.unwrap();
    assert_eq!(
        state,
        ClaimOutcome::InProgress {
            fingerprint_matches: false
        }
    );
    // Only the lease holder may complete.
    assert!(!h
        .store
        .complete(s, "k", LeaseToken::new_random(), &response())
        .await
        .unwrap());
    assert!(h.store.complete(s, "k", lease, &response()).await.unwrap());
    assert!(
        !h.store.complete(s, "k", lease, &response()).await.unwrap(),
        "completes twice"
    );
    assert_replays(&h, "k", A, true).await;
    assert_replays(&h, "k", B, false).await;
    // A completed key cannot be released.
    assert!(!h.store.release(s, "k", lease).await.unwrap());
    // Another scope is another namespace.
    let other = format!("{s}-other");
    assert!(matches!(
        h.store.claim(claim_req(&other, "k", B)).await.unwrap(),
        ClaimOutcome::Claimed { .. }
    ));
}

/// Completing with the response handed over (what the layer does first)
/// follows the same rules as completing with a borrowed one.
async fn complete_owned_is_complete(h: Harness) {
    let s = h.scope.as_str();
    let lease = claimed(&h, "k", A).await;
    let stale = LeaseToken::new_random();
    assert!(!h
        .store
        .complete_owned(s, "k", stale, response())
        .await
        .unwrap());
    assert!(h
        .store
        .complete_owned(s, "k", lease, response())
        .await
        .unwrap());
    assert!(
        !h.store
            .complete_owned(s, "k", lease, response())
            .await
            .unwrap(),
        "completes twice"
    );
    assert!(!h.store.complete(s, "k", lease, &response()).await.unwrap());
    assert_replays(&h, "k", A, true).await;
}

async fn release_and_reclaim(h: Harness) {
    let s = h.scope.as_str();
    let lease = claimed(&h, "k", A).await;
    assert!(!h
        .store
        .release(s, "k", LeaseToken::new_random())
        .await
        .unwrap());
    assert!(h.store.release(s, "k", lease).await.unwrap());
    assert!(!h.store.release(s, "k", lease).await.unwrap());
    // Free again, for any fingerprint.
    let lease2 = claimed(&h, "k", B).await;
    assert_ne!(lease, lease2);
    assert!(!h.store.complete(s, "k", lease, &response()).await.unwrap());
}

async fn lock_timeout_takeover(h: Harness) {
    let s = h.scope.as_str();
    let stale = claimed(&h, "k", A).await;
    h.advance(Duration::from_secs(29)).await;
    assert!(matches!(
        h.store.claim(claim_req(s, "k", A)).await.unwrap(),
        ClaimOutcome::InProgress { .. }
    ));
    h.advance(Duration::from_secs(1)).await;
    // The first claim to find the lease stale marks it, whatever its
    // fingerprint; a lock timeout later, with no heartbeat since, a claim
    // takes over, whatever its fingerprint too (the owner is gone).
    assert_eq!(
        h.store.claim(claim_req(s, "k", B)).await.unwrap(),
        ClaimOutcome::InProgress {
            fingerprint_matches: false
        }
    );
    assert_eq!(
        h.store.claim(claim_req(s, "k", A)).await.unwrap(),
        ClaimOutcome::InProgress {
            fingerprint_matches: true
        }
    );
    h.advance(Duration::from_secs(29)).await;
    assert!(matches!(
        h.store.claim(claim_req(s, "k", A)).await.unwrap(),
        ClaimOutcome::InProgress { .. }
    ));
    h.advance(Duration::from_secs(1)).await;
    // Marked stale by the other body a lock timeout ago: taken over by
    // this one (a corrected request, say).
    let fresh = claimed(&h, "k", B).await;
    assert_ne!(stale, fresh);
    // The stale owner lost its lease.
    assert!(!h.store.complete(s, "k", stale, &response()).await.unwrap());
    assert!(!h.store.release(s, "k", stale).await.unwrap());
    // The new lock is fresh, and the record the new request's: no
    // immediate second takeover, and the old body is refused.
    assert_eq!(
        h.store.claim(claim_req(s, "k", A)).await.unwrap(),
        ClaimOutcome::InProgress {
            fingerprint_matches: false
        },
        "{}",
        h.name
    );
    assert!(matches!(
        h.store.claim(claim_req(s, "k", B)).await.unwrap(),
        ClaimOutcome::InProgress { .. }
    ));
    assert!(h.store.complete(s, "k", fresh, &response()).await.unwrap());
}

async fn expiry(h: Harness) {
    let s = h.scope.as_str();
    let lease = claimed(&h, "k", A).await;
    assert!(h.store.complete(s, "k", lease, &response()).await.unwrap());
    h.advance(Duration::from_secs(3599)).await;
    assert!(matches!(
        h.store.claim(claim_req(s, "k", B)).await.unwrap(),
        ClaimOutcome::Completed { .. }
    ));
    h.advance(Duration::from_secs(1)).await;
    // Expired: claimable again, with any fingerprint.
    claimed(&h, "k", B).await;
}

async fn extended_lease_is_not_taken_over(h: Harness) {
    let s = h.scope.as_str();
    let lease = claimed(&h, "k", A).await;
    assert!(!h
        .store
        .extend_lease(s, "k", LeaseToken::new_random())
        .await
        .unwrap());
    h.advance(Duration::from_secs(29)).await;
    // A heartbeat: the lock now counts from here.
    assert!(h.store.extend_lease(s, "k", lease).await.unwrap());
    h.advance(Duration::from_secs(29)).await;
    assert!(matches!(
        h.store.claim(claim_req(s, "k", A)).await.unwrap(),
        ClaimOutcome::InProgress { .. }
    ));
    // Without another heartbeat it goes stale, is seen stale, and is taken
    // over a lock timeout later.
    h.advance(Duration::from_secs(1)).await;
    assert!(matches!(
        h.store.claim(claim_req(s, "k", A)).await.unwrap(),
        ClaimOutcome::InProgress { .. }
    ));
    h.advance(Duration::from_secs(30)).await;
    let fresh = claimed(&h, "k", A).await;
    assert!(!h.store.extend_lease(s, "k", lease).await.unwrap());
    assert!(h.store.complete(s, "k", fresh, &response()).await.unwrap());
    // A completed key has no lease to extend.
    assert!(!h.store.extend_lease(s, "k", fresh).await.unwrap());
}

/// The claim's epoch, or a panic.
async fn epoch_of(h: &Harness, key: &str, fp: Fingerprint) -> (LeaseToken, u64) {
    match h.store.claim(claim_req(&h.scope, key, fp)).await.unwrap() {
        ClaimOutcome::Claimed { lease, epoch } => (lease, epoch),
        other => panic!("{}: expected Claimed, got {other:?}", h.name),
    }
}

/// Each claim of a key gets a greater epoch than the one before: a
/// takeover, a claim of an expired completed key, a claim after a release.
async fn epochs_only_go_up(h: Harness) {
    let s = h.scope.as_str();
    let (first, e1) = epoch_of(&h, "k", A).await;
    assert!(e1 > 0, "{}", h.name);
    // Taken over: stale, marked, a lock timeout later.
    h.advance(Duration::from_secs(30)).await;
    assert!(matches!(
        h.store.claim(claim_req(s, "k", A)).await.unwrap(),
        ClaimOutcome::InProgress { .. }
    ));
    h.advance(Duration::from_secs(30)).await;
    let (second, e2) = epoch_of(&h, "k", A).await;
    assert!(e2 > e1, "{}: takeover {e2} after {e1}", h.name);
    assert!(!h.store.complete(s, "k", first, &response()).await.unwrap());
    assert!(h.store.complete(s, "k", second, &response()).await.unwrap());
    // Expired, claimed again.
    h.advance(Duration::from_secs(3600)).await;
    let (third, e3) = epoch_of(&h, "k", B).await;
    assert!(e3 > e2, "{}: after expiry {e3} after {e2}", h.name);
    // Released, claimed again at once.
    assert!(h.store.release(s, "k", third).await.unwrap());
    let (_, e4) = epoch_of(&h, "k", B).await;
    assert!(e4 > e3, "{}: after a release {e4} after {e3}", h.name);
    // Another key's epochs are its own business, but never zero.
    let (_, other) = epoch_of(&h, "other", A).await;
    assert!(other > 0);
}
