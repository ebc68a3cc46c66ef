//! A `statement_timeout` set by the role (common on OLTP roles) shorter
//! than the transactional mode's wait on a running request's claim row:
//! the duplicate is told the request is in progress (409 + Retry-After),
//! never that the store is unavailable.
mod pg_fleet;
mod support;

use pg_fleet::{app_pool, role, store_on};
use support::{app, post, send, spawn_waiting};
use tower_idempotency::IdempotencyLayer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_roles_statement_timeout_leaves_a_duplicate_in_progress() {
    let url = role(
        "tower_idem_short_statements",
        "",
        &["SET statement_timeout = '300ms'"],
    )
    .await;
    let store = store_on(app_pool(&url, 4).await).await;
    let layer = IdempotencyLayer::transactional(store.clone())
        .build()
        .unwrap();
    let (router, state) = app(layer);
    let started = state.started.notified();
    let first = spawn_waiting(&router, "k", "a");
    started.await;
    // The duplicate waits on the claim row, which the first request's
    // transaction holds, longer than the role lets a statement run.
    let duplicate = send(&router, post("k", "a")).await;
    duplicate.assert_problem(409);
    assert!(duplicate.headers.contains_key("retry-after"));
    state.proceed.notify_one();
    assert_eq!(first.await.unwrap().status, 201);
    assert!(send(&router, post("k", "a")).await.replayed());
    let drop = format!("DROP TABLE {}", store.table());
    sqlx::raw_sql(&drop).execute(store.pool()).await.unwrap();
}
