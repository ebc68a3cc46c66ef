//! 50 identical concurrent requests run the handler exactly once.
mod support;
use support::{app, req, send, Harness};

both_stores!(fifty_concurrent_requests_run_once);

async fn fifty_concurrent_requests_run_once(h: Harness) {
    let (router, state) = app(h.layer());
    let mut tasks = Vec::new();
    for _ in 0..50 {
        let r = router.clone();
        tasks.push(tokio::spawn(async move {
            send(
                &r,
                req(
                    "POST",
                    "/payments",
                    Some("once"),
                    r#"{"amount":5}"#,
                    &[("x-delay-ms", "50")],
                ),
            )
            .await
        }));
    }
    let mut created = Vec::new();
    let mut conflicts = 0;
    for task in tasks {
        let reply = task.await.unwrap();
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
    let after = send(
        &router,
        req("POST", "/payments", Some("once"), r#"{"amount":5}"#, &[]),
    )
    .await;
    assert!(after.replayed());
    assert_eq!(after.body, created[0]);
}
