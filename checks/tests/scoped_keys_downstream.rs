//! Derived keys follow the server's notion of the caller. A payments
//! service behind `tower-idempotency` calls a downstream service, itself
//! behind `tower-idempotency`, through our client, with the keys
//! `InheritDeadlineLayer` derives from the request's key and its caller.
//! The caller is the one the idempotency layer scoped the request to, not
//! the raw `Authorization` bytes: when the first run's owner is gone and a
//! retry with a refreshed token (the service scoped by principal), or with
//! another spelling of the same credential (the default scope), takes the
//! key over, the handler's second run sends the keys its first run sent,
//! and the downstream charge runs once.
//!
//! Our client sends every request; no real time passes: the idempotency
//! store's clock is moved by hand.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::routing::post;
use axum::Router;
use http::StatusCode;
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use reqwest_safe_retry::deadline::InheritDeadlineLayer;
use reqwest_safe_retry::{RetryMiddleware, RetryPolicy};
use support::charges::{downstream, serve};
use tokio::sync::Notify;
use tower_idempotency::{
    ClaimOutcome, ClaimRequest, Fingerprint, IdempotencyLayer, IdempotencyLayerBuilder,
    IdempotencyStore, LeaseToken, ManualClock, MemoryStore, StoreError, StoredResponse,
};

/// A memory store whose leases are never extended: the first run's
/// replica is gone (its handler never comes back), so its lease goes
/// stale and a retry may take the key over.
struct GoneOwner(MemoryStore);

