//! Make service-to-service HTTP calls safe to retry.
//!
//! `reqwest-safe-retry` is a [`reqwest_middleware`] middleware. Add it to a
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
//!   cannot finish inside it;
//! - a **report** of what happened, in the response's extensions.
//!
//! ```no_run
//! use reqwest_safe_retry::{RetryMiddleware, RetryPolicy, RetryReport};
//!
//! # async fn run() -> Result<(), reqwest_middleware::Error> {
//! let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
//!     .with(RetryMiddleware::new(RetryPolicy::default()))
//!     .build();
//!
//! let response = client
//!     .post("http://payments.internal/payments")
//!     .body(r#"{"account":"acme","amount":1200}"#)
//!     .send()
//!     .await?;
//! let report = response.extensions().get::<RetryReport>().expect("set by the middleware");
//! println!("{} attempt(s), stopped: {}", report.attempts(), report.stop_reason());
//! # Ok(()) }
//! ```
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
//! if you want one layer to count every attempt.

#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

mod admission;
mod backoff;
mod builder;
mod classify;
mod engine;
mod error;
mod idempotency;
mod keygen;
mod metrics;
mod middleware;
mod options;
mod policy;
mod report;
pub mod retry_after;
mod runtime;
mod safety;

/// The README's examples compile as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

pub use reqwest;
pub use reqwest_middleware;

pub use admission::{
    AdaptiveAdmission, AdaptiveConfig, Admission, AttemptRecord, AttemptResult,
    CircuitBreakerConfig, Grant, GrantSource, NoAdmission, Partition, RetryAdmission, RetryKind,
    RetryRequest, TokenBucket, TokenBucketConfig,
};
pub use backoff::{Backoff, Jitter};
pub use builder::RetryPolicyBuilder;
pub use classify::{
    classify_error, classify_status, Class, Classifier, DefaultClassifier, HttpAttempt,
};
pub use engine::{retry, retry_in, AttemptContext, Outcome};
pub use error::{ConfigError, KeyError, RetryError};
pub use idempotency::{is_idempotent, IdempotencyKey, KeyFormat, KeyGenerator, MAX_KEY_LEN};
pub use metrics::{Metrics, MetricsSnapshot};
pub use middleware::RetryMiddleware;
pub use options::RequestOptions;
pub use policy::RetryPolicy;
pub use report::{ReportSlot, RetryReport, RetryReportExt, StopReason};
pub use runtime::{BoxFuture, Clock, ManualClock, Sleeper, SystemClock, TokioSleeper};
