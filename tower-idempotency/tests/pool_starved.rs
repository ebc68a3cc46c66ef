//! The heartbeat never queues behind the handlers' own connections: a
//! handler holding every connection of the store's pool (the README's
//! `pool().begin()` + `complete_in_tx` pattern, on a pool sized too small)
//! still has its lease extended, so no other replica takes its key over.
mod support;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post as post_route;
use axum::Router;
use support::{database_url, post, send, Faulty, Harness};
use tokio::sync::Notify;
use tower_idempotency::{ClaimOutcome, ClaimRequest, Fingerprint, PostgresStore};

#[derive(Clone)]
struct Starving {
    store: PostgresStore,
    started: Arc<Notify>,
    proceed: Arc<Notify>,
}

/// Holds both connections of the store's pool until told to proceed.
async fn starve(State(app): State<Starving>) -> (StatusCode, &'static str) {
    let first = app.store.pool().begin().await.unwrap();
    let second = app.store.pool().begin().await.unwrap();
    let proceed = app.proceed.notified();
    app.started.notify_one();
    proceed.await;
    drop((first, second));
    (StatusCode::CREATED, "paid")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_handler_holding_the_pool_keeps_its_lease() {
    let h = Harness::postgres().await;
    let cleanup = h.cleanup();
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(Duration::from_secs(30))
        .connect(&database_url())
        .await
        .unwrap();
    let table = h.pg.as_ref().unwrap().table().to_owned();
    let store = PostgresStore::new(pool).with_table(&table).unwrap();
    let faulty = Arc::new(Faulty::new(Arc::new(store.clone())));
    let app = Starving {
        store,
        started: Arc::new(Notify::new()),
        proceed: Arc::new(Notify::new()),
    };
    let layer = h.heartbeat_layer(faulty.clone());
    let router = Router::new()
        .route("/payments", post_route(starve))
        .with_state(app.clone())
        .layer(layer);
    let started = app.started.notified();
    let r = router.clone();
    let running = tokio::spawn(async move { send(&r, post("k", "a")).await });
    started.await;
    let scope = h.stored_scope("");
    for _ in 0..3 {
        // Far past the lock timeout, twice seen by a claim from another
        // replica (its own pool): the lease is extended all the same.
        h.advance(Duration::from_secs(10)).await;
        faulty
            .wait_extends(faulty.extends.load(Ordering::SeqCst), 2)
            .await;
        let other = h
            .store
            .claim(ClaimRequest {
                scope: &scope,
                key: "k",
                fingerprint: Fingerprint([9; 32]),
                lock_timeout: Duration::from_secs(3),
                ttl: Duration::from_secs(3600),
            })
            .await
            .unwrap();
        assert!(
            matches!(other, ClaimOutcome::InProgress { .. }),
            "{other:?}"
        );
        // Extended, not merely tried: the lock is fresh again.
        let fresh: bool = sqlx::query_scalar(&format!(
            "SELECT locked_at > now() - interval '3 seconds' FROM {table} WHERE key = 'k'"
        ))
        .fetch_one(h.pg.as_ref().unwrap().pool())
        .await
        .unwrap();
        assert!(fresh, "the lease was not extended while the pool was held");
    }
    app.proceed.notify_one();
    assert_eq!(running.await.unwrap().status, 201);
    cleanup.run().await;
}
