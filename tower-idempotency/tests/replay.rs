//! A completed key with the same fingerprint replays the stored response.
mod support;
use support::{app, post, req, send, Harness};

both_stores!(replay_is_identical, replay_keeps_non_2xx_final_responses);

async fn replay_is_identical(h: Harness) {
    let (router, state) = app(h.layer());
    let first = send(&router, post("pay-1", r#"{"amount":10}"#)).await;
    assert_eq!(first.status, 201);
    for _ in 0..3 {
        let again = send(&router, post("pay-1", r#"{"amount":10}"#)).await;
        assert_eq!(again.status, first.status);
        assert_eq!(again.body, first.body);
        assert_eq!(again.headers["content-type"], "application/json");
        assert_eq!(again.headers["idempotent-replayed"], "true");
        // Only the configured headers (content-type) are stored.
        assert!(again.headers.get("x-extra").is_none());
    }
    assert_eq!(state.runs(), 1, "{}", h.name);
}

async fn replay_keeps_non_2xx_final_responses(h: Harness) {
    // A 4xx outside the release statuses (400, 415, 422) is a final answer:
    // stored and replayed.
    let (router, state) = app(h.layer());
    let make = || {
        req(
            "POST",
            "/payments",
            Some("bad-1"),
            "x",
            &[("x-status", "404")],
        )
    };
    assert_eq!(send(&router, make()).await.status, 404);
    let again = send(&router, make()).await;
    assert_eq!(again.status, 404);
    assert!(again.replayed());
    assert_eq!(state.runs(), 1);
}

/// A `MemoryStore` given to the layer by type is claimed and completed by
/// direct calls, the completion finding the record by the hash the claim
/// computed: every one of many keys is replayed, none run twice.
#[tokio::test]
async fn a_memory_store_given_by_type_replays_every_key() {
    use tower_idempotency::{IdempotencyLayer, MemoryStore};
    let store = MemoryStore::new();
    let (router, state) = app(IdempotencyLayer::new(store.clone()));
    let keys: Vec<String> = (0..200).map(|i| format!("pay-{i}")).collect();
    for key in &keys {
        let first = send(&router, post(key, key)).await;
        assert_eq!(first.status, 201, "{key}");
        assert!(!first.replayed(), "{key}");
    }
    for key in &keys {
        let again = send(&router, post(key, key)).await;
        assert!(again.replayed(), "{key}: {} {:?}", again.status, again.body);
    }
    assert_eq!(state.runs(), keys.len());
    assert_eq!(store.len(), keys.len());
}
