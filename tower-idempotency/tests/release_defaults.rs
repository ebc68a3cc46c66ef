//! By default only the request-validation statuses (400, 415, 422) free a
//! key; every other status is stored and replayed, 409 and 5xx included: a
//! handler's own 409 may follow an effect.
mod support;
use support::{app, req, send, Harness};

both_stores!(
    only_validation_statuses_free_the_key,
    unauthenticated_answers_are_never_stored
);

async fn only_validation_statuses_free_the_key(h: Harness) {
    let (router, state) = app(h.layer());
    let with_status =
        |key: &str, status: &str| req("POST", "/payments", Some(key), "a", &[("x-status", status)]);
    for (i, status) in ["409", "500", "503", "429", "404"].into_iter().enumerate() {
        let key = format!("stored-{i}");
        let first = send(&router, with_status(&key, status)).await;
        assert_eq!(first.status.as_str(), status);
        let retry = send(&router, with_status(&key, status)).await;
        assert!(retry.replayed(), "{}: {status} was not stored", h.name);
        assert_eq!(retry.body, first.body);
    }
    for (i, status) in ["400", "415", "422"].into_iter().enumerate() {
        let key = format!("freed-{i}");
        send(&router, with_status(&key, status)).await;
        let retry = send(&router, with_status(&key, status)).await;
        assert!(!retry.replayed(), "{}: {status} was stored", h.name);
    }
    assert_eq!(state.runs(), 5 + 2 * 3);
}

/// 401 and 403 free the key whatever the release statuses: an answer to
/// made-up credentials is not kept, so a flood of them (each its own
/// scope) leaves nothing in the store.
async fn unauthenticated_answers_are_never_stored(h: Harness) {
    let layer = h
        .builder()
        .release_statuses([axum::http::StatusCode::CONFLICT])
        .build()
        .unwrap();
    let (router, state) = app(layer);
    for status in ["401", "403"] {
        for i in 0..20 {
            let bearer = format!("Bearer made-up-{status}-{i}");
            let request = || {
                req(
                    "POST",
                    "/payments",
                    Some("k"),
                    "a",
                    &[("x-status", status), ("authorization", &bearer)],
                )
            };
            let first = send(&router, request()).await;
            assert_eq!(first.status.as_str(), status);
            let retry = send(&router, request()).await;
            assert!(!retry.replayed(), "{}: {status} was stored", h.name);
        }
    }
    assert_eq!(state.runs(), 2 * 20 * 2);
}

/// The flood of the issue that found it: a store bounded to 8 keys, 100
/// POSTs with made-up credentials answered 401, each its own scope: a
/// genuine new caller is still served, not told the store is full.
#[tokio::test]
async fn made_up_credentials_cannot_fill_the_store() {
    use std::num::NonZeroUsize;
    use tower_idempotency::{IdempotencyLayer, MemoryStore};
    let store = MemoryStore::new().max_keys(NonZeroUsize::new(8).unwrap());
    let (router, state) = app(IdempotencyLayer::new(store));
    for i in 0..100 {
        let bearer = format!("Bearer made-up-{i}");
        let key = format!("k{i}");
        let headers = [("x-status", "401"), ("authorization", bearer.as_str())];
        let r = send(&router, req("POST", "/payments", Some(&key), "a", &headers)).await;
        assert_eq!(r.status.as_u16(), 401);
    }
    let genuine = [("authorization", "Bearer genuine")];
    let r = send(
        &router,
        req("POST", "/payments", Some("pay-1"), "a", &genuine),
    )
    .await;
    assert_eq!(r.status.as_u16(), 201, "a genuine caller was locked out");
    assert_eq!(state.runs(), 101);
}
