//! Make service-to-service HTTP calls safe to retry.
//!
//! This page is the reference; the long form, one page per topic, is the
//! guide ([`_guide`]).
//!
//! `reqwest-safe-retry` is a [`reqwest_middleware`](https://docs.rs/reqwest-middleware/0.5) middleware. Add it to a
//! client and every call gains, with no other change to your code:
//!
//! - one **Idempotency-Key** per logical operation, reused on every attempt,
//!   so a retried `POST /payments` cannot charge twice;
//! - a **classifier** that separates transient failures from permanent ones,
//!   and a **safety rule** that never repeats a non-idempotent request the
//!   server may already have processed;
//! - **capped exponential backoff with jitter** (full by default; equal,
//!   decorrelated, proportional);
//! - **Retry-After** in seconds and as an HTTP-date, as a floor with jitter;
//! - **retry admission** shared by every clone of the client and kept per
//!   host, so retries stay a small fraction of traffic during an outage
//!   while a short blip still gets the retries it needs, and one dead host
//!   never holds back another's (see [`AdaptiveAdmission`]); an opt-in
//!   per-host circuit breaker;
//! - a **deadline**: it never sleeps past it, and never starts an attempt that
//!   cannot finish inside it; the time left travels downstream in
//!   `Request-Timeout-Ms`, and inside a handler wrapped by
//!   [`InheritDeadlineLayer`] every call inherits its caller's (see
//!   "In a stack of services" below);
//! - opt-in **hedged requests** ([`HedgeConfig`]): a second copy of a read
//!   that is slower than its host's p95, the first answer winning, at most
//!   5 % more requests and each hedge admitted like a retry;
//! - a **report** of what happened, in the response's extensions.
//!
//! ```toml
//! [dependencies]
//! reqwest-safe-retry = "0.1"
//! reqwest = "0.13"
//! reqwest-middleware = "0.5"
//! tokio = { version = "1", features = ["macros", "rt-multi-thread"] }
//! ```
//!
//! ```no_run
//! use reqwest_safe_retry::{RetryMiddleware, RetryPolicy, RetryReportExt};
//!
//! #[tokio::main]
//! async fn main() -> Result<(), reqwest_middleware::Error> {
//!     let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
//!         .with(RetryMiddleware::new(RetryPolicy::default()))
//!         .build();
//!
//!     let response = client
//!         .post("http://payments.internal/payments")
//!         .body(r#"{"account":"acme","amount":1200}"#)
//!         .send()
//!         .await?;
//!     if let Some(report) = response.retry_report() {
//!         println!("{} attempt(s), stopped: {}", report.attempts(), report.stop_reason());
//!     }
//!     Ok(())
//! }
//! ```
//!
//! `reqwest` and `reqwest-middleware` must be the versions this crate is
//! built against (above); otherwise `.with(..)` fails with E0277 and
//! `retry_report()` with E0599. The crate re-exports both
//! ([`reqwest`](https://docs.rs/reqwest/0.13),
//! [`reqwest_middleware`](https://docs.rs/reqwest-middleware/0.5)).
//!
//! The same engine retries anything async — a database reconnect, an RPC —
//! with [`retry`].
//!
//! # One retry layer
//!
//! Retries multiply across layers: three attempts at each of `k` layers is
//! `3^k` attempts at the bottom. Retry in one place — here, at the edge of
//! the call — and let inner layers fail fast. reqwest (≥ 0.12.23) itself
//! retries below any middleware, by default only protocol-level NACKs (an
//! HTTP/2 `REFUSED_STREAM` or graceful `GOAWAY`) that prove the server did not
//! process the request, at most twice per request. Those retries are
//! invisible to this crate and safe by construction, so the two layers
//! combine without double submits; in the worst case one of our attempts is
//! three on the wire. Turn reqwest's off with
//! `ClientBuilder::retry(reqwest::retry::never())`
//! if you want one layer to count every attempt. Across services, the
//! "do not retry" verdict below keeps the retries at the innermost one.
//!
//! # In a stack of services
//!
//! Each hop sends the time its caller still waits, and only the innermost
//! hop retries:
//!
//! - every attempt carries `Request-Timeout-Ms: <ms left>`
//!   ([`DEFAULT_DEADLINE_HEADER`]; `.deadline_header(name)` renames it,
//!   `.no_deadline_header()` turns it off);
//! - [`InheritDeadlineLayer`], a tower layer on the receiving service, runs
//!   each handler inside an [`InheritedDeadline`]: the calls it makes with
//!   this crate get `deadline = min(their own, the time left)`; a request
//!   whose time is spent is answered `504` with `Stripe-Should-Retry:
//!   false` without running the handler (work spawned onto another task
//!   carries the scope explicitly, see [`InheritedDeadline`]), and a call
//!   the handler makes with less time left than `min_attempt_window` sends
//!   nothing: it fails at once, `deadline`, with a [`RetryError`] whose
//!   `is_timeout()` is true;
//! - when such a call gives up, the service answers its caller with
//!   `Stripe-Should-Retry: false` ([`GiveUp`]; the layer adds it to an
//!   answer a client would retry), and the caller does not retry.
//!
//! The layer lives here, not in a server crate, because it and the client
//! share the task-local that carries the deadline.
//!
//! # Cargo features
//!
//! None is on by default: the TLS stack is your application's choice,
//! made by its own reqwest dependency (a plain `reqwest = "0.13"` brings
//! reqwest's default TLS; the one reqwest in the tree serves both).
//!
//! - `default-tls`: reqwest's own default TLS for the re-exported
//!   [`reqwest`](https://docs.rs/reqwest/0.13), for an application whose reqwest has none. Without
//!   any TLS an https URL fails with `invalid URL, scheme is not http`.
//! - `native-tls`: the platform's TLS (OpenSSL on Linux) instead.
//! - `metrics`: every counter of [`Metrics`], the attempts-per-call
//!   histogram and OpenTelemetry's `http.client.request.duration` are also
//!   published through the [`metrics`](https://docs.rs/metrics) facade,
//!   labelled by host, to whichever exporter (Prometheus, OpenTelemetry,
//!   StatsD) the application installs; names and labels in `metric_names`.

