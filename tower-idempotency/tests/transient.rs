//! What the handler answers decides whether its key is kept: 5xx and 429 are
//! stored (the handler may have done its effect first, as Stripe assumes);
//! the request-validation statuses 400, 415 and 422 free the key; the set is
//! configurable.
mod support;
use axum::http::StatusCode;
use support::{app, req, send, Harness};

both_stores!(
    status_503_is_stored,
    status_429_is_stored,
    status_500_is_stored,
    status_415_then_corrected_request_runs,
    status_400_and_422_release,
    configured_release_statuses
);

fn with_status(status: &str) -> axum::http::Request<axum::body::Body> {
    req("POST", "/payments", Some("k"), "a", &[("x-status", status)])
}

/// The first answer is `status`; the retry (same fingerprint: x-status is not
/// part of it) gets it replayed without running the handler.
async fn stored(h: Harness, status: &str) {
    let (router, state) = app(h.layer());
    let first = send(&router, with_status(status)).await;
    assert_eq!(first.status.as_str(), status);
    assert!(!first.replayed());
    let second = send(&router, req("POST", "/payments", Some("k"), "a", &[])).await;
    assert_eq!(second.status.as_str(), status);
    assert!(second.replayed());
    assert_eq!(second.body, first.body);
    assert_eq!(state.runs(), 1, "{}", h.name);
}

/// The first answer is `status` and frees the key: the retry runs again and
/// its final answer is stored.
async fn released(router: &axum::Router, state: &support::AppState, status: &str) {
    let runs = state.runs();
    let first = send(router, with_status(status)).await;
    assert_eq!(first.status.as_str(), status);
    let second = send(router, req("POST", "/payments", Some("k"), "a", &[])).await;
    assert_eq!(second.status, StatusCode::CREATED);
    assert!(!second.replayed());
    let third = send(router, req("POST", "/payments", Some("k"), "a", &[])).await;
    assert!(third.replayed());
    assert_eq!(state.runs(), runs + 2);
}

async fn status_503_is_stored(h: Harness) {
    stored(h, "503").await
}
async fn status_429_is_stored(h: Harness) {
    stored(h, "429").await
}
async fn status_500_is_stored(h: Harness) {
    stored(h, "500").await
}

async fn status_415_then_corrected_request_runs(h: Harness) {
    // The handler refuses a body without content-type: application/json
    // before doing anything; the corrected request under the same key runs.
    use axum::routing::post as post_route;
    let runs = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = runs.clone();
    let router = axum::Router::new()
        .route(
            "/payments",
            post_route(move |headers: axum::http::HeaderMap| {
                let counter = counter.clone();
                async move {
                    if headers
                        .get("content-type")
                        .is_none_or(|v| v != "application/json")
                    {
                        return (StatusCode::UNSUPPORTED_MEDIA_TYPE, "json only");
                    }
                    counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    (StatusCode::CREATED, "paid")
                }
            }),
        )
        .layer(h.layer());
    let body = r#"{"amount":10}"#;
    let wrong = send(&router, req("POST", "/payments", Some("k"), body, &[])).await;
    assert_eq!(wrong.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let json = || {
        req(
            "POST",
            "/payments",
            Some("k"),
            body,
            &[("content-type", "application/json")],
        )
    };
    let corrected = send(&router, json()).await;
    assert_eq!(corrected.status, StatusCode::CREATED, "{}", h.name);
    assert!(!corrected.replayed());
    assert!(send(&router, json()).await.replayed());
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 1);
}

async fn status_400_and_422_release(h: Harness) {
    let (router, state) = app(h.layer());
    released(&router, &state, "400").await;
    // Another scope, so the key is fresh again (the first one is completed).
    let other = h.builder().scope_with(|_| "round-2".to_owned());
    let (router, state) = app(other.build().unwrap());
    released(&router, &state, "422").await;
}

async fn configured_release_statuses(h: Harness) {
    // A handler that guarantees it answers 503 before any effect may free
    // its key on 503; 400 is then stored.
    let layer = h
        .builder()
        .release_statuses([StatusCode::SERVICE_UNAVAILABLE])
        .build()
        .unwrap();
    let (router, state) = app(layer);
    released(&router, &state, "503").await;
    let other = h.builder().scope_with(|_| "round-2".to_owned());
    let (router, state) = app(other
        .release_statuses([StatusCode::SERVICE_UNAVAILABLE])
        .build()
        .unwrap());
    let first = send(&router, with_status("400")).await;
    assert_eq!(first.status, StatusCode::BAD_REQUEST);
    assert!(send(&router, req("POST", "/payments", Some("k"), "a", &[]))
        .await
        .replayed());
    assert_eq!(state.runs(), 1);
}
