//! Exactly-once `POST`/`PATCH` handling for tower and axum services, with the
//! `Idempotency-Key` HTTP header (IETF draft *The Idempotency-Key HTTP Header
//! Field*, with Stripe's semantics).
//!
//! This page is the reference; the long form, one page per topic, is the
//! guide ([`_guide`]).
//!
//! ```
//! use axum::{body::Body, http::{Request, StatusCode}, routing::post, Router};
//! use std::sync::atomic::{AtomicUsize, Ordering};
//! use std::sync::Arc;
//! use tower::ServiceExt;
//! use tower_idempotency::{IdempotencyLayer, MemoryStore};
//!
//! #[tokio::main(flavor = "current_thread")]
//! async fn main() {
//!     let runs = Arc::new(AtomicUsize::new(0));
//!     let counter = runs.clone();
//!     let app = Router::new()
//!         .route("/payments", post(move || async move {
//!             counter.fetch_add(1, Ordering::SeqCst);
//!             (StatusCode::CREATED, "paid")
//!         }))
//!         .layer(IdempotencyLayer::new(MemoryStore::new()));
//!
//!     let request = || {
//!         Request::post("/payments")
//!             .header("idempotency-key", "8e03978e-40d5-43e8-bc93-6894a57f9324")
//!             .body(Body::from("amount=10"))
//!             .unwrap()
//!     };
//!     let first = app.clone().oneshot(request()).await.unwrap();
//!     assert_eq!(first.status(), StatusCode::CREATED);
//!     let retry = app.clone().oneshot(request()).await.unwrap();
//!     assert_eq!(retry.status(), StatusCode::CREATED);
//!     assert_eq!(retry.headers()["idempotent-replayed"], "true");
//!     assert_eq!(runs.load(Ordering::SeqCst), 1); // the handler ran once
//! }
//! ```
//!
//! # What happens to a request
//!
//! Requests whose method is not covered (by default anything but `POST` and
//! `PATCH`) pass through untouched. For the others the layer reads the key
//! (bare `abc` or structured-field string `"abc"`), buffers the body,
//! computes a SHA-256 [`Fingerprint`] of method, path and query, selected
//! headers and body, derives the caller's scope, and atomically claims
//! `(scope, key)` in the [`IdempotencyStore`]:
//!
//! | store state                           | answer                                                   |
//! |---------------------------------------|----------------------------------------------------------|
//! | no record (or expired)                | run the handler once, keep its final response            |
//! | completed, same fingerprint           | replay the stored response + `Idempotent-Replayed: true` |
//! | completed, different fingerprint      | `422` problem+json                                       |
//! | in progress, different fingerprint    | `422` problem+json                                       |
//! | in progress, same fingerprint         | `409` problem+json + `Retry-After`                       |
//! | in progress, lease stale (first seen) | `409` (`422` for a different fingerprint); the lease is marked seen stale |
//! | in progress, seen stale a lock timeout ago, no heartbeat since | taken over, whatever the fingerprint (the owner is gone): the handler runs |
//! | missing key (default)                 | passes through untouched                                 |
//! | missing (`require_key(true)`), empty / >255 chars key | `400` problem+json, nothing claimed |
//! | store unreachable (transient)         | `503` problem+json + `Retry-After`, nothing run          |
//! | store refuses (permanent)             | `500` problem+json, nothing run                          |
//!
//! # After the handler started
//!
//! The claimed request runs in the response future, and is handed to a task
//! of its own if that future is dropped (except in PostgreSQL's
//! transactional mode, see below): a client that disconnects
//! (a client-side timeout) cancels nothing and frees nothing; a retry gets
//! `409` while the handler works and the replay afterwards. While it runs,
//! the layer extends the claim's lease from tasks of its own (a heartbeat
//! every third of the lock timeout), so a live handler is never taken over,
//! however slow. On a multi-thread runtime the extensions run on the other
//! workers while a handler blocks its thread in `block_in_place` or
//! `spawn_blocking`, as tokio asks of any blocking code. A handler that
//! blocks its worker without them can stop the whole runtime's timers and
//! sockets (a worker blocked right after driving tokio's I/O and timer
//! driver leaves it to nobody while the other workers sleep), heartbeats
//! included: its lease then goes stale, and [`IdempotencyContext::still_held`]
//! says so.
//!
//! A key is freed only when the handler provably did no work: the
//! request-validation statuses `400`, `415` and `422` (configurable with
//! [`IdempotencyLayerBuilder::release_statuses`]), and `401` and `403`
//! always: an unauthenticated answer is never stored. Every other answer is
//! stored, `5xx` and `429` included (the handler may have done its effect
//! before failing, as Stripe assumes). A store that fails to save it is
//! tried again for [`IdempotencyLayerBuilder::completion_patience`] (10
//! minutes) with the lease kept alive, so a database failover is outlasted.
//! When the response cannot be kept (a body over
//! [`IdempotencyLayerBuilder::max_response_body_bytes`], a store that kept
//! failing past that patience) or the handler's outcome is unknown (it
//! panicked, the inner service returned an error), the key is completed with
//! a marker: every retry gets `410` problem+json with code
//! `response_not_retained`, replayed, and the handler never runs again for
//! that key.
//!
//! # What is guaranteed, for which handlers
//!
//! * **Exactly once**: a PostgreSQL handler whose effects are all writes to
//!   that database, run in the transactional mode
//!   (`IdempotencyLayer::transactional`: claim, writes and response in one
//!   transaction), or in the two-phase mode completing the key in its own
//!   transaction (`PostgresStore::commit_completed` or `complete_in_tx`, with the
//!   [`IdempotencyContext`] found in the request extensions). The effect and
//!   the stored response commit or roll back together, so no crash can
//!   separate them.
//! * **At most once, fenced**, for every other handler (MemoryStore, or an
//!   effect outside the database such as a call to a payment processor)
//!   that checks [`IdempotencyContext::still_held`] right before its
//!   effect: no other request can take the key over before it turns
//!   `false`, a lock timeout after the last heartbeat the store accepted
//!   was sent (a takeover needs the lease stale for a lock timeout, then a
//!   lock timeout more after a retry marked it), through an outage of the
//!   store and when only this server is cut off from it. Not covered: an
//!   effect already under way when the server lost the store and still
//!   running a lock timeout later, and a server that dies between the
//!   effect and storing the response (a retry runs the handler again once
//!   its lease has been seen stale for a lock timeout). For those, make the
//!   effect recognise a second run downstream: pass the key on
//!   (`reqwest-safe-retry` derives one per call inside its
//!   `InheritDeadlineLayer`), or the fencing epoch
//!   ([`IdempotencyContext::epoch`]), or record *recovery points*: in a
//!   transaction, write "about to charge" with the key before the call and
//!   the result after it, and have the handler resume from the last
//!   recovery point instead of starting over.
//!
//! # PostgreSQL: transactional or two-phase
//!
//! * **Transactional** (`IdempotencyLayer::transactional`) when every effect
//!   of the handler is a write to the store's database. One transaction
//!   holds the claim, the handler's writes (through the
//!   `IdempotencyTransaction` in the request extensions) and the stored
//!   response: one commit, one WAL flush per request, exactly once. A
//!   concurrent duplicate waits on the claim row's lock for at most a
//!   second, then gets the replay or `409`. Costs: the request holds a
//!   pooled connection from claim to commit (size the pool with
//!   `PostgresStore::connect_with_pool_size`). A client that goes away rolls the request back.
//! * **Two-phase** (`IdempotencyLayer::new` / `builder`) when the handler
//!   has effects outside the database (a payment processor, a queue, an
//!   email): the claim commits first, the handler runs under a lease, the
//!   response is stored in a second commit (two WAL flushes). A duplicate
//!   gets `409` at once, a client that goes away cancels nothing, and a
//!   slow handler keeps its key through the heartbeat.
//!
//! # Scope, lock timeout, expiry
//!
//! The scope a request is stored under (see below) is handed to the layers around this
//! one as an [`idempotency_key::CallerScope`] request extension, so that
//! `reqwest-safe-retry`'s `InheritDeadlineLayer` derives the keys of the
//! handler's own calls from the server's notion of the caller, not from the
//! raw credential bytes.
//!
//! Keys are scoped by caller: by default a SHA-256 digest of the
//! `Authorization` header (requests without one share one anonymous scope),
//! or whatever [`IdempotencyLayerBuilder::scope_with`] returns. The store
//! sees only a 64-character digest. A claim whose lease is not extended (its
//! server died) is taken over a lock timeout (5 s) after a retry first
//! found it stale. Records expire after the expiry window (24 h, like
//! Stripe; a running handler's heartbeat renews it): it must exceed the
//! client's whole retry horizon (its overall deadline), otherwise a late
//! retry would run the handler again. [`MemoryStore`] sweeps expired
//! records while writing; `PostgresStore` sweeps them by itself in
//! bounded batches (or call [`IdempotencyStore::sweep_expired`], for
//! example from [`spawn_sweeper`]).
//!
//! # Stores
//!
//! [`MemoryStore`] keeps a bounded number of records in the process (one
//! instance, tests). `PostgresStore` (feature `postgres`, off by default)
//! shares them between instances, uses the database's clock for every
//! timestamp, and can complete a key inside the handler's own transaction.
//! `RedisStore` (feature `redis`, off by default) shares them through
//! Redis, one Lua script per operation on the server's clock; what Redis
//! loses runs again, so by default it refuses a server without the
//! append-only file or with an eviction policy. `RedisClusterStore` (same
//! feature) does the same on a Redis Cluster, spread over its masters.
//!
//! # Errors
//!
//! Errors are `application/problem+json` documents (RFC 9457) with `type`
//! (`about:blank`), `title`, `status`, `detail` and a `code`; see
//! [`ProblemKind`].

