//! PostgreSQL's transactional mode: claim, the handler's writes and the
//! stored response commit in one transaction, or nothing does.
mod support;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post as post_route;
use axum::{Extension, Router};
use support::{post, req, send, spawn_waiting, Harness, PanickingBody};
use tokio::sync::Notify;
use tower_idempotency::{IdempotencyLayer, IdempotencyTransaction, PostgresStore};

#[derive(Clone)]
struct App {
    effects: Arc<String>,
    /// The store's table.
    keys: Arc<String>,
    started: Arc<Notify>,
    proceed: Arc<Notify>,
}

/// Writes one effect row through the request's transaction, then answers as
/// the request headers say (`x-status`, `x-panic`, `x-body-panic`, `x-size`,
/// `x-wait`; `x-steal`: gives the key another lease through the transaction).
async fn pay(
    State(app): State<App>,
    Extension(tx): Extension<IdempotencyTransaction>,
    headers: HeaderMap,
    body: String,
) -> Response {
    {
        let mut conn = tx.lock().await.unwrap();
        sqlx::query(&format!("INSERT INTO {} (note) VALUES ($1)", app.effects))
            .bind(&body)
            .execute(&mut **conn)
            .await
            .unwrap();
        if headers.contains_key("x-steal") {
            let steal = format!("UPDATE {} SET lock_token = gen_random_uuid()", app.keys);
            sqlx::query(&steal).execute(&mut **conn).await.unwrap();
        }
    }
    let get = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if get("x-wait").is_some() {
        let proceed = app.proceed.notified();
        app.started.notify_one();
        proceed.await;
    }
    if get("x-panic").is_some() {
        panic!("handler panicked on purpose");
    }
    if get("x-body-panic").is_some() {
        return Response::new(axum::body::Body::new(PanickingBody { on_drop: true }));
    }
    let status = get("x-status")
        .and_then(|v| v.parse().ok())
        .and_then(|v| StatusCode::from_u16(v).ok())
        .unwrap_or(StatusCode::CREATED);
    let size = get("x-size").and_then(|v| v.parse().ok()).unwrap_or(0);
    (status, format!("paid {body}{}", "x".repeat(size))).into_response()
}

struct Setup {
    h: Harness,
    pg: PostgresStore,
    router: Router,
    app: App,
}

impl Setup {
    async fn new() -> Self {
        Self::with_max_body(1000).await
    }

    async fn with_max_body(max_response_body_bytes: usize) -> Self {
        let h = Harness::postgres().await;
        let pg = h.pg.clone().unwrap();
        let effects = support::unique("tower_idem_effects_");
        sqlx::query(&format!(
            "CREATE TABLE {effects} (id bigserial PRIMARY KEY, note text NOT NULL)"
        ))
        .execute(pg.pool())
        .await
        .unwrap();
        let app = App {
            effects: Arc::new(effects),
            keys: Arc::new(pg.table().to_owned()),
            started: Arc::new(Notify::new()),
            proceed: Arc::new(Notify::new()),
        };
        let layer = IdempotencyLayer::transactional(pg.clone())
            .max_response_body_bytes(max_response_body_bytes)
            .build()
            .unwrap();
        let router = Router::new()
            .route("/payments", post_route(pay))
            .with_state(app.clone())
            .layer(layer);
        Self { h, pg, router, app }
    }

    async fn count(&self, table: &str) -> i64 {
        sqlx::query_scalar(&format!("SELECT count(*) FROM {table}"))
            .fetch_one(self.pg.pool())
            .await
            .unwrap()
    }

    async fn effects(&self) -> i64 {
        self.count(&self.app.effects).await
    }

