//! A downstream service behind its own `tower-idempotency` that charges
//! once per request it lets through, counted by body: what a handler's
//! keyed call to a payment API reaches (`partition_downstream.rs`,
//! `scoped_keys_downstream.rs`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::routing::post;
use axum::Router;
use http::StatusCode;
use tower_idempotency::{IdempotencyLayer, MemoryStore};

/// Serves `router` on a free local port; its base URL.
pub async fn serve(router: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await });
    url
}

/// The downstream service, and its charges by body.
pub async fn downstream() -> (String, Arc<Mutex<HashMap<String, u32>>>) {
    let charges: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
    let counted = charges.clone();
    let app = Router::new()
        .route(
            "/charges",
            post(move |body: String| {
                let counted = counted.clone();
                async move {
                    *counted.lock().unwrap().entry(body).or_default() += 1;
                    (StatusCode::CREATED, "charged")
                }
            }),
        )
        .layer(IdempotencyLayer::new(MemoryStore::new()));
    (serve(app).await, charges)
}
