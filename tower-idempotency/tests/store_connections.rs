//! The store's statements and the transactional mode's transactions run
//! on the main pool by default, or, opted into with `store_connections`,
//! on a pool of the store's own, without sqlx's pings, on connections the
//! store keeps between statements: the main pool's hooks still apply to
//! them, and a connection the server closed fails no request that the
//! ping would have saved.
mod support;

use std::str::FromStr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::Executor;
use support::{app, database_url, post, send, unique};
use tower_idempotency::{IdempotencyLayer, PostgresStore};

/// A pool of `options` whose connections carry the application name
/// `name`, so that a test can find (and end) them.
async fn pool_named(name: &str, options: PgPoolOptions) -> PgPool {
    let connect = PgConnectOptions::from_str(&database_url())
        .unwrap()
        .application_name(name);
    options
        .acquire_timeout(Duration::from_secs(5))
        .connect_with(connect)
        .await
        .unwrap()
}

/// A plain pool for the test's own statements.
async fn admin() -> PgPool {
    pool_named("tower_idem_admin", PgPoolOptions::new().max_connections(1)).await
}

/// Ends every session named `name`, and waits until they are gone; how
/// many there were.
async fn terminate(name: &str) -> usize {
    let admin = admin().await;
    // The sessions first, then each one ended: only those.
    let pids: Vec<i32> =
        sqlx::query_scalar("SELECT pid FROM pg_stat_activity WHERE application_name = $1")
            .bind(name)
            .fetch_all(&admin)
            .await
            .unwrap();
    for pid in &pids {
        sqlx::query("SELECT pg_terminate_backend($1, 5000)")
            .bind(pid)
            .execute(&admin)
            .await
            .unwrap();
    }
    pids.len()
}

/// A first request, and its replay, through `layer`: both answered.
async fn first_and_replay(layer: IdempotencyLayer, key: &str) {
    let (router, _) = app(layer);
    let first = send(&router, post(key, "a")).await;
    assert_eq!(first.status, StatusCode::CREATED, "{:?}", first.body);
    let replay = send(&router, post(key, "a")).await;
    assert!(replay.replayed(), "{replay:?}");
}

fn transactional(store: &PostgresStore) -> IdempotencyLayer {
    IdempotencyLayer::transactional(store.clone())
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_search_path_set_in_after_connect_reaches_the_stores_connections() {
    let schema = unique("tower_idem_sp_");
    let admin = admin().await;
    admin
        .execute(format!("CREATE SCHEMA {schema}").as_str())
        .await
        .unwrap();
    let set_path = format!("SET search_path TO {schema}");
    let options = PgPoolOptions::new()
        .max_connections(2)
        .after_connect(move |conn, _| {
            let set_path = set_path.clone();
            Box::pin(async move {
                conn.execute(set_path.as_str()).await?;
                Ok(())
            })
        });
    let pool = pool_named(&unique("tower_idem_sp_"), options).await;
    // A table that only the search path finds.
    let store = PostgresStore::new(pool)
        .with_table("tower_idem_sp_keys")
        .unwrap();
    store.migrate().await.unwrap();
    first_and_replay(IdempotencyLayer::new(store.clone()), "two-phase").await;
    first_and_replay(transactional(&store), "transactional").await;
    admin
        .execute(format!("DROP SCHEMA {schema} CASCADE").as_str())
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn before_acquire_runs_on_the_transactional_modes_connections() {
    let checks = Arc::new(AtomicUsize::new(0));
    let counted = checks.clone();
    // One connection: the second request takes the first one's back.
    let options = PgPoolOptions::new()
        .max_connections(1)
        .before_acquire(move |_, _| {
            counted.fetch_add(1, Ordering::SeqCst);
            Box::pin(async { Ok(true) })
        });
    let pool = pool_named(&unique("tower_idem_ba_"), options).await;
    let table = unique("tower_idem_ba_");
    let store = PostgresStore::new(pool).with_table(&table).unwrap();
    store.migrate().await.unwrap();
    let before = checks.load(Ordering::SeqCst);
    first_and_replay(transactional(&store), "k").await;
    assert!(checks.load(Ordering::SeqCst) > before);
    store
        .pool()
        .execute(format!("DROP TABLE {table}").as_str())
        .await
        .unwrap();
}

/// A store whose connections are named `name`, on a table of its own,
/// with a store pool of 2 that keeps its connections.
async fn named_store(name: &str) -> PostgresStore {
    let pool = pool_named(name, PgPoolOptions::new().max_connections(2)).await;
    let store = PostgresStore::new(pool)
        .store_connections(2)
        .with_table(&unique("tower_idem_cl_"))
        .unwrap();
    store.migrate().await.unwrap();
    store
}

/// Drops the table of a store made by [`named_store`].
async fn drop_table(store: &PostgresStore) {
    store
        .pool()
        .execute(format!("DROP TABLE {}", store.table()).as_str())
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_connection_the_server_closed_fails_no_request() {
    let name = unique("tower_idem_cl_");
    let store = named_store(&name).await;
    let (router, _) = app(IdempotencyLayer::new(store.clone()));
    assert_eq!(send(&router, post("a", "1")).await.status, 201);
    // The store keeps its connection; the server ends it.
    assert!(terminate(&name).await > 0);
    // A claim, a completion, then a lookup: each finds its connection
    // closed at most once and goes on on another.
    assert_eq!(send(&router, post("b", "1")).await.status, 201);
    assert!(terminate(&name).await > 0);
    assert!(send(&router, post("a", "1")).await.replayed());
    drop_table(&store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_begun_on_a_closed_connection_fails_no_request() {
    let name = unique("tower_idem_cl_");
    let store = named_store(&name).await;
    let (router, _) = app(transactional(&store));
    assert_eq!(send(&router, post("a", "1")).await.status, 201);
    assert!(terminate(&name).await > 0);
    assert_eq!(send(&router, post("b", "1")).await.status, 201);
    assert!(send(&router, post("a", "1")).await.replayed());
    drop_table(&store).await;
}

/// The connections a store keeps are closed, not given back (which needs
/// a runtime), when the store outlives its runtime.
#[test]
fn a_store_dropped_after_its_runtime_closes_its_connections() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let name = unique("tower_idem_cl_");
    let store = runtime.block_on(async {
        let store = named_store(&name).await;
        let (router, _) = app(IdempotencyLayer::new(store.clone()));
        assert_eq!(send(&router, post("a", "1")).await.status, 201);
        drop_table(&store).await;
        store
    });
    drop(runtime);
    drop(store);
}