    async fn done(self) {
        sqlx::query(&format!("DROP TABLE {}", self.app.effects))
            .execute(self.pg.pool())
            .await
            .unwrap();
        self.h.cleanup().run().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn claim_effect_and_response_commit_together() {
    let s = Setup::new().await;
    let started = s.app.started.notified();
    let first = spawn_waiting(&s.router, "k", "10");
    started.await;
    // While the handler runs, neither its claim nor its effect is visible:
    // they are in one uncommitted transaction.
    assert_eq!(s.count(s.pg.table()).await, 0);
    assert_eq!(s.effects().await, 0);
    s.app.proceed.notify_one();
    let first = first.await.unwrap();
    assert_eq!(first.status, 201);
    assert_eq!(s.count(s.pg.table()).await, 1);
    assert_eq!(s.effects().await, 1);
    let replay = send(&s.router, post("k", "10")).await;
    assert!(replay.replayed());
    assert_eq!(replay.body, first.body);
    assert_eq!(s.effects().await, 1);
    s.done().await;
}

/// A response too large to be written into the query that stores it
/// together with the `COMMIT` (over 16 KiB) is stored with bind parameters,
/// then committed: the same one commit, the same replay.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_large_response_commits_with_its_effect_and_replays() {
    let s = Setup::with_max_body(64 * 1024).await;
    let size = 20_000.to_string();
    let first = send(
        &s.router,
        req("POST", "/payments", Some("big"), "7", &[("x-size", &size)]),
    )
    .await;
    assert_eq!(first.status, 201);
    assert_eq!(first.body.len(), "paid 7".len() + 20_000);
    let replay = send(&s.router, post("big", "7")).await;
    assert!(replay.replayed());
    assert_eq!(replay.body, first.body);
    assert_eq!(s.effects().await, 1);
    s.done().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_duplicates_run_once() {
    let s = Setup::new().await;
    let mut tasks = Vec::new();
    for _ in 0..20 {
        let r = s.router.clone();
        tasks.push(tokio::spawn(
            async move { send(&r, post("dup", "5")).await },
        ));
    }
    let mut bodies = Vec::new();
    for task in tasks {
        let reply = task.await.unwrap();
        match reply.status.as_u16() {
            201 => bodies.push(reply.body),
            409 => {}
            other => panic!("unexpected {other}: {:?}", reply.body),
        }
    }
    assert!(!bodies.is_empty());
    assert!(bodies.iter().all(|b| *b == bodies[0]));
    assert_eq!(s.effects().await, 1, "a duplicate ran twice");
    s.done().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn failures_roll_everything_back() {
    let s = Setup::new().await;
    // A panic after the write: nothing committed, the key is free.
    let crashed = send(
        &s.router,
        req("POST", "/payments", Some("p"), "1", &[("x-panic", "1")]),
    )
    .await;
    crashed.assert_problem(500);
    assert_eq!(s.effects().await, 0);
    // A release status after the write: rolled back too.
    let invalid = send(
        &s.router,
        req("POST", "/payments", Some("p"), "1", &[("x-status", "422")]),
    )
    .await;
    assert_eq!(invalid.status, 422);
    assert_eq!(s.effects().await, 0);
    // A response body that panics (and panics again when dropped, which
    // must not abort the server): answered like the handler's panic.
    let body_crashed = send(
        &s.router,
        req(
            "POST",
            "/payments",
            Some("p"),
            "1",
            &[("x-body-panic", "1")],
        ),
    )
    .await;
    let doc = body_crashed.assert_problem(500);
    assert!(doc["detail"].as_str().unwrap().contains("body panicked"));
    assert_eq!(s.effects().await, 0);
    // A response too large to keep: rolled back, nothing happened.
    let big = send(
        &s.router,
        req("POST", "/payments", Some("p"), "1", &[("x-size", "2000")]),
    )
    .await;
    big.assert_problem(500);
    assert_eq!(s.effects().await, 0);
    // The same key finally succeeds, once.
    assert_eq!(send(&s.router, post("p", "1")).await.status, 201);
    assert!(send(&s.router, post("p", "1")).await.replayed());
    assert_eq!(s.effects().await, 1);
    // A 5xx is stored with its effect, as in the two-phase mode.
    let failed = send(
        &s.router,
        req("POST", "/payments", Some("q"), "2", &[("x-status", "503")]),
    )
    .await;
    assert_eq!(failed.status, 503);
    let again = send(&s.router, post("q", "2")).await;
    assert!(again.replayed());
    assert_eq!(s.effects().await, 2);
    s.done().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dropped_request_rolls_back_and_its_retry_runs_once() {
    let s = Setup::new().await;
    let started = s.app.started.notified();
    // The handler writes its effect, then waits; the client goes away
    // meanwhile (hyper drops the response future: here, the task's).
    let first = spawn_waiting(&s.router, "gone", "7");
    started.await;
    first.abort();
    assert!(first.await.unwrap_err().is_cancelled());
    // The retry waits for the rollback on the claim row's lock, then runs:
    // nothing of the dropped request was committed.
    let retry = send(&s.router, post("gone", "7")).await;
    assert_eq!(retry.status, 201);
    assert!(!retry.replayed());
    assert_eq!(s.effects().await, 1);
    assert!(send(&s.router, post("gone", "7")).await.replayed());
    assert_eq!(
        s.effects().await,
        1,
        "the dropped request and its retry both committed"
    );
    s.done().await;
}

/// Duplicates of one slow key wait on its claim row for at most a second,
/// then answer 409 and give their pooled connections back: a retry storm
/// on one slow key cannot hold the pool for the slow request's duration.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn duplicates_of_a_slow_key_do_not_hold_the_pool() {
    let s = Setup::new().await;
    let started = s.app.started.notified();
    let slow = spawn_waiting(&s.router, "slow", "1");
    started.await;
    let mut duplicates = Vec::new();
    for _ in 0..2 {
        let r = s.router.clone();
        duplicates.push(tokio::spawn(
            async move { send(&r, post("slow", "1")).await },
        ));
    }
    // Answered while the slow request still runs (it waits for `proceed`):
    // before, they waited on its row lock until it committed.
    for duplicate in duplicates {
        let reply = tokio::time::timeout(std::time::Duration::from_secs(20), duplicate)
            .await
            .expect("a duplicate waited for the slow request to finish")
            .unwrap();
        reply.assert_problem(409);
    }
    s.app.proceed.notify_one();
    assert_eq!(slow.await.unwrap().status, 201);
    assert!(send(&s.router, post("slow", "1")).await.replayed());
    assert_eq!(s.effects().await, 1);
    s.done().await;
}

/// A key left in progress by a dead two-phase owner (a route moved from
/// the two-phase mode to the transactional one, sharing the table) is
/// taken over by transactional retries too: the stale mark is written
/// outside the retry's rolled-back transaction, so it persists.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dead_two_phase_owner_is_taken_over_by_transactional_retries() {
    let s = Setup::new().await;
    let mut dead = support::Faulty::new(s.h.store.clone());
    dead.no_heartbeat = true;
    let two_phase = IdempotencyLayer::builder(dead).build().unwrap();
    let (router_a, state_a) = support::app(two_phase);
    let started = state_a.started.notified();
    let _stuck = spawn_waiting(&router_a, "k", "7");
    started.await;
    s.h.advance(std::time::Duration::from_secs(6)).await;
    // The first transactional retry finds the lease stale and marks it.
    send(&s.router, post("k", "7")).await.assert_problem(409);
    let marked: bool = sqlx::query_scalar(&format!(
        "SELECT stale_seen_at IS NOT NULL FROM {} WHERE key = 'k'",
        s.pg.table()
    ))
    .fetch_one(s.pg.pool())
    .await
    .unwrap();
    assert!(
        marked,
        "the stale mark was rolled back with the retry's transaction"
    );
    // A lock timeout later, with no heartbeat since, one takes it over.
    s.h.advance(std::time::Duration::from_secs(6)).await;
    let taken = send(&s.router, post("k", "7")).await;
    assert_eq!(taken.status, 201, "{:?}", taken.body);
    assert_eq!(s.effects().await, 1);
    state_a.proceed.notify_one();
    s.done().await;
}

/// A completion that finds its lease gone inside the request's own
/// transaction (only the handler's statements can do that, on the claim
/// row the transaction holds) commits nothing: it is sent together with
/// the commit, which must not run.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_completion_finding_its_lease_gone_commits_nothing() {
    let s = Setup::new().await;
    let request = req("POST", "/payments", Some("k"), "10", &[("x-steal", "1")]);
    let reply = send(&s.router, request).await;
    assert_eq!(reply.status, 500);
    assert_eq!(s.effects().await, 0);
    assert_eq!(s.count(s.pg.table()).await, 0);
    s.done().await;
}
