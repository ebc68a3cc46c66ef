//! PostgreSQL sweeps expired records in bounded batches, and by itself:
//! a table with many expired rows shrinks under a short
//! `statement_timeout`, and no application has to remember a sweeper.
mod support;

use std::time::Duration;

use support::{database_url, pg_store, unique};
use tower_idempotency::{IdempotencyStore, PostgresStore};

/// Inserts `n` expired completed rows.
async fn expired_rows(store: &PostgresStore, n: i64) {
    sqlx::query(&format!(
        "INSERT INTO {} (scope, key, request_fingerprint, status, response_code, created_at, \
         expires_at) SELECT 's', 'k' || i, '\\x00', 'completed', 201, now() - interval '2 days', \
         now() - interval '1 day' FROM generate_series(1, $1) AS i",
        store.table()
    ))
    .bind(n)
    .execute(store.pool())
    .await
    .unwrap();
}

async fn rows(store: &PostgresStore) -> i64 {
    sqlx::query_scalar(&format!("SELECT count(*) FROM {}", store.table()))
        .fetch_one(store.pool())
        .await
        .unwrap()
}

async fn drop_table(store: &PostgresStore) {
    sqlx::query(&format!("DROP TABLE IF EXISTS {}", store.table()))
        .execute(store.pool())
        .await
        .unwrap();
}

/// A store whose connections run every statement under `timeout_ms`.
async fn with_statement_timeout(table: &str, timeout_ms: u32) -> PostgresStore {
    with_setting(table, "statement_timeout", timeout_ms).await
}

/// A store whose connections set `setting` to `ms` milliseconds.
async fn with_setting(table: &str, setting: &str, ms: u32) -> PostgresStore {
    let url = database_url();
    let sep = if url.contains('?') { '&' } else { '?' };
    let url = format!("{url}{sep}options=-c%20{setting}%3D{ms}");
    PostgresStore::connect_with_pool_size(&url, 2)
        .await
        .unwrap()
        .with_table(table)
        .unwrap()
        .sweep_every(None)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_rows_are_swept_in_batches() {
    let table = unique("tis_");
    let setup = pg_store(&table).await;
    expired_rows(&setup, 12_345).await;
    // 12 345 rows in three batches: 5 000, 5 000, 2 345.
    let store = with_statement_timeout(&table, 2_000).await;
    assert_eq!(store.sweep_expired().await.unwrap(), 12_345);
    assert_eq!(rows(&setup).await, 0);
    drop_table(&setup).await;
}

/// A sweep skips the rows another transaction holds (a replica sweeping
/// at the same time, the transactional mode's open request) instead of
/// waiting on them: of six expired rows, the four nobody holds go, the
/// completed and the in-progress row a transaction holds stay. The
/// sweeping connections give up a lock wait after 5 s, so a sweep that
/// waited fails with an error instead of hanging the test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sweep_skips_the_rows_others_hold() {
    let table = unique("tis_");
    let setup = pg_store(&table).await;
    expired_rows(&setup, 5).await;
    sqlx::query(&format!(
        "INSERT INTO {} (scope, key, request_fingerprint, status, created_at, locked_at, \
         expires_at, ttl) VALUES ('s', 'running', '\\x00', 'in_progress', \
         now() - interval '2 days', now() - interval '2 days', now() - interval '1 day', \
         interval '1 day')",
        setup.table()
    ))
    .execute(setup.pool())
    .await
    .unwrap();
    let mut holder = setup.pool().begin().await.unwrap();
    sqlx::query(&format!(
        "SELECT 1 FROM {} WHERE key IN ('k1', 'running') FOR UPDATE",
        setup.table()
    ))
    .execute(&mut *holder)
    .await
    .unwrap();

    let store = with_setting(&table, "lock_timeout", 5_000).await;
    let swept = store.sweep_expired().await;
    holder.rollback().await.unwrap();
    assert_eq!(swept.unwrap(), 4, "the sweep waited on a held row");
    assert_eq!(rows(&setup).await, 2);
    drop_table(&setup).await;
}

/// A store left with its defaults sweeps once a sweep is due, started by a
/// claim: no `spawn_sweeper` needed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_sweeps_by_itself() {
    let table = unique("tis_");
    let setup = pg_store(&table).await;
    expired_rows(&setup, 100).await;
    let store = setup.clone().sweep_every(Some(Duration::from_millis(1)));
    let layer_less_claim = tower_idempotency::ClaimRequest {
        scope: "s",
        key: "fresh",
        fingerprint: tower_idempotency::Fingerprint([1; 32]),
        lock_timeout: Duration::from_secs(5),
        ttl: Duration::from_secs(3600),
    };
    // The first sweep is due a millisecond after the store was made.
    tokio::time::sleep(Duration::from_millis(5)).await;
    store.claim(layer_less_claim).await.unwrap();
    // Wait (bounded) for the task the claim started.
    for _ in 0..500 {
        if rows(&setup).await == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(rows(&setup).await, 1, "only the fresh claim is left");
    drop_table(&setup).await;
}

/// The sweeper line: a million expired rows under `statement_timeout =
/// 2s`. Slow (about a minute on a small machine): `cargo test --test sweep
/// -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "inserts and sweeps a million rows; run with --ignored"]
async fn a_million_expired_rows_are_swept_under_a_statement_timeout() {
    let table = unique("tis_");
    let setup = pg_store(&table).await;
    expired_rows(&setup, 1_000_000).await;
    let store = with_statement_timeout(&table, 2_000).await;
    let started = std::time::Instant::now();
    let swept = store.sweep_expired().await.unwrap();
    eprintln!(
        "swept {swept} rows in {:.1} s under statement_timeout = 2s",
        started.elapsed().as_secs_f64()
    );
    assert_eq!(swept, 1_000_000);
    assert_eq!(rows(&setup).await, 0);
    drop_table(&setup).await;
}
