//! Behind PgBouncer in transaction mode (the mode many fleets run): the
//! store's statements are ones a transaction-mode pooler can carry (no
//! prepared statement outlives its transaction), every mode answers and
//! replays, and no server connection stays pinned after its work.
mod pg_fleet;
mod support;

use std::time::Duration;

use axum::http::StatusCode;
use axum::routing::post as post_route;
use axum::{Extension, Router};
use pg_fleet::{app_pool, opens_transactions, store_on, Payments, PgBouncer};
use support::{app, post, send};
use tower_idempotency::{IdempotencyLayer, IdempotencyTransaction, PostgresStore};

/// The pooler's server connections.
const SERVERS: u32 = 4;

/// An upper bound on what each step waits for, not a timing check.
const WITHIN: Duration = Duration::from_secs(20);

/// `n` first requests at once through `router`, then their replays: all
/// created, then all replayed.
async fn first_and_replays(router: &Router, n: usize) {
    let firsts: Vec<_> = (0..n)
        .map(|i| {
            let router = router.clone();
            tokio::spawn(async move { send(&router, post(&format!("k{i}"), "a")).await })
        })
        .collect();
    let all = async {
        for first in firsts {
            let first = first.await.unwrap();
            assert_eq!(first.status, StatusCode::CREATED, "{:?}", first.body);
        }
        for i in 0..n {
            let replay = send(router, post(&format!("k{i}"), "a")).await;
            assert!(replay.replayed(), "k{i}: {replay:?}");
        }
    };
    tokio::time::timeout(WITHIN, all).await.expect("answered");
}

/// The transactional mode's handler: a payment written through the
/// request's transaction, unprepared (`persistent(false)`).
async fn pay_in_tx(
    Extension(store): Extension<PostgresStore>,
    Extension(tx): Extension<IdempotencyTransaction>,
) -> (StatusCode, String) {
    let Ok(mut guard) = tx.lock().await else {
        return (StatusCode::INTERNAL_SERVER_ERROR, "no transaction".into());
    };
    let insert = format!("INSERT INTO {}_paid (note) VALUES ('x')", store.table());
    match sqlx::query(&insert)
        .persistent(false)
        .execute(&mut **guard)
        .await
    {
        Ok(_) => (StatusCode::CREATED, "paid".into()),
        Err(err) => (StatusCode::INTERNAL_SERVER_ERROR, err.to_string()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_pgbouncer_in_transaction_mode_every_mode_answers_and_replays() {
    let bouncer = PgBouncer::start("transaction", SERVERS);
    // More clients than servers: what transaction pooling is for.
    let store = store_on(app_pool(&bouncer.url(), 2 * SERVERS).await).await;

    // Two-phase, the layer completing.
    let (router, _) = app(IdempotencyLayer::new(store.clone()));
    first_and_replays(&router, 8).await;

    // Two-phase, the handler completing with `commit_completed`.
    let payments = Payments::new(&store, Duration::ZERO).await;
    assert_eq!(payments.run(8, 2, WITHIN).await, 16);

    // Transactional.
    let tx_store = store_on(store.pool().clone()).await;
    let paid = format!("CREATE TABLE {}_paid (note text)", tx_store.table());
    sqlx::raw_sql(&paid).execute(store.pool()).await.unwrap();
    let router = Router::new()
        .route("/payments", post_route(pay_in_tx))
        .layer(
            IdempotencyLayer::transactional(tx_store.clone())
                .build()
                .unwrap(),
        )
        .layer(Extension(tx_store.clone()));
    first_and_replays(&router, 8).await;

    // No server connection is left pinned: another client opens as many
    // transactions as the pooler has servers.
    let other = app_pool(&bouncer.url(), SERVERS).await;
    assert!(
        opens_transactions(&other, SERVERS, WITHIN).await,
        "a server connection stayed pinned: {}",
        bouncer.log()
    );
    let drop = format!("DROP TABLE {t}_paid, {t}", t = tx_store.table());
    sqlx::raw_sql(&drop).execute(&other).await.unwrap();
    assert_eq!(payments.finish().await, 16);
}
