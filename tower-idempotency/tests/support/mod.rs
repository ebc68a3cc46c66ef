//! Shared helpers for the integration tests: one harness per store, a test
//! application, and request/response helpers.
#![allow(dead_code)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, Request, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing;
use axum::Router;
use http_body_util::BodyExt;
use tokio::sync::Notify;
use tower::ServiceExt;
use tower_idempotency::{
    IdempotencyLayer, IdempotencyStore, ManualClock, MemoryStore, PostgresStore,
};

/// Table shared by the PostgreSQL tests; every test uses its own scopes.
pub const SHARED_TABLE: &str = "tower_idem_test_keys";

/// Runs the given async test functions (each `async fn(Harness)`) once per
/// store: `mod NAME { memory, postgres }`.
#[macro_export]
macro_rules! both_stores {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn memory() {
                super::$name($crate::support::Harness::memory().await).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn postgres() {
                super::$name($crate::support::Harness::postgres().await).await
            }
        }
    )*};
}

/// A store under test with its manual clock and a unique scope prefix.
pub struct Harness {
    pub name: &'static str,
    pub store: Arc<dyn IdempotencyStore>,
    pub clock: Arc<ManualClock>,
    /// Unique per test, so tests sharing a database table never collide.
    pub scope: String,
    pub pg: Option<PostgresStore>,
}

pub fn database_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// Connects to the test database or fails the test with instructions.
pub async fn pg_store(table: &str, clock: Arc<ManualClock>) -> PostgresStore {
    let url = database_url();
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(16)
        .acquire_timeout(Duration::from_secs(5))
        .connect(&url)
        .await
        .unwrap_or_else(|err| {
            panic!(
                "PostgreSQL is not reachable at {url} ({err}).\n\
                 These tests need it. Start it with:\n    \
                 pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start\n\
                 and make sure the database exists (createdb -U postgres test), \
                 or point DATABASE_URL at another server."
            )
        });
    let store = PostgresStore::new(pool)
        .with_table(table)
        .expect("valid table name")
        .with_clock(clock);
    store.migrate().await.expect("migrating the test table");
    store
}

fn unique(prefix: &str) -> String {
    format!("{prefix}{}", uuid::Uuid::new_v4().simple())
}

impl Harness {
    pub async fn memory() -> Self {
        let clock = Arc::new(ManualClock::new());
        Self {
            name: "memory",
            store: Arc::new(MemoryStore::with_clock(clock.clone())),
            clock,
            scope: unique("t"),
            pg: None,
        }
    }

    /// PostgreSQL harness on the shared test table.
    pub async fn postgres() -> Self {
        Self::postgres_on(SHARED_TABLE).await
    }

    /// PostgreSQL harness on a private table (for sweep tests, which delete
    /// across scopes). Drop it with [`Harness::drop_table`].
    pub async fn postgres_private() -> Self {
        Self::postgres_on(&unique("tower_idem_t_")).await
    }

    async fn postgres_on(table: &str) -> Self {
        let clock = Arc::new(ManualClock::new());
        let store = pg_store(table, clock.clone()).await;
        Self {
            name: "postgres",
            store: Arc::new(store.clone()),
            clock,
            scope: unique("t"),
            pg: Some(store),
        }
    }

    pub async fn drop_table(&self) {
        if let Some(pg) = &self.pg {
            if pg.table() != SHARED_TABLE {
                sqlx::query(&format!("DROP TABLE IF EXISTS {}", pg.table()))
                    .execute(pg.pool())
                    .await
                    .expect("drop test table");
            }
        }
    }

    /// A layer on this store whose scope is this test's unique scope plus the
    /// `x-tenant` request header.
    pub fn layer(&self) -> IdempotencyLayer {
        let scope = self.scope.clone();
        IdempotencyLayer::from_arc(self.store.clone()).scope_with(move |parts| {
            let tenant = parts
                .headers
                .get("x-tenant")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            format!("{scope}/{tenant}")
        })
    }
}

