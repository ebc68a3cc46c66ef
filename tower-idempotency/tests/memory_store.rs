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
        ClaimOutcome::Claimed { lease, .. } => lease,
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
    // In progress and expired: the owner may only be cut off from the
    // store. The sweep marks them seen stale and keeps them ...
    clock.advance(Duration::from_secs(3600));
    assert!(
        store.claim(req("c")).await.is_err(),
        "expired records in progress were dropped in one step"
    );
    // ... and a time to live later, with no extension since, they are gone.
    clock.advance(Duration::from_secs(3600));
    claim(&store, "c").await;
    assert!(store.len() <= 2);
}

fn scoped<'a>(scope: &'a str, key: &'a str) -> ClaimRequest<'a> {
    ClaimRequest { scope, ..req(key) }
}

/// One caller sending ten times `max_keys` keyed requests evicts its own
/// keys, never another caller's completed key inside its expiry; each
/// eviction is counted.
#[tokio::test]
async fn a_flooding_caller_evicts_only_its_own_keys() {
    let clock = Arc::new(ManualClock::new());
    let store = small(clock, 100);
    let victim = match store.claim(scoped("victim", "pay")).await.unwrap() {
        ClaimOutcome::Claimed { lease, .. } => lease,
        other => panic!("{other:?}"),
    };
    let paid = StoredResponse::json(201, "paid");
    assert!(store
        .complete("victim", "pay", victim, &paid)
        .await
        .unwrap());
    for i in 0..1_000 {
        let key = format!("flood-{i}");
        let ClaimOutcome::Claimed { lease, .. } =
            store.claim(scoped("flooder", &key)).await.unwrap()
        else {
            panic!("{key} not claimed")
        };
        let response = StoredResponse::json(404, "no such thing");
        assert!(store
            .complete("flooder", &key, lease, &response)
            .await
            .unwrap());
    }
    assert_eq!(store.len(), 100);
    match store.claim(scoped("victim", "pay")).await.unwrap() {
        ClaimOutcome::Completed { response, .. } => assert_eq!(response, paid),
        other => panic!("the victim's payment was evicted: {other:?}"),
    }
    assert_eq!(store.evictions(), 901);
    // A newcomer has nothing of its own to give up: it is served by
    // evicting the oldest answer stored for a caller that never succeeded
    // (the flooder's), never the victim's payment.
    claim_in(&store, "newcomer", "k").await;
    assert_eq!(store.evictions(), 902);
    match store.claim(scoped("victim", "pay")).await.unwrap() {
        ClaimOutcome::Completed { .. } => {}
        other => panic!("the victim's payment was evicted: {other:?}"),
    }
}

/// With a bound per caller, one flooder holds at most its share, so a
/// newcomer still finds room.
#[tokio::test]
async fn a_bound_per_caller_leaves_room_for_newcomers() {
    let clock = Arc::new(ManualClock::new());
    let store = small(clock, 100).max_keys_per_scope(NonZeroUsize::new(25).unwrap());
    for i in 0..1_000 {
        let key = format!("flood-{i}");
        let lease = claim_in(&store, "flooder", &key).await;
        let response = StoredResponse::json(404, "no such thing");
        assert!(store
            .complete("flooder", &key, lease, &response)
            .await
            .unwrap());
    }
    assert_eq!(store.len(), 25);
    claim_in(&store, "newcomer", "k").await;
}

/// A victim holding most of the store, and a flooder that sends every key
/// under a new scope (a new credential each time): neither evicts any of
/// the victim's keys.
#[tokio::test]
async fn neither_a_large_victim_nor_rotating_scopes_lose_a_key() {
    let clock = Arc::new(ManualClock::new());
    let store = small(clock, 10);
    for i in 0..6 {
        let key = format!("pay-{i}");
        let lease = claim_in(&store, "victim", &key).await;
        assert!(store
            .complete("victim", &key, lease, &StoredResponse::json(201, "paid"))
            .await
            .unwrap());
    }
    for i in 0..100 {
        let key = format!("f-{i}");
        if let Ok(ClaimOutcome::Claimed { lease, .. }) = store.claim(scoped("flooder", &key)).await
        {
            let response = StoredResponse::json(404, "no");
            store
                .complete("flooder", &key, lease, &response)
                .await
                .unwrap();
        }
        // The same from a new scope each time: refused once full.
        let _ = store.claim(scoped(&format!("sybil-{i}"), "f")).await;
    }
    for i in 0..6 {
        let again = store
            .claim(scoped("victim", &format!("pay-{i}")))
            .await
            .unwrap();
        assert!(
            matches!(again, ClaimOutcome::Completed { .. }),
            "pay-{i} would run again: {again:?}"
        );
    }
}

