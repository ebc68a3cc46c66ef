//! Key header parsing: optional by default or required, bare or quoted,
//! length limits, custom name.
mod support;
use axum::http::HeaderName;
use support::{app, post, req, send, Harness};

both_stores!(
    missing_key_is_400,
    empty_or_too_long_key_is_400,
    quoted_key_is_the_same_key,
    custom_header_name,
    optional_key_passes_through
);

async fn missing_key_is_400(h: Harness) {
    let (router, state) = app(h.builder().require_key(true).build().unwrap());
    let doc = send(&router, req("POST", "/payments", None, "a", &[]))
        .await
        .assert_problem(400);
    assert!(doc["detail"].as_str().unwrap().contains("idempotency-key"));
    send(&router, req("PATCH", "/payments", None, "a", &[]))
        .await
        .assert_problem(400);
    assert_eq!(state.runs(), 0);
}

async fn empty_or_too_long_key_is_400(h: Harness) {
    let (router, state) = app(h.layer());
    send(&router, post("", "a")).await.assert_problem(400);
    send(&router, post("\"\"", "a")).await.assert_problem(400);
    send(&router, post(&"k".repeat(256), "a"))
        .await
        .assert_problem(400);
    send(&router, post("\"unterminated", "a"))
        .await
        .assert_problem(400);
    let twice = axum::http::Request::post("/payments")
        .header("idempotency-key", "a")
        .header("idempotency-key", "b")
        .body(axum::body::Body::empty())
        .unwrap();
    send(&router, twice).await.assert_problem(400);
    assert_eq!(state.runs(), 0);
    assert_eq!(send(&router, post(&"k".repeat(255), "a")).await.status, 201);
}

async fn quoted_key_is_the_same_key(h: Harness) {
    let (router, state) = app(h.layer());
    let first = send(&router, post("\"abc\"", "a")).await;
    assert_eq!(first.status, 201);
    let bare = send(&router, post("abc", "a")).await;
    assert!(bare.replayed());
    assert_eq!(bare.body, first.body);
    // Escapes are undone: "a\"b\\c" is the key a"b\c.
    assert_eq!(send(&router, post(r#""a\"b\\c""#, "a")).await.status, 201);
    assert!(send(&router, post(r#""a\"b\\c""#, "a")).await.replayed());
    assert_eq!(state.runs(), 2);
}

async fn custom_header_name(h: Harness) {
    let layer = h
        .builder()
        .header_name(HeaderName::from_static("x-request-key"))
        .require_key(true)
        .build()
        .unwrap();
    let (router, state) = app(layer);
    send(&router, post("k", "a")).await.assert_problem(400);
    let make = || req("POST", "/payments", None, "a", &[("x-request-key", "k")]);
    assert_eq!(send(&router, make()).await.status, 201);
    assert!(send(&router, make()).await.replayed());
    assert_eq!(state.runs(), 1);
}

/// By default a keyless request passes through untouched: a live API that
/// adopts the layer keeps its clients that send no key.
async fn optional_key_passes_through(h: Harness) {
    let (router, state) = app(h.layer());
    assert_eq!(
        send(&router, req("POST", "/payments", None, "a", &[]))
            .await
            .status,
        201
    );
    assert_eq!(
        send(&router, req("POST", "/payments", None, "a", &[]))
            .await
            .status,
        201
    );
    assert_eq!(state.runs(), 2);
}