#[async_trait::async_trait]
impl IdempotencyStore for GoneOwner {
    async fn claim(&self, request: ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError> {
        self.0.claim(request).await
    }
    async fn complete(
        &self,
        scope: &str,
        key: &str,
        lease: LeaseToken,
        response: &StoredResponse,
    ) -> Result<bool, StoreError> {
        self.0.complete(scope, key, lease, response).await
    }
    async fn lookup(
        &self,
        scope: &str,
        key: &str,
        fingerprint: Fingerprint,
    ) -> Result<Option<ClaimOutcome>, StoreError> {
        self.0.lookup(scope, key, fingerprint).await
    }
    async fn extend_lease(&self, _: &str, _: &str, _: LeaseToken) -> Result<bool, StoreError> {
        Ok(true)
    }
    async fn release(&self, scope: &str, key: &str, lease: LeaseToken) -> Result<bool, StoreError> {
        self.0.release(scope, key, lease).await
    }
    async fn sweep_expired(&self) -> Result<u64, StoreError> {
        self.0.sweep_expired().await
    }
}

fn client() -> ClientWithMiddleware {
    // One attempt per send: the test plays the caller's retries itself.
    let policy = RetryPolicy::builder().max_attempts(1).build().unwrap();
    ClientBuilder::new(reqwest::Client::new())
        .with(RetryMiddleware::new(policy))
        .build()
}

/// Where `InheritDeadlineLayer` goes: outside the idempotency layer (the
/// recommended order), or inside it.
#[derive(Clone, Copy, Debug)]
enum Order {
    InheritOutside,
    InheritInside,
}

/// Pays once with `first` as the credential; that run charges downstream
/// and its replica dies. Retries with `retry` as the credential take the
/// key over; returns how many times the downstream charged the order.
async fn charges_after_a_takeover(
    builder: IdempotencyLayerBuilder,
    clock: Arc<ManualClock>,
    order: Order,
    first: &str,
    retry: &str,
) -> u32 {
    let (down, charges) = downstream().await;
    let runs = Arc::new(AtomicUsize::new(0));
    let charged = Arc::new(Notify::new());
    let handler = {
        let (runs, charged, client) = (runs.clone(), charged.clone(), client());
        move |body: String| {
            let (runs, charged, client, down) =
                (runs.clone(), charged.clone(), client.clone(), down.clone());
            async move {
                let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
                let r = client
                    .post(format!("{down}/charges"))
                    .body(body)
                    .send()
                    .await;
                if run == 1 {
                    // The replica dies after its effect: never answers,
                    // never renews its lease.
                    charged.notify_one();
                    std::future::pending::<()>().await;
                }
                match r {
                    Ok(r) if r.status() == StatusCode::CREATED => StatusCode::CREATED,
                    _ => StatusCode::BAD_GATEWAY,
                }
            }
        }
    };
    let idempotency = builder.build().unwrap();
    let router = Router::new().route("/payments", post(handler));
    let router = match order {
        Order::InheritOutside => router.layer(idempotency).layer(InheritDeadlineLayer::new()),
        Order::InheritInside => router.layer(InheritDeadlineLayer::new()).layer(idempotency),
    };
    let up = serve(router).await;
    let caller = client();
    let pay = |token: &str| {
        caller
            .post(format!("{up}/payments"))
            .header("idempotency-key", "order-1")
            .header("authorization", token)
            .body("order-1")
            .send()
    };

    let was_charged = charged.notified();
    let attempt = tokio::spawn(pay(first));
    was_charged.await;
    // The caller gives up on the first attempt; its token is refreshed.
    attempt.abort();
    clock.advance(Duration::from_secs(6));
    let marked = pay(retry).await.unwrap();
    assert_eq!(marked.status(), StatusCode::CONFLICT, "{order:?}");
    clock.advance(Duration::from_secs(6));
    let taken = pay(retry).await.unwrap();
    assert_eq!(taken.status(), StatusCode::CREATED, "{order:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    let charges = charges.lock().unwrap();
    charges.get("order-1").copied().unwrap_or(0)
}

/// The service scopes keys by principal (a token refreshed mid-retry is
/// the same caller): the retry with the refreshed token sends the keys
/// the first run sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refreshed_token_derives_the_same_keys() {
    for order in [Order::InheritOutside, Order::InheritInside] {
        let clock = Arc::new(ManualClock::new());
        let store = GoneOwner(MemoryStore::with_clock(clock.clone()));
        // "Bearer alice.v1" and "Bearer alice.v2" are both alice.
        let builder = IdempotencyLayer::builder(store).scope_with(|parts| {
            let token = parts.headers.get("authorization");
            let token = token.and_then(|t| t.to_str().ok()).unwrap_or("");
            token.split('.').next().unwrap_or("").to_owned()
        });
        let charged =
            charges_after_a_takeover(builder, clock, order, "Bearer alice.v1", "Bearer alice.v2")
                .await;
        assert_eq!(charged, 1, "{order:?}: charged downstream {charged} times");
    }
}

/// The default scope: `Bearer alice` and `bearer  alice` are one
/// credential (RFC 9110), one scope, and so the same derived keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_spellings_of_a_credential_derive_the_same_keys() {
    for order in [Order::InheritOutside, Order::InheritInside] {
        let clock = Arc::new(ManualClock::new());
        let store = GoneOwner(MemoryStore::with_clock(clock.clone()));
        let builder = IdempotencyLayer::builder(store);
        let charged =
            charges_after_a_takeover(builder, clock, order, "Bearer alice", "bearer  alice").await;
        assert_eq!(charged, 1, "{order:?}: charged downstream {charged} times");
    }
}

/// Without an idempotency layer in front, the keys are derived from the
/// `Authorization` bytes as before: two callers' requests with one key
/// never share a derived key, and one caller's always derive the same.
#[tokio::test]
async fn without_an_idempotency_layer_the_credential_still_counts() {
    use tower::{Layer, Service, ServiceExt};
    let derive = |auth: &'static str| async move {
        let handler = tower::service_fn(|_: http::Request<String>| async {
            let key = reqwest_safe_retry::deadline::InheritedDeadline::current()
                .and_then(|d| d.derive_key())
                .unwrap_or_default();
            Ok::<_, std::convert::Infallible>(http::Response::new(key))
        });
        let mut service = InheritDeadlineLayer::new().layer(handler);
        let request = http::Request::post("/p")
            .header("idempotency-key", "order-1")
            .header("authorization", auth)
            .body(String::new())
            .unwrap();
        let response = service.ready().await.unwrap().call(request).await.unwrap();
        response.into_body()
    };
    let alice = derive("Bearer alice").await;
    assert!(!alice.is_empty());
    assert_eq!(alice, derive("Bearer alice").await);
    assert_ne!(alice, derive("Bearer bob").await);
}