async fn claim_in(store: &MemoryStore, scope: &str, key: &str) -> LeaseToken {
    match store.claim(scoped(scope, key)).await.unwrap() {
        ClaimOutcome::Claimed { lease, .. } => lease,
        other => panic!("{scope}/{key}: expected Claimed, got {other:?}"),
    }
}

/// A completed key that expired and was claimed again is in progress: its
/// old completion's place in the eviction order must not evict it.
#[tokio::test]
async fn a_reclaimed_key_is_not_evicted_as_completed() {
    let clock = Arc::new(ManualClock::new());
    let store = small(clock.clone(), 3).sweep_every(Duration::from_secs(1_000_000));
    let short = |key| ClaimRequest {
        ttl: Duration::from_millis(5_200),
        ..scoped("v", key)
    };
    let ClaimOutcome::Claimed { lease, .. } = store.claim(short("a")).await.unwrap() else {
        panic!("a not claimed")
    };
    let response = StoredResponse::json(201, "a");
    assert!(store.complete("v", "a", lease, &response).await.unwrap());
    for key in ["b1", "b2"] {
        let lease = claim_in(&store, "f", key).await;
        assert!(store.complete("f", key, lease, &response).await.unwrap());
    }
    // Full: a sweep finds nothing expired yet, and "f" gives up "b1".
    clock.advance(Duration::from_secs(5));
    claim_in(&store, "f", "x").await;
    // "a" expires and is claimed again: in progress, while its completion
    // still has a (stale) place in the eviction order.
    clock.advance(Duration::from_millis(500));
    claim_in(&store, "v", "a").await;
    // Full again, too soon for another sweep: "v" has no completed key of
    // its own to give up ("a"'s old place in the order is stale), so it is
    // refused, and "a" stays in progress.
    assert!(store.claim(scoped("v", "new")).await.is_err());
    assert!(matches!(
        store.claim(scoped("v", "a")).await.unwrap(),
        ClaimOutcome::InProgress { .. }
    ));
}

/// Made-up scopes (a new credential per request) whose answers are stored
/// (errors other than 401 and 403) fill the store; callers that never
/// succeeded cannot lock a genuine new caller out: the newcomer evicts the
/// oldest of their stored errors. A caller that succeeded keeps its keys.
#[tokio::test]
async fn strangers_stored_errors_cannot_lock_a_new_caller_out() {
    let clock = Arc::new(ManualClock::new());
    let store = small(clock, 10);
    let paid = StoredResponse::json(201, "paid");
    let lease = claim_in(&store, "customer", "pay").await;
    assert!(store
        .complete("customer", "pay", lease, &paid)
        .await
        .unwrap());
    for i in 0..100 {
        let scope = format!("stranger-{i}");
        let lease = claim_in(&store, &scope, "probe").await;
        let response = StoredResponse::json(500, "no");
        assert!(store
            .complete(&scope, "probe", lease, &response)
            .await
            .unwrap());
    }
    assert_eq!(store.len(), 10);
    // A genuine new caller is served, and its success is kept.
    let lease = claim_in(&store, "newcomer", "order").await;
    assert!(store
        .complete("newcomer", "order", lease, &paid)
        .await
        .unwrap());
    for i in 100..200 {
        let _ = store.claim(scoped(&format!("stranger-{i}"), "probe")).await;
    }
    for (scope, key) in [("customer", "pay"), ("newcomer", "order")] {
        match store.claim(scoped(scope, key)).await.unwrap() {
            ClaimOutcome::Completed { response, .. } => assert_eq!(response, paid),
            other => panic!("{scope}'s answer was evicted: {other:?}"),
        }
    }
}

/// Claims and completes `key` for `scope` with `status`.
async fn done_in(store: &MemoryStore, scope: &str, key: &str, status: u16) {
    let lease = claim_in(store, scope, key).await;
    let response = StoredResponse::json(status, key.to_owned());
    assert!(store.complete(scope, key, lease, &response).await.unwrap());
}

