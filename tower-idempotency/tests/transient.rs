//! Transient responses (5xx, 429) release the key so a retry runs again.
mod support;
use support::{app, req, send, Harness};

both_stores!(
    status_503_releases,
    status_429_releases,
    status_500_releases
);

async fn check(h: Harness, transient: &str) {
    let (router, state) = app(h.layer());
    let first = send(
        &router,
        req(
            "POST",
            "/payments",
            Some("k"),
            "a",
            &[("x-status", transient)],
        ),
    )
    .await;
    assert_eq!(first.status.as_str(), transient);
    assert!(!first.replayed());
    // The retry (same fingerprint: x-status is not part of it) runs again.
    let second = send(&router, req("POST", "/payments", Some("k"), "a", &[])).await;
    assert_eq!(second.status, 201);
    assert!(!second.replayed());
    assert_eq!(state.runs(), 2);
    // ... and the final answer is now stored.
    let third = send(&router, req("POST", "/payments", Some("k"), "a", &[])).await;
    assert!(third.replayed());
    assert_eq!(third.body, second.body);
    assert_eq!(state.runs(), 2, "{}", h.name);
}

async fn status_503_releases(h: Harness) {
    check(h, "503").await
}
async fn status_429_releases(h: Harness) {
    check(h, "429").await
}
async fn status_500_releases(h: Harness) {
    check(h, "500").await
}
