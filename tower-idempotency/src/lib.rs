//! Exactly-once `POST`/`PATCH` handling for tower and axum services, with the
//! `Idempotency-Key` HTTP header (IETF draft *The Idempotency-Key HTTP Header
//! Field*, with Stripe's semantics).
//!
//! ```
//! use axum::{body::Body, http::{Request, StatusCode}, routing::post, Router};
//! use std::sync::atomic::{AtomicUsize, Ordering};
//! use std::sync::Arc;
//! use tower::ServiceExt;
//! use tower_idempotency::{IdempotencyLayer, MemoryStore};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let runs = Arc::new(AtomicUsize::new(0));
//! let counter = runs.clone();
//! let app = Router::new()
//!     .route("/payments", post(move || async move {
//!         counter.fetch_add(1, Ordering::SeqCst);
//!         (StatusCode::CREATED, "paid")
//!     }))
//!     .layer(IdempotencyLayer::new(MemoryStore::new()));
//!
//! let request = || {
//!     Request::post("/payments")
//!         .header("idempotency-key", "8e03978e-40d5-43e8-bc93-6894a57f9324")
//!         .body(Body::from("amount=10"))
//!         .unwrap()
//! };
//! let first = app.clone().oneshot(request()).await.unwrap();
//! assert_eq!(first.status(), StatusCode::CREATED);
//! let retry = app.clone().oneshot(request()).await.unwrap();
//! assert_eq!(retry.status(), StatusCode::CREATED);
//! assert_eq!(retry.headers()["idempotent-replayed"], "true");
//! assert_eq!(runs.load(Ordering::SeqCst), 1); // the handler ran once
//! # }
//! ```
//!
//! # What happens to a request
//!
//! Requests whose method is not covered (by default anything but `POST` and
//! `PATCH`) pass through untouched. For the others the layer reads the key
//! (bare `abc` or structured-field string `"abc"`), buffers the body,
//! computes a SHA-256 [`Fingerprint`] of method, path and query, selected
//! headers and body, and atomically claims `(scope, key)` in the
//! [`IdempotencyStore`]:
//!
//! | store state                         | answer                                                |
//! |-------------------------------------|-------------------------------------------------------|
//! | no record (or expired)              | run the handler once, store its final response        |
//! | completed, same fingerprint         | replay the stored response + `Idempotent-Replayed: true` |
//! | completed, different fingerprint    | `422` problem+json                                    |
//! | in progress, different fingerprint  | `422` problem+json                                    |
//! | in progress, same fingerprint       | `409` problem+json + `Retry-After`                    |
//! | in progress, lock timed out         | taken over: the handler runs again                   |
//! | missing / empty / >255 chars key    | `400` problem+json                                    |
//!
//! Transient responses (5xx, 429) are not stored: the claim is released so a
//! retry runs the handler again. So is a claim whose handler panicked, whose
//! inner service returned an error, or whose request future was dropped.
//!
//! # Scope, lock timeout, expiry
//!
//! Keys are scoped by [`IdempotencyLayer::scope_with`] so tenants never see
//! each other's keys. A claim held by a server that died is taken over after
//! [`IdempotencyLayer::lock_timeout`] (30 s). Records expire after
//! [`IdempotencyLayer::expiry`] (24 h, like Stripe): this window must exceed
//! the client's whole retry horizon (its overall deadline), otherwise a late
//! retry would run the handler again. Expired records are deleted by
//! [`IdempotencyStore::sweep_expired`], for example from [`spawn_sweeper`].
//!
//! # Stores
//!
//! [`MemoryStore`] keeps records in the process (one instance, tests).
//! `PostgresStore` (feature `postgres`, on by default) shares them between
//! instances and can complete a key inside the handler's own transaction
//! (`PostgresStore::complete_in_tx` with the [`IdempotencyContext`] found in
//! the request extensions).
//!
//! # Errors
//!
//! Errors are `application/problem+json` documents (RFC 9457) with `type`,
//! `title`, `status` and `detail`; see [`ProblemKind`].

#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations)]

mod config;
mod key;
mod layer;
mod memory;
#[cfg(feature = "postgres")]
mod postgres;
mod problem;
mod replay;
mod run;
mod scope;
mod store;

pub use config::{ConfigError, IdempotencyLayerBuilder};
pub use layer::{
    IdempotencyContext, IdempotencyLayer, IdempotencyService, IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED,
};
pub use memory::{MemoryStore, DEFAULT_MEMORY_MAX_KEYS};
#[cfg(feature = "postgres")]
pub use postgres::{PostgresStore, MIGRATION_SQL};
pub use problem::ProblemKind;
pub use store::{
    spawn_sweeper, ClaimOutcome, ClaimRequest, Clock, Fingerprint, IdempotencyStore, LeaseToken,
    ManualClock, StoreError, StoredResponse, SystemClock, MAX_STORED_ID_LEN,
};
