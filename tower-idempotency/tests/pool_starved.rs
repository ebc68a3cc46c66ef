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
use tower_idempotency::IdempotencyStore;
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

async fn claim_k(store: &PostgresStore) -> tower_idempotency::LeaseToken {
    let outcome = store
        .claim(ClaimRequest {
            scope: "s",
            key: "k",
            fingerprint: Fingerprint([1; 32]),
            lock_timeout: Duration::from_secs(3),
            ttl: Duration::from_secs(3600),
        })
        .await
        .unwrap();
    let ClaimOutcome::Claimed { lease, .. } = outcome else {
        panic!("{outcome:?}")
    };
    lease
}

/// The lease pool is made with the main pool's hooks too: a pool whose
/// `after_connect` sets the `search_path` (the table lives in its own
/// schema) extends leases; one made from the connect options alone could
/// not find the table, and a live handler was taken over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lease_pool_runs_the_main_pools_hooks() {
    use sqlx::Executor;
    let schema = tower_idempotency_test_name("tih_");
    let admin = admin(&format!("CREATE SCHEMA {schema}")).await;
    let path = schema.clone();
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .after_connect(move |conn, _| {
            let path = path.clone();
            Box::pin(async move {
                conn.execute(format!("SET search_path TO {path}").as_str())
                    .await?;
                Ok(())
            })
        })
        .connect(&database_url())
        .await
        .unwrap();
    let store = PostgresStore::new(pool).with_table("idem").unwrap();
    store.migrate().await.unwrap();
    let lease = claim_k(&store).await;
    let extended = store.extend_lease("s", "k", lease).await;
    admin
        .execute(format!("DROP SCHEMA {schema} CASCADE").as_str())
        .await
        .unwrap();
    assert!(extended.unwrap(), "the lease was not extended");
}

/// A server with no connection slot left for the lease pool (a role's
/// connection limit stands in for a full `max_connections`): the extension
/// is made on the main pool's open connections instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extension_the_lease_pool_is_refused_goes_through_the_main_pool() {
    use sqlx::Executor;
    let role = tower_idempotency_test_name("tir_");
    let table = tower_idempotency_test_name("tit_");
    let admin = admin(&format!("CREATE ROLE {role} LOGIN CONNECTION LIMIT 2")).await;
    let setup = PostgresStore::new(admin.clone())
        .with_table(&table)
        .unwrap();
    setup.migrate().await.unwrap();
    admin
        .execute(format!("GRANT ALL ON {table} TO {role}").as_str())
        .await
        .unwrap();
    let options: sqlx::postgres::PgConnectOptions = database_url().parse().unwrap();
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .min_connections(2)
        .connect_with(options.username(&role))
        .await
        .unwrap();
    // Both of the role's slots are the main pool's.
    let (a, b) = (pool.acquire().await.unwrap(), pool.acquire().await.unwrap());
    drop((a, b));
    let store = PostgresStore::new(pool)
        .with_table(&table)
        .unwrap()
        .sweep_every(None);
    let lease = claim_k(&store).await;
    let extended = store.extend_lease("s", "k", lease).await;
    store.pool().close().await;
    admin
        .execute(format!("DROP TABLE {table}").as_str())
        .await
        .unwrap();
    let _ = admin.execute(format!("DROP ROLE {role}").as_str()).await;
    assert!(extended.unwrap(), "the lease was not extended");
}

fn tower_idempotency_test_name(prefix: &str) -> String {
    support::unique(prefix)
}

/// A one-connection pool of the test database's own role, after running
/// `setup` on it.
async fn admin(setup: &str) -> sqlx::PgPool {
    use sqlx::Executor;
    let admin = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(&database_url())
        .await
        .unwrap();
    admin.execute(setup).await.unwrap();
    admin
}
