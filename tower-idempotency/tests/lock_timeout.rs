//! A claim abandoned by a dead server is taken over after the lock timeout.
mod support;
use std::time::Duration;
use support::{app, post, send, Harness};
use tower_idempotency::{ClaimOutcome, ClaimRequest, Fingerprint, StoredResponse};

both_stores!(
    abandoned_claim_is_taken_over,
    takeover_needs_same_fingerprint
);

/// Leaves a claim for `key` in progress, as a server that crashed after
/// claiming would, with a fingerprint that no request of this test matches.
async fn crashed_claim(h: &Harness, key: &str) -> tower_idempotency::LeaseToken {
    let outcome = h
        .store
        .claim(ClaimRequest {
            scope: &format!("{}/", h.scope),
            key,
            fingerprint: Fingerprint([0; 32]),
            lock_timeout: Duration::from_secs(30),
            ttl: Duration::from_secs(24 * 3600),
        })
        .await
        .unwrap();
    let ClaimOutcome::Claimed(lease) = outcome else {
        panic!("expected to claim a new key, got {outcome:?}")
    };
    lease
}

async fn abandoned_claim_is_taken_over(h: Harness) {
    let (router, state) = app(h.layer().lock_timeout(Duration::from_secs(30)));
    // Simulate a crashed server: it claimed and will never answer. We hold
    // the claim by starting a request that waits forever, then forget it
    // (no drop: the task keeps waiting, so nothing releases the claim).
    let started = state.started.notified();
    let r = router.clone();
    let stuck = tokio::spawn(async move {
        send(
            &r,
            support::req("POST", "/payments", Some("k"), "a", &[("x-wait", "1")]),
        )
        .await
    });
    started.await;
    let busy = send(&router, post("k", "a")).await;
    busy.assert_problem(409);
    // 29 s later: still locked.
    h.clock.advance(Duration::from_secs(29));
    send(&router, post("k", "a")).await.assert_problem(409);
    // After the lock timeout the retry takes the claim over and runs.
    h.clock.advance(Duration::from_secs(2));
    let taken = send(&router, post("k", "a")).await;
    assert_eq!(taken.status, 201);
    assert!(!taken.replayed());
    assert_eq!(state.runs(), 2);
    // The stale owner finishing late does not overwrite the stored response.
    state.proceed.notify_one();
    let late = stuck.await.unwrap();
    assert_eq!(late.status, 201);
    let replay = send(&router, post("k", "a")).await;
    assert!(replay.replayed());
    assert_eq!(replay.body, taken.body);
    assert_eq!(state.runs(), 2, "{}", h.name);
}

async fn takeover_needs_same_fingerprint(h: Harness) {
    let lease = crashed_claim(&h, "k2").await;
    let (router, state) = app(h.layer());
    // The claim was made with another fingerprint: 422 before and after the
    // lock timeout (the key stays bound to its first request until expiry).
    send(&router, post("k2", "a")).await.assert_problem(422);
    h.clock.advance(Duration::from_secs(60));
    send(&router, post("k2", "a")).await.assert_problem(422);
    assert_eq!(state.runs(), 0);
    // The stale lease can still be completed while nobody took it over.
    let stored = StoredResponse::json(201, "{}");
    assert!(h
        .store
        .complete(&format!("{}/", h.scope), "k2", lease, &stored)
        .await
        .unwrap());
}