/// `flooders` credentials, each of which succeeded once, send 150 keys
/// between them into a store of 50; then a caller that holds one
/// completed payment sends a new one and retries the first: the retry is
/// replayed (room came from the heaviest callers), never run again.
async fn a_small_caller_keeps_its_payment_through(flooders: usize) {
    let clock = Arc::new(ManualClock::new());
    let store = small(clock, 50);
    done_in(&store, "victim", "pay-1", 201).await;
    for f in 0..flooders {
        done_in(&store, &format!("flooder-{f}"), "ok", 201).await;
    }
    for i in 0..150 {
        let scope = format!("flooder-{}", i % flooders);
        done_in(&store, &scope, &format!("flood-{i}"), 201).await;
    }
    assert_eq!(store.len(), 50);
    done_in(&store, "victim", "pay-2", 201).await;
    for key in ["pay-1", "pay-2"] {
        match store.claim(scoped("victim", key)).await.unwrap() {
            ClaimOutcome::Completed { response, .. } => assert_eq!(response.status, 201),
            other => panic!("{key} would charge again after {flooders} flooder(s): {other:?}"),
        }
    }
}

#[tokio::test]
async fn one_flooding_credential_cannot_evict_a_small_callers_payment() {
    a_small_caller_keeps_its_payment_through(1).await;
}

#[tokio::test]
async fn four_flooding_credentials_cannot_evict_a_small_callers_payment() {
    a_small_caller_keeps_its_payment_through(4).await;
}

/// Room comes from the heaviest caller: with a heavy caller, a middling
/// one and a small one, the small one's claims take from the heavy one
/// only.
#[tokio::test]
async fn room_comes_from_the_heaviest_caller() {
    let clock = Arc::new(ManualClock::new());
    let store = small(clock, 20);
    for i in 0..12 {
        done_in(&store, "big", &format!("b-{i}"), 201).await;
    }
    done_in(&store, "small", "s-0", 201).await;
    for i in 0..7 {
        done_in(&store, "mid", &format!("m-{i}"), 201).await;
    }
    assert_eq!(store.len(), 20);
    done_in(&store, "small", "s-1", 201).await;
    // "big" (12) gave up its oldest for "small" (1), not "mid" (7).
    let fp = Fingerprint([7; 32]);
    assert_eq!(store.lookup("big", "b-0", fp).await.unwrap(), None);
    for i in 2..4 {
        done_in(&store, "small", &format!("s-{i}"), 201).await;
    }
    let kept = |scope: &'static str, prefix: &'static str, n: usize| {
        let store = store.clone();
        async move {
            let mut kept = 0;
            for i in 0..n {
                let key = format!("{prefix}-{i}");
                let found = store.lookup(scope, &key, fp).await.unwrap();
                kept += usize::from(matches!(found, Some(ClaimOutcome::Completed { .. })));
            }
            kept
        }
    };
    assert_eq!(
        kept("small", "s", 4).await,
        4,
        "the small caller lost a record"
    );
    assert_eq!(
        kept("mid", "m", 7).await,
        7,
        "a lighter caller paid for the heaviest"
    );
}

/// The order of callers by weight is dropped by each sweep and counted
/// again the next time the store is full: it still names the heaviest.
#[tokio::test]
async fn the_heaviest_caller_is_found_again_after_a_sweep() {
    let clock = Arc::new(ManualClock::new());
    let store = small(clock.clone(), 10).sweep_every(Duration::from_secs(1));
    for i in 0..8 {
        done_in(&store, "big", &format!("b-{i}"), 201).await;
    }
    done_in(&store, "small", "s-0", 201).await;
    done_in(&store, "mid", "m-0", 201).await;
    done_in(&store, "small", "s-1", 201).await;
    clock.advance(Duration::from_secs(2));
    done_in(&store, "mid", "m-1", 201).await;
    done_in(&store, "big", "b-8", 201).await;
    let fp = Fingerprint([7; 32]);
    for (scope, key, kept) in [
        ("big", "b-0", false),
        ("big", "b-1", false),
        // "big" itself, the heaviest, made room for its own new key.
        ("big", "b-2", false),
        ("big", "b-3", true),
        ("big", "b-8", true),
        ("small", "s-0", true),
        ("small", "s-1", true),
        ("mid", "m-0", true),
        ("mid", "m-1", true),
    ] {
        let found = store.lookup(scope, key, fp).await.unwrap();
        assert_eq!(found.is_some(), kept, "{scope}/{key}");
    }
}
