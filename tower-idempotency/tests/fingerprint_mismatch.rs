//! Reusing a key with a different request is rejected with 422.
mod support;
use axum::http::HeaderName;
use support::{app, post, req, send, spawn_waiting, Harness};

both_stores!(
    different_body_is_422,
    different_path_or_method_is_422,
    fingerprint_headers_count,
    different_fingerprint_while_in_progress_is_422
);

async fn different_body_is_422(h: Harness) {
    let (router, state) = app(h.layer());
    assert_eq!(
        send(&router, post("k", r#"{"amount":10}"#)).await.status,
        201
    );
    let reply = send(&router, post("k", r#"{"amount":11}"#)).await;
    let doc = reply.assert_problem(422);
    assert!(doc["detail"]
        .as_str()
        .unwrap()
        .contains("different request"));
    assert_eq!(state.runs(), 1);
}

async fn different_path_or_method_is_422(h: Harness) {
    let (router, state) = app(h.layer());
    assert_eq!(send(&router, post("k", "a")).await.status, 201);
    let query = req("POST", "/payments?x=1", Some("k"), "a", &[]);
    send(&router, query).await.assert_problem(422);
    let patch = req("PATCH", "/payments", Some("k"), "a", &[]);
    send(&router, patch).await.assert_problem(422);
    assert_eq!(state.runs(), 1);
}

async fn fingerprint_headers_count(h: Harness) {
    let layer = h
        .builder()
        .fingerprint_headers([HeaderName::from_static("x-currency")])
        .build()
        .unwrap();
    let (router, state) = app(layer);
    let eur = || {
        req(
            "POST",
            "/payments",
            Some("k"),
            "a",
            &[("x-currency", "EUR")],
        )
    };
    assert_eq!(send(&router, eur()).await.status, 201);
    assert!(send(&router, eur()).await.replayed());
    let usd = req(
        "POST",
        "/payments",
        Some("k"),
        "a",
        &[("x-currency", "USD")],
    );
    send(&router, usd).await.assert_problem(422);
    assert_eq!(state.runs(), 1);
}

async fn different_fingerprint_while_in_progress_is_422(h: Harness) {
    let (router, state) = app(h.layer());
    let started = state.started.notified();
    let first = spawn_waiting(&router, "k", "a");
    started.await;
    send(&router, post("k", "b")).await.assert_problem(422);
    state.proceed.notify_one();
    assert_eq!(first.await.unwrap().status, 201);
    assert_eq!(state.runs(), 1);
}
