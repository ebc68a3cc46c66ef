//! A panicking handler releases the claim; a dropped request does not.
mod support;
use support::{app, post, req, send, send_until_not_409, Harness};

both_stores!(panic_releases_claim, dropped_request_keeps_running);

async fn panic_releases_claim(h: Harness) {
    let (router, state) = app(h.layer());
    let r = router.clone();
    let crashed = tokio::spawn(async move {
        send(
            &r,
            req("POST", "/payments", Some("k"), "a", &[("x-panic", "1")]),
        )
        .await
    })
    .await;
    assert!(crashed.unwrap_err().is_panic());
    let retry = send_until_not_409(&router, || post("k", "a")).await;
    assert_eq!(retry.status, 201);
    assert!(!retry.replayed());
    assert_eq!(state.runs(), 2);
}

async fn dropped_request_keeps_running(h: Harness) {
    let (router, state) = app(h.layer());
    let started = state.started.notified();
    let r = router.clone();
    let client = tokio::spawn(async move {
        send(
            &r,
            req("POST", "/payments", Some("k"), "a", &[("x-wait", "1")]),
        )
        .await
    });
    started.await;
    send(&router, post("k", "a")).await.assert_problem(409);
    // The client disconnects: the request future is dropped mid-handler.
    client.abort();
    assert!(client.await.unwrap_err().is_cancelled());
    // The handler still owns the key ...
    send(&router, post("k", "a")).await.assert_problem(409);
    state.proceed.notify_one();
    // ... finishes, and its response is what the retry gets.
    let retry = send_until_not_409(&router, || post("k", "a")).await;
    assert_eq!(retry.status, 201);
    assert!(retry.replayed());
    assert_eq!(state.runs(), 1);
}
