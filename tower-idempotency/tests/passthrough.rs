//! Methods outside the configured set pass through untouched.
mod support;
use axum::http::Method;
use support::{app, req, send, Harness};

both_stores!(get_passes_through, configured_methods);

async fn get_passes_through(h: Harness) {
    let (router, state) = app(h.layer());
    for key in [None, Some("k"), Some("")] {
        let reply = send(&router, req("GET", "/payments", key, "", &[])).await;
        assert_eq!(reply.status, 201);
        assert!(!reply.replayed());
    }
    // PUT and DELETE are not covered by default either.
    send(&router, req("PUT", "/payments", Some("k"), "", &[])).await;
    send(&router, req("DELETE", "/payments", None, "", &[])).await;
    assert_eq!(state.runs(), 5);
}

async fn configured_methods(h: Harness) {
    let layer = h
        .builder()
        .methods([Method::PUT])
        .require_key(true)
        .build()
        .unwrap();
    let (router, state) = app(layer);
    send(&router, req("PUT", "/payments", None, "", &[]))
        .await
        .assert_problem(400);
    assert_eq!(
        send(&router, req("PUT", "/payments", Some("k"), "", &[]))
            .await
            .status,
        201
    );
    assert!(send(&router, req("PUT", "/payments", Some("k"), "", &[]))
        .await
        .replayed());
    // POST is no longer covered.
    send(&router, req("POST", "/payments", None, "", &[])).await;
    assert_eq!(state.runs(), 2);
}
