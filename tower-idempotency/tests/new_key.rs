//! A new key runs the handler exactly once and stores its response.
mod support;
use support::{app, post, send, Harness};

both_stores!(new_key_runs_handler_once, context_reaches_handler);

async fn new_key_runs_handler_once(h: Harness) {
    let (router, state) = app(h.layer());
    let reply = send(&router, post("k1", r#"{"amount":10}"#)).await;
    assert_eq!(reply.status, 201);
    assert!(!reply.replayed());
    assert_eq!(reply.json()["run"], 1);
    assert_eq!(reply.headers["x-extra"], "not-stored");
    assert_eq!(state.runs(), 1);
    // A different key is a different operation.
    let reply = send(&router, post("k2", r#"{"amount":10}"#)).await;
    assert_eq!(reply.json()["run"], 2);
    assert_eq!(state.runs(), 2, "{}", h.name);
}

async fn context_reaches_handler(h: Harness) {
    use axum::routing::post as post_route;
    use axum::{Extension, Router};
    use tower_idempotency::IdempotencyContext;
    let router = Router::new()
        .route(
            "/payments",
            post_route(|Extension(ctx): Extension<IdempotencyContext>| async move {
                format!("{}|{}", ctx.scope(), ctx.key())
            }),
        )
        .layer(h.layer());
    let reply = send(&router, post("ctx-key", "")).await;
    assert_eq!(reply.status, 200);
    // The handler sees the stored scope: a digest, never the caller identity.
    assert_eq!(reply.body, format!("{}|ctx-key", h.stored_scope("")));
}
