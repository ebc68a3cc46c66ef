//! Body size limits: 413 for large requests (nothing claimed); a response too
//! large to keep completes the key with a marker (never runs again).
mod support;
use support::{app, post, req, send, Harness};

both_stores!(
    large_request_is_413,
    large_response_keeps_the_key_with_a_marker
);

async fn large_request_is_413(h: Harness) {
    let (router, state) = app(h.builder().max_request_body_bytes(16).build().unwrap());
    send(&router, post("k", &"x".repeat(17)))
        .await
        .assert_problem(413);
    assert_eq!(state.runs(), 0);
    // Nothing was claimed: the same key works with an acceptable body.
    assert_eq!(send(&router, post("k", &"x".repeat(16))).await.status, 201);
}

async fn large_response_keeps_the_key_with_a_marker(h: Harness) {
    let (router, state) = app(h.builder().max_response_body_bytes(100).build().unwrap());
    let make = |size: &str| req("POST", "/payments", Some("k"), "a", &[("x-size", size)]);
    let big = send(&router, make("101")).await;
    let doc = big.assert_problem(410);
    assert_eq!(doc["code"], "response_not_retained");
    assert!(doc["detail"].as_str().unwrap().contains("100 bytes"));
    assert!(!big.replayed());
    // The handler ran (its effect happened): the retry never runs it again,
    // it gets the marker, replayed.
    let retry = send(&router, make("100")).await;
    assert_eq!(retry.assert_problem(410), doc);
    assert!(retry.replayed());
    assert_eq!(state.runs(), 1, "{}: the effect ran twice", h.name);
}
