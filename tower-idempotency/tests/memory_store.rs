//! MemoryStore stays bounded: expired keys are swept on writes, the oldest
//! completed keys are evicted first, in-progress ones never.
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Duration;

use tower_idempotency::{
    ClaimOutcome, ClaimRequest, Fingerprint, IdempotencyStore, LeaseToken, ManualClock,
    MemoryStore, StoredResponse,
};

fn req(key: &str) -> ClaimRequest<'_> {
    ClaimRequest {
        scope: "s",
        key,
        fingerprint: Fingerprint([7; 32]),
        lock_timeout: Duration::from_secs(5),
        ttl: Duration::from_secs(3600),
    }
}

async fn claim(store: &MemoryStore, key: &str) -> LeaseToken {
    match store.claim(req(key)).await.unwrap() {
        ClaimOutcome::Claimed(lease) => lease,
        other => panic!("{key}: expected Claimed, got {other:?}"),
    }
}

async fn done(store: &MemoryStore, key: &str) {
    let lease = claim(store, key).await;
    let response = StoredResponse::json(201, key.to_owned());
    assert!(store.complete("s", key, lease, &response).await.unwrap());
}

fn small(clock: Arc<ManualClock>, max: usize) -> MemoryStore {
    MemoryStore::with_clock(clock).max_keys(NonZeroUsize::new(max).unwrap())
}

#[tokio::test]
async fn oldest_completed_key_is_evicted_first() {
    let clock = Arc::new(ManualClock::new());
    let store = small(clock, 3);
    done(&store, "a").await;
    done(&store, "b").await;
    let _in_progress = claim(&store, "c").await;
    done(&store, "d").await;
    assert_eq!(store.len(), 3);
    // "a" made room for "d"; "b", "c" and "d" are still there.
    assert!(matches!(
        store.claim(req("b")).await.unwrap(),
        ClaimOutcome::Completed { .. }
    ));
    assert!(matches!(
        store.claim(req("c")).await.unwrap(),
        ClaimOutcome::InProgress { .. }
    ));
    assert!(matches!(
        store.claim(req("d")).await.unwrap(),
        ClaimOutcome::Completed { .. }
    ));
    assert_eq!(store.len(), 3);
}

#[tokio::test]
async fn in_progress_keys_are_never_evicted() {
    let clock = Arc::new(ManualClock::new());
    let store = small(clock, 2);
    let a = claim(&store, "a").await;
    let _b = claim(&store, "b").await;
    let err = store.claim(req("c")).await.unwrap_err();
    assert!(err.is_transient(), "{err}");
    assert!(err.to_string().contains("full"), "{err}");
    // Once "a" completes it may go.
    let response = StoredResponse::json(201, "a");
    assert!(store.complete("s", "a", a, &response).await.unwrap());
    claim(&store, "c").await;
    assert!(matches!(
        store.claim(req("b")).await.unwrap(),
        ClaimOutcome::InProgress { .. }
    ));
}

#[tokio::test]
async fn expired_keys_are_swept_on_writes() {
    let clock = Arc::new(ManualClock::new());
    let store = MemoryStore::with_clock(clock.clone());
    for key in ["a", "b", "c"] {
        done(&store, key).await;
    }
    assert_eq!(store.len(), 3);
    // Past their expiry and the sweep interval, the next write sweeps them.
    clock.advance(Duration::from_secs(3600 + 60));
    done(&store, "d").await;
    assert_eq!(store.len(), 1);
}

#[tokio::test]
async fn a_full_store_of_expired_keys_makes_room() {
    let clock = Arc::new(ManualClock::new());
    let store = small(clock.clone(), 2);
    let _a = claim(&store, "a").await;
    let _b = claim(&store, "b").await;
    // In progress but expired: no longer a claim anyone holds.
    clock.advance(Duration::from_secs(3600));
    claim(&store, "c").await;
    assert!(store.len() <= 2);
}
