//! End to end, against PostgreSQL: a payments service runs on two replicas
//! behind `tower-idempotency`; its handler's effect is a keyed POST, through
//! our client, to a downstream service behind its own `tower-idempotency`.
//! Only the replica that owns a key is cut off from the database,
//! mid-request; the other takes the key over and runs the handler again.
//! The owner's handler does *not* fence itself (no `still_held()`), and
//! makes its downstream call anyway, after the takeover. The key it derives
//! for that call is the one the other replica derived (the incoming key,
//! the caller and the call's ordinal; `InheritDeadlineLayer`), so the
//! downstream charge runs exactly once per payment.
//!
//! Needs PostgreSQL (`DATABASE_URL`, default
//! `postgres://postgres@127.0.0.1:5432/test`).

#[path = "../../tower-idempotency/tests/support/proxy.rs"]
mod proxy;
mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::Extension;
use axum::routing::post;
use axum::Router;
use http::{Request, StatusCode};
use proxy::Proxy;
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use reqwest_safe_retry::deadline::InheritDeadlineLayer;
use reqwest_safe_retry::{RetryMiddleware, RetryPolicy};
use support::charges::downstream;
use support::payments::database_url;
use tokio::sync::Notify;
use tower::ServiceExt;
use tower_idempotency::{IdempotencyContext, IdempotencyLayer, PostgresStore};

const LOCK_TIMEOUT: Duration = Duration::from_secs(2);

/// What the upstream replicas share.
#[derive(Clone)]
struct Upstream {
    client: ClientWithMiddleware,
    downstream: String,
    /// The cut-off replica's handlers wait for this before their call.
    restored: Arc<Notify>,
    /// Its handlers that started, and that finished.
    holding: Arc<AtomicUsize>,
    finished: Arc<AtomicUsize>,
}

/// A replica of the payments service: charges downstream, with the key
/// the request's own derives. On replica "a" the handler first waits until
/// its lease may be lost and the partition is over, and then charges all
/// the same.
fn replica(store: PostgresStore, name: &'static str, up: Upstream) -> Router {
    let handler = move |Extension(ctx): Extension<IdempotencyContext>, body: String| {
        let up = up.clone();
        async move {
            if name == "a" {
                let restored = up.restored.notified();
                up.holding.fetch_add(1, Ordering::SeqCst);
                ctx.lost().await;
                restored.await;
            }
            let charged = up
                .client
                .post(format!("{}/charges", up.downstream))
                .body(body)
                .send()
                .await;
            if name == "a" {
                up.finished.fetch_add(1, Ordering::SeqCst);
            }
            match charged {
                Ok(r) if r.status() == StatusCode::CREATED => StatusCode::CREATED,
                _ => StatusCode::BAD_GATEWAY,
            }
        }
    };
    let idempotency = IdempotencyLayer::builder(store)
        .lock_timeout(LOCK_TIMEOUT)
        .build()
        .unwrap();
    Router::new()
        .route("/payments", post(handler))
        .layer(InheritDeadlineLayer::new())
        .layer(idempotency)
}

fn payment(key: &str) -> Request<Body> {
    Request::post("/payments")
        .header("idempotency-key", key)
        .header("authorization", "Bearer shop")
        .body(Body::from(key.to_owned()))
        .unwrap()
}

/// Sends to replica a first, then alternates, every 300 ms with a 1 s
/// attempt timeout, until the answer is neither 409 nor 503.
async fn pay(replicas: [Router; 2], key: String) -> StatusCode {
    for attempt in 0..300 {
        let router = replicas[attempt % 2].clone();
        match tokio::time::timeout(Duration::from_secs(1), router.oneshot(payment(&key))).await {
            Ok(Ok(r))
                if r.status() != StatusCode::CONFLICT
                    && r.status() != StatusCode::SERVICE_UNAVAILABLE =>
            {
                return r.status()
            }
            _ => tokio::time::sleep(Duration::from_millis(300)).await,
        }
    }
    panic!("{key}: no answer within 90 s of retries");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replica_cut_off_mid_request_charges_downstream_once() {
    let table = format!("tie_{}", uuid::Uuid::new_v4().simple());
    let direct = PostgresStore::connect(&database_url())
        .await
        .unwrap_or_else(|e| panic!("PostgreSQL at {} (DATABASE_URL): {e}", database_url()))
        .with_table(&table)
        .unwrap();
    direct.migrate().await.unwrap();
    let (down, charges) = downstream().await;
    let up = Upstream {
        client: ClientBuilder::new(reqwest::Client::new())
            .with(RetryMiddleware::new(RetryPolicy::default()))
            .build(),
        downstream: down,
        restored: Arc::default(),
        holding: Arc::default(),
        finished: Arc::default(),
    };
    let (to_a, to_b) = (
        Proxy::start(&database_url()).await,
        Proxy::start(&database_url()).await,
    );
    let mut replicas = Vec::new();
    for (proxy, name) in [(&to_a, "a"), (&to_b, "b")] {
        let store = PostgresStore::connect_with_pool_size(&proxy.url(), 8)
            .await
            .unwrap()
            .with_table(&table)
            .unwrap();
        replicas.push(replica(store, name, up.clone()));
    }
    let replicas: [Router; 2] = [replicas[0].clone(), replicas[1].clone()];

    let keys: Vec<String> = (0..10)
        .map(|i| format!("pay-{i}-{}", uuid::Uuid::new_v4().simple()))
        .collect();
    let mut payments = tokio::task::JoinSet::new();
    for key in &keys {
        let (replicas, key) = (replicas.clone(), key.clone());
        payments.spawn(async move { (pay(replicas, key.clone()).await, key) });
    }
    while up.holding.load(Ordering::SeqCst) < keys.len() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    to_a.cut();
    while let Some(done) = payments.join_next().await {
        let (status, key) = done.unwrap();
        assert_eq!(status, StatusCode::CREATED, "{key}");
    }
    to_a.restore();
    up.restored.notify_waiters();
    while up.finished.load(Ordering::SeqCst) < keys.len() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    assert!(
        to_a.refused.load(Ordering::SeqCst) > 0,
        "a never lost the database"
    );
    let charges = charges.lock().unwrap().clone();
    for key in &keys {
        assert_eq!(
            charges.get(key),
            Some(&1),
            "{key}: charged downstream {:?} times",
            charges.get(key)
        );
    }
    sqlx::query(&format!("DROP TABLE IF EXISTS {table}"))
        .execute(direct.pool())
        .await
        .unwrap();
}
