//! 50 identical concurrent requests run the handler exactly once.
mod support;
use std::time::Duration;

use support::{app, post, send, Harness};

both_stores!(fifty_concurrent_requests_run_once);

async fn fifty_concurrent_requests_run_once(h: Harness) {
    let (router, state) = app(h.layer());
    let started = state.started.notified();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..50 {
        let r = router.clone();
        tasks.spawn(async move {
            send(
                &r,
                support::req(
                    "POST",
                    "/payments",
                    Some("once"),
                    r#"{"amount":5}"#,
                    &[("x-wait", "1")],
                ),
            )
            .await
        });
    }
    // One handler runs and holds the key until told to go on: the other 49
    // arrive while it is in progress. (A guard, not a timing check: a
    // second handler running would wait for `proceed` too, and the test
    // fails here instead of hanging.)
    started.await;
    let mut replies = Vec::new();
    let guard = Duration::from_secs(60);
    while replies.len() < 49 {
        let reply = tokio::time::timeout(guard, tasks.join_next())
            .await
            .expect("49 requests answered while the first one ran")
            .expect("a request task")
            .unwrap();
        replies.push(reply);
    }
    state.proceed.notify_one();
    while let Some(reply) = tasks.join_next().await {
        replies.push(reply.unwrap());
    }
    let mut created = Vec::new();
    let mut conflicts = 0;
    for reply in replies {
        match reply.status.as_u16() {
            201 => created.push(reply.body),
            409 => conflicts += 1,
            other => panic!("unexpected status {other}: {:?}", reply.body),
        }
    }
    assert_eq!(state.runs(), 1, "{}: handler ran more than once", h.name);
    assert!(!created.is_empty());
    assert!(created.iter().all(|b| *b == created[0]), "responses differ");
    assert_eq!(created.len() + conflicts, 50);
    // After it finished everyone gets the replay.
    let after = send(&router, post("once", r#"{"amount":5}"#)).await;
    assert!(after.replayed());
    assert_eq!(after.body, created[0]);
}
