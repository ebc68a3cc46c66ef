//! PostgreSQL: a handler completes its key inside its own transaction.
mod support;
use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post as post_route;
use axum::{Extension, Router};
use sqlx::{Postgres, Transaction};
use support::{post, send, Harness};
use tower_idempotency::{IdempotencyContext, PostgresStore, StoredResponse};

#[derive(Clone)]
struct AppState {
    store: PostgresStore,
    /// The effects table, this test's own.
    table: Arc<String>,
    /// What each `commit_completed` of `commit_then_503` said.
    said: Arc<std::sync::Mutex<Vec<String>>>,
}

impl AppState {
    /// The harness's store and an effects table of its own.
    async fn new(h: &Harness) -> Self {
        let store = h.pg.clone().unwrap();
        let table = format!("tower_idem_effects_{}", uuid::Uuid::new_v4().simple());
        sqlx::query(&format!(
            "CREATE TABLE {table} (id bigserial PRIMARY KEY, note text NOT NULL)"
        ))
        .execute(store.pool())
        .await
        .unwrap();
        Self {
            store,
            table: Arc::new(table),
            said: Arc::default(),
        }
    }

    /// A transaction of the pool with the effect `note` written in it.
    async fn begin_with_effect(&self, note: &str) -> Transaction<'static, Postgres> {
        let mut tx = self.store.pool().begin().await.unwrap();
        sqlx::query(&format!("INSERT INTO {} (note) VALUES ($1)", self.table))
            .bind(note)
            .execute(&mut *tx)
            .await
            .unwrap();
        tx
    }

    /// The effects committed; drops the table.
    async fn effects(&self) -> i64 {
        let sql = format!("SELECT count(*) FROM {}", self.table);
        let count = sqlx::query_scalar(&sql)
            .fetch_one(self.store.pool())
            .await
            .unwrap();
        sqlx::query(&format!("DROP TABLE {}", self.table))
            .execute(self.store.pool())
            .await
            .unwrap();
        count
    }
}

async fn create(
    State(state): State<AppState>,
    Extension(ctx): Extension<IdempotencyContext>,
    body: String,
) -> (StatusCode, String) {
    let mut tx = state.begin_with_effect(&body).await;
    let stored = StoredResponse::json(201, format!("{{\"stored\":\"in-tx\",\"note\":{body:?}}}"));
    assert!(state
        .store
        .complete_in_tx(&mut tx, &ctx, &stored)
        .await
        .unwrap());
    if body == "rollback" {
        tx.rollback().await.unwrap();
        return (StatusCode::SERVICE_UNAVAILABLE, "rolled back".into());
    }
    tx.commit().await.unwrap();
    // Returned body differs from the stored one, to prove the layer did not
    // store the response a second time.
    (StatusCode::CREATED, "from-handler".into())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handler_completes_key_in_its_transaction() {
    let h = Harness::postgres().await;
    let cleanup = h.cleanup();
    let state = AppState::new(&h).await;
    let router = Router::new()
        .route("/payments", post_route(create))
        .with_state(state.clone())
        // This handler answers 503 only after rolling back: no effect, so
        // its 503 may free the key (by default a 503 is stored).
        .layer(
            h.builder()
                .release_statuses([StatusCode::SERVICE_UNAVAILABLE])
                .build()
                .unwrap(),
        );

    let first = send(&router, post("k", "pay")).await;
    assert_eq!(first.status, 201);
    assert_eq!(first.body, "from-handler");
    let replay = send(&router, post("k", "pay")).await;
    assert!(replay.replayed());
    assert_eq!(replay.status, 201);
    assert_eq!(replay.headers["content-type"], "application/json");
    assert_eq!(replay.json()["stored"], "in-tx");

    // A rolled-back transaction leaves neither effect nor stored response,
    // and the configured release status frees the key.
    let rolled = send(&router, post("r", "rollback")).await;
    assert_eq!(rolled.status, 503);
    let rolled_again = send(&router, post("r", "rollback")).await;
    assert!(!rolled_again.replayed());

    assert_eq!(state.effects().await, 1, "exactly one effect committed");
    cleanup.run().await;
}

/// Inserts the effect and completes the key in one transaction of the
/// handler's own, committed by `commit_completed`.
async fn create_and_commit(
    State(state): State<AppState>,
    Extension(ctx): Extension<IdempotencyContext>,
    body: String,
) -> (StatusCode, String) {
    let tx = state.begin_with_effect(&body).await;
    let stored = StoredResponse::json(201, format!("{{\"stored\":\"in-tx\",\"note\":{body:?}}}"));
    let committed = state.store.commit_completed(tx, &ctx, &stored).await;
    assert!(committed.unwrap(), "the lease is current");
    (StatusCode::CREATED, "from-handler".into())
}

/// A handler that commits its completion with `commit_completed` leaves
/// the layer nothing to store: no completion of its own reaches the store
/// (one statement and one pooled connection fewer per request); after
/// `complete_in_tx` and a commit of the handler's own, the layer asks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_committed_completion_leaves_the_layer_nothing_to_store() {
    let h = Harness::postgres().await;
    let cleanup = h.cleanup();
    let state = AppState::new(&h).await;
    let (layer, watched) = h.watched_layer();
    let router = Router::new()
        .route("/payments", post_route(create_and_commit))
        .route("/payments/own-commit", post_route(create))
        .with_state(state.clone())
        .layer(layer);

    let first = send(&router, post("k", "pay")).await;
    assert_eq!(first.status, 201);
    assert_eq!(first.body, "from-handler");
    let completes = || watched.completes.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(completes(), 0, "the layer stored the response again");
    let replay = send(&router, post("k", "pay")).await;
    assert!(replay.replayed());
    assert_eq!(replay.json()["stored"], "in-tx");

    let own = support::req("POST", "/payments/own-commit", Some("o"), "own", &[]);
    assert_eq!(send(&router, own).await.status, 201);
    assert_eq!(
        completes(),
        1,
        "after a commit of the handler's own, the layer asks"
    );

    assert_eq!(state.effects().await, 2, "one effect per key");
    cleanup.run().await;
}