// docs.rs (`--cfg docsrs`, see Cargo.toml) marks each feature-gated item
// with the feature it needs; on today's nightly `doc_cfg` does it alone.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

/// The README's examples compile as doctests, as a reader pastes them (the
/// PostgreSQL and Redis ones need the `postgres` and `redis` features).
#[cfg(all(doctest, feature = "postgres", feature = "redis"))]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

/// The guide's pages compile as doctests too.
#[cfg(all(doctest, feature = "postgres", feature = "redis"))]
#[doc = include_str!("../docs/requests.md")]
#[doc = include_str!("../docs/configuration.md")]
#[doc = include_str!("../docs/stores.md")]
struct GuideDoctests;

/// The guide: the long form of the README, one page per topic, rendered
/// here (the same pages are `docs/` in the repository, where `cargo test`
/// compiles every snippet in them). Documentation only, no items.
// Rendered by `cargo doc`; `cargo test --doc` (which sets `doc` too)
// compiles the pages through `GuideDoctests`, with the dependencies
// their examples use.
#[cfg(all(doc, not(doctest)))]
pub mod _guide {
    /// What happens to a request: each path through the layer, after the handler started, what is guaranteed for which handlers, through a database failover.
    pub mod requests {
        #![doc = include_str!("../docs/requests.md")]
    }
    /// Configuration: scoping, what counts as the same request, leases and the lock timeout, the expiry window, the problem responses.
    pub mod configuration {
        #![doc = include_str!("../docs/configuration.md")]
    }
    /// Stores: `MemoryStore`, `RedisStore`, `PostgresStore`, the transactional mode.
    pub mod stores {
        #![doc = include_str!("../docs/stores.md")]
    }
}

mod layer;
mod memory;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "redis")]
mod redis_store;
mod request;
mod store;

pub use layer::{ConfigError, IdempotencyLayer, IdempotencyLayerBuilder, IdempotencyService};
pub use memory::{MemoryStore, DEFAULT_MEMORY_MAX_KEYS};
#[cfg(feature = "postgres")]
pub use postgres::{PostgresStore, DEFAULT_POOL_SIZE, MIGRATION_SQL};
#[cfg(feature = "redis")]
pub use redis_store::{RedisClusterStore, RedisStore, DEFAULT_REDIS_PREFIX};
pub use request::context::{IdempotencyContext, IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED};
pub use request::problem::ProblemKind;
#[cfg(feature = "postgres")]
pub use request::transactional::{IdempotencyTransaction, TransactionGuard};
pub use store::{
    next_epoch, spawn_sweeper, ClaimOutcome, ClaimRequest, Clock, Fingerprint, IdempotencyStore,
    LeaseToken, ManualClock, StoreError, StoredResponse, SystemClock, MAX_STORED_ID_LEN,
};