// docs.rs (`--cfg docsrs`, see Cargo.toml) marks each feature-gated item
// with the feature it needs; on today's nightly `doc_cfg` does it alone.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

/// The guide: the long form of the README, one page per topic, rendered
/// here (the same pages are `docs/` in the repository, where `cargo test`
/// compiles every snippet in them). Documentation only, no items.
///
/// In reading order (the list below this one is rustdoc's, alphabetical):
///
/// 1. [`using`](_guide::using): start here — versions, retry admission, per-request
///    options and the report, the defaults and every knob.
/// 2. [`migrating`](_guide::migrating): coming from reqwest-retry.
/// 3. [`production`](_guide::production): replicas, hedging, other retry layers, a stack of
///    services.
/// 4. [`observability`](_guide::observability): the report, tracing and metrics.
/// 5. [`testing`](_guide::testing): testing code that retries.
/// 6. [`call`](_guide::call): the `call` command and the payments demo.
/// 7. [`layout`](_guide::layout): the repository's layout, for contributors.
// Rendered by `cargo doc`; `cargo test --doc` (which sets `doc` too)
// compiles the pages through `GuideDoctests`, with the dependencies
// their examples use.
#[cfg(all(doc, not(doctest)))]
pub mod _guide {
    /// Using it: versions, retry admission, per-request options and the report, the status table, the defaults, every knob, retrying anything async.
    pub mod using {
        #![doc = include_str!("../docs/using.md")]
    }
    /// In production: one bad replica, hedged requests, other retry layers, a stack of services.
    pub mod production {
        #![doc = include_str!("../docs/production.md")]
    }
    /// Coming from reqwest-retry: the swap, the table of equivalents, the deliberate differences.
    pub mod migrating {
        #![doc = include_str!("../docs/migrating.md")]
    }
    /// Observability: the report, tracing, metrics and the Prometheus scrape.
    pub mod observability {
        #![doc = include_str!("../docs/observability.md")]
    }
    /// Testing code that retries.
    pub mod testing {
        #![doc = include_str!("../docs/testing.md")]
    }
    /// The `call` command and the payments demo.
    pub mod call {
        #![doc = include_str!("../docs/call.md")]
    }
    /// The repository's layout, for contributors.
    pub mod layout {
        #![doc = include_str!("../docs/layout.md")]
    }
}

// The floors, bottom up: each uses only the floors below it (each
// folder's `mod.rs` says which), and none reaches back up.
mod builder;
mod decisions;
mod engine;
mod http;
mod signals;
mod vocabulary;

pub use reqwest;
pub use reqwest_middleware;

// The vocabulary: partitions, keys, the report, errors.
pub use vocabulary::{
    is_idempotent, BodySource, ConfigError, IdempotencyKey, KeyError, KeyFormat, KeyGenerator,
    Partition, ReportSlot, RetryReport, RetryReportExt, Route, StopReason, MAX_KEY_LEN,
};
// What the server said.
pub use signals::{
    classify_error, classify_status, rate_limit, retry_after, Class, Classifier, DefaultClassifier,
    HttpAttempt,
};
// The decisions.
pub use decisions::{
    AdaptiveAdmission, AdaptiveConfig, Admission, AttemptRecord, AttemptResult, Backoff,
    CircuitBreakerConfig, FirstAttemptPacing, Grant, GrantSource, HedgeConfig, Jitter, NoAdmission,
    ReplicaTable, RetryAdmission, RetryKind, RetryRequest, TokenBucket, TokenBucketConfig,
};
// The engine.
#[cfg(feature = "metrics")]
pub use engine::{describe_metrics, names as metric_names};
pub use engine::{
    retry, retry_if_time, retry_in, AttemptContext, BoxFuture, Clock, InheritedDeadline,
    ManualClock, Metrics, MetricsSnapshot, Outcome, RequestOptions, RetryPolicy, Sleeper,
    SystemClock, TokioSleeper,
};
// HTTP.
pub use http::{
    GiveUp, InheritDeadline, InheritDeadlineFuture, InheritDeadlineLayer, ReplicaResolver,
    RetryError, RetryMiddleware, DEFAULT_DEADLINE_HEADER, DEFAULT_VERDICT_HEADER,
};
// The builder, on top.
pub use builder::RetryPolicyBuilder;