/// Shared state of the test application.
#[derive(Clone, Default)]
pub struct AppState {
    /// Number of times the POST handler ran.
    pub runs: Arc<AtomicUsize>,
    /// Signalled when a handler with `x-wait` has started.
    pub started: Arc<Notify>,
    /// Handlers with `x-wait` wait for this.
    pub proceed: Arc<Notify>,
}

impl AppState {
    pub fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }
}

/// `POST /payments` (also `PUT`, `PATCH`, `GET`): counts its runs and answers
/// `x-status` (default 201) with a JSON body `{"run": n, "body": "..."}`.
/// Behaviour switches (request headers, not part of the fingerprint):
/// `x-status: N`, `x-size: N` (body of N bytes), `x-wait` (wait for
/// `proceed`), `x-delay-ms: N` (tokio sleep), `x-panic`.
async fn handler(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    let run = state.runs.fetch_add(1, Ordering::SeqCst) + 1;
    let get = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if get("x-panic").is_some() {
        panic!("handler panicked on purpose");
    }
    if let Some(ms) = get("x-delay-ms").and_then(|v| v.parse().ok()) {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    if get("x-wait").is_some() {
        let proceed = state.proceed.notified();
        state.started.notify_one();
        proceed.await;
    }
    let status = get("x-status")
        .and_then(|v| v.parse().ok())
        .and_then(|v| StatusCode::from_u16(v).ok())
        .unwrap_or(StatusCode::CREATED);
    if let Some(size) = get("x-size").and_then(|v| v.parse::<usize>().ok()) {
        return (status, "x".repeat(size)).into_response();
    }
    let json = serde_json::json!({"run": run, "body": String::from_utf8_lossy(&body)});
    (
        status,
        [
            ("content-type", "application/json"),
            ("x-extra", "not-stored"),
        ],
        json.to_string(),
    )
        .into_response()
}

pub fn app(layer: IdempotencyLayer) -> (Router, AppState) {
    let state = AppState::default();
    let router = Router::new()
        .route(
            "/payments",
            routing::post(handler)
                .put(handler)
                .patch(handler)
                .get(handler)
                .delete(handler),
        )
        .with_state(state.clone())
        .layer(layer);
    (router, state)
}

/// Builds a request: `method uri`, optional key, body, extra headers.
pub fn req(
    method: &str,
    uri: &str,
    key: Option<&str>,
    body: &str,
    headers: &[(&str, &str)],
) -> Request<Body> {
    let mut builder = Request::builder().method(method).uri(uri);
    if let Some(key) = key {
        builder = builder.header("idempotency-key", key);
    }
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    builder
        .body(Body::from(body.to_owned()))
        .expect("valid request")
}

pub fn post(key: &str, body: &str) -> Request<Body> {
    req("POST", "/payments", Some(key), body, &[])
}

/// A response with its body collected.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).expect("JSON body")
    }

    pub fn replayed(&self) -> bool {
        self.headers
            .get("idempotent-replayed")
            .map(|v| v == "true")
            .unwrap_or(false)
    }

    /// Asserts an RFC 9457 problem document with the given status.
    pub fn assert_problem(&self, status: u16) -> serde_json::Value {
        assert_eq!(self.status.as_u16(), status, "body: {:?}", self.body);
        assert_eq!(self.headers["content-type"], "application/problem+json");
        let doc = self.json();
        assert_eq!(doc["status"], status);
        for field in ["type", "title", "detail"] {
            assert!(doc[field].is_string(), "problem without {field}: {doc}");
        }
        doc
    }
}

pub async fn send(router: &Router, request: Request<Body>) -> Reply {
    let response = router.clone().oneshot(request).await.expect("infallible");
    let (parts, body) = response.into_parts();
    let body = body.collect().await.expect("body").to_bytes();
    Reply {
        status: parts.status,
        headers: parts.headers,
        body,
    }
}

/// Sends `make()` until the answer is not 409 (a release runs in a spawned
/// task after a panic or a dropped request); bounded.
pub async fn send_until_not_409(router: &Router, make: impl Fn() -> Request<Body>) -> Reply {
    for _ in 0..500 {
        let reply = send(router, make()).await;
        if reply.status != StatusCode::CONFLICT {
            return reply;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    panic!("the key was never released");
}
