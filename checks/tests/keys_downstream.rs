//! Keys that travel downstream: the keyed calls a handler makes inside
//! `InheritDeadlineLayer` carry keys derived from the request's own key
//! and caller, so a handler that runs twice for one request (a retry its
//! store let through, a takeover by another replica) sends the same keys,
//! and a downstream service that honours keys runs each effect once.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use http::Extensions;
use reqwest::{Request, Response};
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware, Middleware, Next};
use reqwest_safe_retry::deadline::InheritDeadlineLayer;
use reqwest_safe_retry::{RetryMiddleware, RetryPolicy};
use tower::{Layer, Service, ServiceExt};

/// Answers 201 to everything and keeps the key each request carried.
#[derive(Clone, Default)]
struct Keys(Arc<Mutex<Vec<Option<String>>>>);

#[async_trait::async_trait]
impl Middleware for Keys {
    async fn handle(
        &self,
        req: Request,
        _extensions: &mut Extensions,
        _next: Next<'_>,
    ) -> reqwest_middleware::Result<Response> {
        let key = req.headers().get("idempotency-key");
        self.0
            .lock()
            .unwrap()
            .push(key.map(|k| k.to_str().unwrap().to_owned()));
        Ok(Response::from(
            http::Response::builder()
                .status(201)
                .body(Vec::new())
                .unwrap(),
        ))
    }
}

impl Keys {
    fn take(&self) -> Vec<Option<String>> {
        std::mem::take(&mut self.0.lock().unwrap())
    }
}

/// A handler that makes two keyed POSTs (and one GET) downstream, behind
/// `layer`; serves one request with the given headers.
async fn serve(
    layer: &InheritDeadlineLayer,
    client: &ClientWithMiddleware,
    url: &str,
    headers: &[(&str, &str)],
) -> u16 {
    let (client, url) = (client.clone(), url.to_owned());
    let handler = tower::service_fn(move |_: http::Request<String>| {
        let (client, url) = (client.clone(), url.clone());
        async move {
            let mut status = 0;
            for path in ["/charges", "/receipts"] {
                let r = client.post(format!("{url}{path}")).body("{}").send().await;
                status = r.map_or(0, |r| r.status().as_u16());
            }
            let _ = client.get(format!("{url}/status")).send().await;
            Ok::<_, Infallible>(http::Response::new(status.to_string()))
        }
    });
    let mut service = layer.clone().layer(handler);
    let mut request = http::Request::builder();
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request.body(String::new()).unwrap();
    let response = service.ready().await.unwrap().call(request).await.unwrap();
    response.into_body().parse().unwrap()
}

fn client(keys: &Keys) -> ClientWithMiddleware {
    ClientBuilder::new(reqwest::Client::new())
        .with(RetryMiddleware::new(RetryPolicy::default()))
        .with(keys.clone())
        .build()
}

#[tokio::test]
async fn a_handler_run_twice_sends_the_same_keys() {
    let keys = Keys::default();
    let client = client(&keys);
    let layer = InheritDeadlineLayer::new();
    let alice = [
        ("idempotency-key", "order-17"),
        ("authorization", "Bearer alice"),
    ];
    serve(&layer, &client, "http://down.test", &alice).await;
    let first = keys.take();
    serve(&layer, &client, "http://down.test", &alice).await;
    let again = keys.take();
    // Two keyed calls, two different keys, the GET unkeyed; the same three
    // the second time.
    assert_eq!(first.len(), 3);
    assert!(first[0].is_some() && first[1].is_some() && first[0] != first[1]);
    assert_eq!(first[2], None);
    assert_eq!(first, again);
    // The same key in the structured-field form is the same request.
    let quoted = [
        ("idempotency-key", "\"order-17\""),
        ("authorization", "Bearer alice"),
    ];
    serve(&layer, &client, "http://down.test", &quoted).await;
    assert_eq!(keys.take(), first);
    // Another caller with the same key derives other keys.
    // (Credentials of the same length: only their bytes differ.)
    let carol = [
        ("idempotency-key", "order-17"),
        ("authorization", "Bearer carol"),
    ];
    serve(&layer, &client, "http://down.test", &carol).await;
    let carols = keys.take();
    assert!(
        carols[0] != first[0] && carols[1] != first[1],
        "{carols:?} {first:?}"
    );
}

#[tokio::test]
async fn without_a_key_or_with_derivation_off_keys_are_fresh() {
    let keys = Keys::default();
    let client = client(&keys);
    for (layer, headers) in [
        (InheritDeadlineLayer::new(), &[][..]),
        (
            InheritDeadlineLayer::new(),
            &[("idempotency-key", "bad key with spaces")][..],
        ),
        (
            InheritDeadlineLayer::new().no_derived_keys(),
            &[("idempotency-key", "order-17")][..],
        ),
    ] {
        serve(&layer, &client, "http://down.test", headers).await;
        let first = keys.take();
        serve(&layer, &client, "http://down.test", headers).await;
        let again = keys.take();
        assert!(first[0].is_some() && again[0].is_some());
        assert_ne!(first[0], again[0], "{headers:?}: a key was derived");
    }
}

/// End to end: the downstream service is behind `tower-idempotency`; the
/// upstream handler runs twice for one request (as after a takeover): the
/// downstream effect runs once, and the second run gets its stored answer.
#[tokio::test]
async fn the_downstream_effect_runs_once_when_the_handler_runs_twice() {
    use axum::routing::post;
    use tower_idempotency::{IdempotencyLayer, MemoryStore};

    let effects = Arc::new(AtomicUsize::new(0));
    let counted = effects.clone();
    let app = axum::Router::new()
        .route(
            "/charges",
            post(move || {
                let counted = counted.clone();
                async move {
                    counted.fetch_add(1, Ordering::SeqCst);
                    (http::StatusCode::CREATED, "charged")
                }
            }),
        )
        .route("/receipts", post(|| async { http::StatusCode::CREATED }))
        .layer(IdempotencyLayer::new(MemoryStore::new()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });

    let client = ClientBuilder::new(reqwest::Client::new())
        .with(RetryMiddleware::new(RetryPolicy::default()))
        .build();
    let layer = InheritDeadlineLayer::new();
    let request = [
        ("idempotency-key", "pay-42"),
        ("authorization", "Bearer alice"),
    ];
    assert_eq!(serve(&layer, &client, &url, &request).await, 201);
    assert_eq!(serve(&layer, &client, &url, &request).await, 201);
    assert_eq!(effects.load(Ordering::SeqCst), 1, "the charge ran twice");
    // Another request (another key) is another charge.
    let other = [
        ("idempotency-key", "pay-43"),
        ("authorization", "Bearer alice"),
    ];
    serve(&layer, &client, &url, &other).await;
    assert_eq!(effects.load(Ordering::SeqCst), 2);
}
