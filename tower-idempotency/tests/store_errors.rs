//! A store error that retrying cannot fix is a 500, never 503 + Retry-After;
//! a store that cannot be reached is a 503 with Retry-After.
mod support;
use std::time::Duration;
use support::{app, post, send, Harness};
use tower_idempotency::{
    ClaimRequest, Fingerprint, IdempotencyLayer, IdempotencyStore, PostgresStore,
};

fn claim<'a>(scope: &'a str, key: &'a str) -> ClaimRequest<'a> {
    ClaimRequest {
        scope,
        key,
        fingerprint: Fingerprint([1; 32]),
        lock_timeout: Duration::from_secs(5),
        ttl: Duration::from_secs(60),
    }
}

#[tokio::test]
async fn oversized_ids_are_a_permanent_error_in_both_stores() {
    let memory = Harness::memory().await;
    let pg = Harness::postgres().await;
    let long = "s".repeat(4000);
    for h in [&memory, &pg] {
        let err = h.store.claim(claim(&long, "k")).await.unwrap_err();
        assert!(!err.is_transient(), "{}: {err}", h.name);
        assert!(err.to_string().contains("4000 bytes"));
    }
    pg.cleanup().run().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_table_is_500_without_retry_after() {
    let pg = Harness::postgres().await;
    let pool = pg.pg.clone().unwrap().pool().clone();
    // A table that was never migrated: SQLSTATE 42P01, permanent.
    let store = PostgresStore::new(pool)
        .with_table("tower_idem_never_created")
        .unwrap();
    let err = store.claim(claim("s", "k")).await.unwrap_err();
    assert!(!err.is_transient(), "{err}");
    let (router, state) = app(IdempotencyLayer::new(store));
    let reply = send(&router, post("k", "a")).await;
    let doc = reply.assert_problem(500);
    assert_eq!(doc["code"], "store_failed");
    assert!(reply.headers.get("retry-after").is_none());
    assert_eq!(state.runs(), 0);
    pg.cleanup().run().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_store_is_503_with_retry_after() {
    let pg = Harness::postgres().await;
    let store = pg.pg.clone().unwrap();
    pg.cleanup().run().await;
    // The pool is closed: nothing can reach the database (transient).
    store.pool().close().await;
    let err = store.claim(claim("s", "k")).await.unwrap_err();
    assert!(err.is_transient(), "{err}");
    let (router, state) = app(IdempotencyLayer::new(store));
    let reply = send(&router, post("k", "a")).await;
    let doc = reply.assert_problem(503);
    assert_eq!(doc["code"], "store_unavailable");
    assert_eq!(reply.headers["retry-after"], "1");
    assert_eq!(state.runs(), 0);
}