/// Inserts its effect and commits its completion, then answers 503 (a
/// status the layer is set to release) unless told the commit failed.
async fn commit_then_503(
    State(state): State<AppState>,
    Extension(ctx): Extension<IdempotencyContext>,
    body: String,
) -> (StatusCode, String) {
    let tx = state.begin_with_effect(&body).await;
    let stored = StoredResponse::json(201, r#"{"stored":"in-tx"}"#);
    let said = match state.store.commit_completed(tx, &ctx, &stored).await {
        Ok(committed) => format!("committed: {committed}"),
        Err(err) => format!("error: {err}"),
    };
    state.said.lock().unwrap().push(said);
    (StatusCode::SERVICE_UNAVAILABLE, "after the commit".into())
}

/// A status the layer releases, answered after the completion committed,
/// frees nothing: the committed response is what retries get, and the
/// effect happened once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_status_after_a_committed_completion_frees_nothing() {
    let h = Harness::postgres().await;
    let cleanup = h.cleanup();
    let state = AppState::new(&h).await;
    let layer = h
        .builder()
        .release_statuses([StatusCode::SERVICE_UNAVAILABLE])
        .build()
        .unwrap();
    let router = Router::new()
        .route("/payments", post_route(commit_then_503))
        .with_state(state.clone())
        .layer(layer);
    assert_eq!(send(&router, post("k", "pay")).await.status, 503);
    let replay = send(&router, post("k", "pay")).await;
    assert!(replay.replayed(), "{} {:?}", replay.status, replay.body);
    assert_eq!(replay.json()["stored"], "in-tx");
    assert_eq!(*state.said.lock().unwrap(), ["committed: true"]);
    assert_eq!(state.effects().await, 1);
    cleanup.run().await;
}

/// In the transactional mode the layer completes the key and commits: a
/// handler completing it in a transaction of its own is told so at once
/// (it would not see the uncommitted claim, or would wait on its lock).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_transactional_mode_refuses_a_completion_by_the_handler() {
    let h = Harness::postgres().await;
    let cleanup = h.cleanup();
    let state = AppState::new(&h).await;
    let layer = tower_idempotency::IdempotencyLayer::transactional(state.store.clone())
        .build()
        .unwrap();
    let router = Router::new()
        .route("/payments", post_route(commit_then_503))
        .with_state(state.clone())
        .layer(layer);
    send(&router, post("k", "pay")).await;
    let said = state.said.lock().unwrap().clone();
    assert_eq!(said.len(), 1);
    assert!(said[0].contains("transactional mode"), "{said:?}");
    // Its own transaction was dropped: no effect committed.
    assert_eq!(state.effects().await, 0);
    cleanup.run().await;
}

/// Inserts its effect, then (standing in for a takeover after the lock
/// timeout) gives the key another lease, then commits its completion.
async fn taken_over_then_commit(
    State(state): State<AppState>,
    Extension(ctx): Extension<IdempotencyContext>,
    body: String,
) -> (StatusCode, String) {
    let tx = state.begin_with_effect(&body).await;
    let table = state.store.table().to_owned();
    sqlx::query(&format!(
        "UPDATE {table} SET lock_token = gen_random_uuid() WHERE key = $1"
    ))
    .bind(ctx.key())
    .execute(state.store.pool())
    .await
    .unwrap();
    let stored = StoredResponse::json(201, r#"{"stored":"in-tx"}"#);
    let said = match state.store.commit_completed(tx, &ctx, &stored).await {
        Ok(committed) => format!("committed: {committed}"),
        Err(err) => format!("error: {err}"),
    };
    state.said.lock().unwrap().push(said);
    (StatusCode::CONFLICT, "taken over".into())
}

/// `commit_completed` on a lease taken over commits nothing: neither the
/// effect written before it nor the response (the completion and the
/// commit go to the server together, and the commit must not run).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_on_a_lease_taken_over_commits_nothing() {
    let h = Harness::postgres().await;
    let cleanup = h.cleanup();
    let state = AppState::new(&h).await;
    let router = Router::new()
        .route("/payments", post_route(taken_over_then_commit))
        .with_state(state.clone())
        .layer(h.layer());
    send(&router, post("k", "pay")).await;
    assert_eq!(*state.said.lock().unwrap(), ["committed: false"]);
    let status: String = sqlx::query_scalar(&format!(
        "SELECT status FROM {} WHERE key = 'k'",
        state.store.table()
    ))
    .fetch_one(state.store.pool())
    .await
    .unwrap();
    assert_eq!(status, "in_progress", "no response was stored");
    assert_eq!(state.effects().await, 0, "the effect was rolled back");
    cleanup.run().await;
}
