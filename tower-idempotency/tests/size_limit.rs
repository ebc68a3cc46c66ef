//! Body size limits: 413 for large requests, 500 + release for large responses.
mod support;
use support::{app, post, req, send, Harness};

both_stores!(large_request_is_413, large_response_is_500_and_released);

async fn large_request_is_413(h: Harness) {
    let (router, state) = app(h.layer().max_request_body_bytes(16));
    send(&router, post("k", &"x".repeat(17)))
        .await
        .assert_problem(413);
    assert_eq!(state.runs(), 0);
    // Nothing was claimed: the same key works with an acceptable body.
    assert_eq!(send(&router, post("k", &"x".repeat(16))).await.status, 201);
}

async fn large_response_is_500_and_released(h: Harness) {
    let (router, state) = app(h.layer().max_response_body_bytes(100));
    let big = send(
        &router,
        req("POST", "/payments", Some("k"), "a", &[("x-size", "101")]),
    )
    .await;
    let doc = big.assert_problem(500);
    assert!(doc["detail"].as_str().unwrap().contains("100 bytes"));
    // The key was released, so a retry runs the handler again.
    let ok = send(
        &router,
        req("POST", "/payments", Some("k"), "a", &[("x-size", "100")]),
    )
    .await;
    assert_eq!(ok.status, 201);
    assert_eq!(ok.body.len(), 100);
    assert!(send(&router, post("k", "a")).await.replayed());
    assert_eq!(state.runs(), 2);
}
