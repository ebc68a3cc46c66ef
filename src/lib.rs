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
//!   never holds back another's (see [`admission`]); an opt-in
//!   per-host circuit breaker;
//! - a **deadline**: it never sleeps past it, and never starts an attempt that
//!   cannot finish inside it; the time left travels downstream in
//!   `Request-Timeout-Ms`, and inside a handler wrapped by
//!   [`InheritDeadlineLayer`](deadline::InheritDeadlineLayer) every call inherits its caller's (see
//!   "In a stack of services" below);
//! - opt-in **hedged requests** ([`hedging`]): a second copy of a read
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
//! with [`retry::retry`](retry::retry()).
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
//!   ([`DEFAULT_DEADLINE_HEADER`](deadline::DEFAULT_DEADLINE_HEADER); `.deadline_header(name)` renames it,
//!   `.no_deadline_header()` turns it off);
//! - [`InheritDeadlineLayer`](deadline::InheritDeadlineLayer), a tower layer on the receiving service, runs
//!   each handler inside an [`InheritedDeadline`](deadline::InheritedDeadline): the calls it makes with
//!   this crate get `deadline = min(their own, the time left)`; a request
//!   whose time is spent is answered `504` with `Stripe-Should-Retry:
//!   false` without running the handler (work spawned onto another task
//!   carries the scope explicitly, see [`InheritedDeadline`](deadline::InheritedDeadline)), and a call
//!   the handler makes with less time left than `min_attempt_window` sends
//!   nothing: it fails at once, `deadline`, with a [`RetryError`] whose
//!   `is_timeout()` is true;
//! - when such a call gives up, the service answers its caller with
//!   `Stripe-Should-Retry: false` ([`GiveUp`](deadline::GiveUp); the layer adds it to an
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
//! - `metrics`: every counter of [`Metrics`](observability::Metrics), the attempts-per-call
//!   histogram and OpenTelemetry's `http.client.request.duration` are also
//!   published through the [`metrics`](https://docs.rs/metrics) facade,
//!   labelled by host, to whichever exporter (Prometheus, OpenTelemetry,
//!   StatsD) the application installs; names and labels in
//!   `observability::metric_names`.
//! - `test-util`, for `[dev-dependencies]` as tokio's: `time::ManualClock`
//!   and the builder's `manual_clock`, `seed` and `rng`, for exact delays in
//!   tests; a production build has no seed that many clients could share.
//!
//! # Where the names are
//!
//! The root holds what the quick start above and the table of equivalents
//! ([`migrating`](_guide::migrating)) name, so a first program needs one
//! `use` line; the rest is in the modules below, one per concern, each
//! name at one path (`checks/tests/api.rs` holds the root to its list).

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

// The front door: what the quick start and the table of equivalents name
// (see "Where the names are" above).
pub use builder::RetryPolicyBuilder;
pub use decisions::Jitter;
pub use engine::{RequestOptions, RetryPolicy};
pub use http::{RetryError, RetryMiddleware};
pub use signals::{Class, HttpAttempt};
pub use vocabulary::{
    ConfigError, IdempotencyKey, ReportSlot, RetryReport, RetryReportExt, StopReason,
};

pub mod admission {
    //! Retry admission (whether a retry or a hedge may go now, per
    //! [`Partition`]): [`AdaptiveAdmission`] by default, [`TokenBucket`],
    //! [`NoAdmission`] or your [`RetryAdmission`]; and the circuit breaker.
    //!
    //! ```
    //! use reqwest_safe_retry::admission::{AdaptiveConfig, CircuitBreakerConfig, Partition};
    //! use reqwest_safe_retry::{RequestOptions, RetryPolicy};
    //!
    //! let max_admission_wait = std::time::Duration::from_secs(2);
    //! let policy = RetryPolicy::builder()
    //!     .adaptive_admission(AdaptiveConfig { max_admission_wait, ..AdaptiveConfig::default() })
    //!     .circuit_breaker(CircuitBreakerConfig::default())
    //!     .build()
    //!     .unwrap();
    //! // One tenant's calls decided apart from the rest of its host's.
    //! let options = RequestOptions::new().partition(Partition::named("tenant-7"));
    //! # drop((policy, options));
    //! ```
    pub use crate::decisions::{
        AdaptiveAdmission, AdaptiveConfig, Admission, AttemptRecord, AttemptResult,
        CircuitBreakerConfig, Grant, GrantSource, NoAdmission, RetryAdmission, RetryKind,
        RetryRequest, TokenBucket, TokenBucketConfig,
    };
    pub use crate::vocabulary::{Partition, Route};
}

pub mod pacing {
    //! Rate-limit pacing: after a 429 a route's retries go at the rate it
    //! accepts, and a spent quota holds its new calls until the reset
    //! ([`FirstAttemptPacing`]); [`rate_limit`] reads the fields behind it.
    //!
    //! ```
    //! use reqwest_safe_retry::pacing::rate_limit;
    //!
    //! let mut headers = http::HeaderMap::new();
    //! headers.insert("ratelimit", r#""day";r=0;t=60"#.parse().unwrap());
    //! let limit = rate_limit::from_headers(&headers, std::time::SystemTime::now()).unwrap();
    //! assert!(limit.exhausted());
    //! // `.pace_first_attempts(true)` holds a throttled route's new calls too.
    //! ```
    pub use crate::decisions::FirstAttemptPacing;
    pub use crate::signals::rate_limit;
}

pub mod hedging {
    //! Hedged requests, opt-in ([`HedgeConfig`]): a second copy of a read
    //! slower than its host's p95, the first answer winning, at most 5 %
    //! more requests, each hedge admitted like a retry.
    //!
    //! ```
    //! use reqwest_safe_retry::{hedging::HedgeConfig, RetryPolicy};
    //!
    //! let hedge = HedgeConfig { percentile: 0.99, ..HedgeConfig::default() };
    //! let policy = RetryPolicy::builder().hedge(hedge).build().unwrap();
    //! assert_eq!(policy.hedge().map(|h| h.percentile), Some(0.99));
    //! ```
    pub use crate::decisions::HedgeConfig;
}

pub mod replicas {
    //! One bad replica: the [`ReplicaResolver`], installed on the reqwest
    //! client, sends a retry to another address of the host; the policy's
    //! [`ReplicaTable`] keeps which addresses failed.
    //!
    //! ```
    //! use reqwest_safe_retry::{RetryMiddleware, RetryPolicy};
    //!
    //! let policy = RetryPolicy::default();
    //! let http = reqwest::Client::builder().dns_resolver(policy.replica_resolver()).build();
    //! let client = reqwest_middleware::ClientBuilder::new(http.unwrap())
    //!     .with(RetryMiddleware::new(policy.clone()))
    //!     .build();
    //! assert!(policy.replicas().is_empty());
    //! # drop(client);
    //! ```
    pub use crate::decisions::ReplicaTable;
    pub use crate::http::ReplicaResolver;
}

pub mod replay {
    //! Bodies sent again: a streamed body is kept as it goes, up to
    //! `body_replay_limit`, and replayed on a retry or a hedge; a
    //! [`BodySource`] in the request remakes it per attempt, at any size.
    //!
    //! ```
    //! use reqwest_safe_retry::{replay::BodySource, RetryMiddleware, RetryPolicy};
    //!
    //! let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
    //!     .with(RetryMiddleware::new(RetryPolicy::default()))
    //!     .build();
    //! let _ = client // each attempt gets the body afresh (a file reopened, say)
    //!     .put("http://uploads.internal/report.csv")
    //!     .with_extension(BodySource::new(|| reqwest::Body::from("id,amount\n7,1200\n")));
    //! ```
    pub use crate::vocabulary::BodySource;
}

pub mod observability {
    //! The counters every clone of a policy shares ([`Metrics`], read as a
    //! [`MetricsSnapshot`]); with the `metrics` feature, the names they are
    //! published under (`metric_names`) and `describe_metrics`. One call's
    //! story is its [`crate::RetryReport`]; tracing needs nothing from here.
    //!
    //! ```
    //! let policy = reqwest_safe_retry::RetryPolicy::default();
    //! let snapshot: reqwest_safe_retry::observability::MetricsSnapshot = policy.metrics().snapshot();
    //! assert_eq!(snapshot.calls, 0);
    //! ```
    #[cfg(feature = "metrics")]
    pub use crate::engine::{describe_metrics, names as metric_names};
    pub use crate::engine::{Metrics, MetricsSnapshot};
}

pub mod classify {
    //! What an answer means: the default table ([`DefaultClassifier`],
    //! [`classify_status`], [`classify_error`]), the [`Classifier`] trait,
    //! the methods safe to repeat ([`is_idempotent`]) and the Retry-After
    //! reader; a classifier's input and answer are at the root.
    //!
    //! ```
    //! use reqwest_safe_retry::classify::{classify_status, is_idempotent};
    //! use reqwest_safe_retry::{Class, HttpAttempt, RetryPolicy};
    //!
    //! assert_eq!(classify_status(http::StatusCode::BAD_GATEWAY, false), Class::Transient);
    //! assert!(!is_idempotent(&http::Method::POST));
    //! let policy = RetryPolicy::builder() // this service's 507 clears up in seconds
    //!     .classifier(|a: &HttpAttempt| (a.status()?.as_u16() == 507).then_some(Class::Transient))
    //!     .build();
    //! # drop(policy);
    //! ```
    pub use crate::signals::{
        classify_error, classify_status, retry_after, Classifier, DefaultClassifier,
    };
    pub use crate::vocabulary::is_idempotent;
}

pub mod keys {
    //! How a call's Idempotency-Key is made and written ([`KeyGenerator`],
    //! [`KeyFormat`]) and what a key may hold ([`KeyError`],
    //! [`MAX_KEY_LEN`]); a key of your own is a [`crate::IdempotencyKey`].
    //!
    //! ```
    //! use reqwest_safe_retry::keys::{KeyFormat, KeyGenerator};
    //!
    //! let _ = reqwest_safe_retry::RetryPolicy::builder()
    //!     .key_generator(KeyGenerator::UuidV7)
    //!     .key_format(KeyFormat::StructuredField)
    //!     .build();
    //! ```
    pub use crate::vocabulary::{KeyError, KeyFormat, KeyGenerator, MAX_KEY_LEN};
}

pub mod deadline {
    //! A stack of services: the time left goes downstream
    //! ([`DEFAULT_DEADLINE_HEADER`]); [`InheritDeadlineLayer`] runs each
    //! handler in an [`InheritedDeadline`] its calls inherit; a handler
    //! whose call gave up answers [`GiveUp`] ([`DEFAULT_VERDICT_HEADER`]).
    //!
    //! ```
    //! use reqwest_safe_retry::deadline::InheritDeadlineLayer;
    //!
    //! let service = tower::ServiceBuilder::new()
    //!     .layer(InheritDeadlineLayer::new())
    //!     .service_fn(|_: http::Request<String>| async {
    //!         Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
    //!     });
    //! # drop(service);
    //! ```
    pub use crate::engine::InheritedDeadline;
    pub use crate::http::{
        GiveUp, InheritDeadline, InheritDeadlineFuture, InheritDeadlineLayer,
        DEFAULT_DEADLINE_HEADER, DEFAULT_VERDICT_HEADER,
    };
}

pub mod retry {
    //! Anything async (a reconnect, an RPC) retried by the middleware's
    //! engine: [`retry()`], [`retry_in`], [`retry_if_time`]; an attempt
    //! answers an [`Outcome`] and reads its [`AttemptContext`]. [`Backoff`]
    //! is the delay arithmetic alone.
    //!
    //! ```
    //! use reqwest_safe_retry::retry::{retry, Outcome};
    //!
    //! # tokio::runtime::Builder::new_current_thread().enable_all().start_paused(true).build().unwrap().block_on(async {
    //! let policy = reqwest_safe_retry::RetryPolicy::default();
    //! let (value, report) = retry(&policy, |ctx| async move {
    //!     match ctx.attempt() {
    //!         1 | 2 => Outcome::transient(Err("connection refused")),
    //!         _ => Outcome::success(Ok(42)),
    //!     }
    //! })
    //! .await;
    //! assert_eq!((value, report.attempts()), (Ok(42), 3));
    //! # });
    //! ```
    pub use crate::decisions::Backoff;
    pub use crate::engine::{retry, retry_if_time, retry_in, AttemptContext, Outcome};
}

pub mod time {
    //! Time: a [`Clock`] and a [`Sleeper`], tokio's by default
    //! ([`SystemClock`], [`TokioSleeper`]: `tokio::time::pause` applies);
    //! the builder's `clock` and `sleeper` take yours. With `test-util`,
    //! for tests, `ManualClock`, whose sleeps return at once, move it and
    //! are recorded (with the builder's `manual_clock`, `seed` and `rng`).
    //!
    //! ```
    //! use reqwest_safe_retry::time::{BoxFuture, Sleeper};
    //!
    //! /// tokio's sleep, cut short once shutdown begins.
    //! struct UntilShutdown(tokio::sync::watch::Receiver<bool>);
    //!
    //! impl Sleeper for UntilShutdown {
    //!     fn sleep(&self, duration: std::time::Duration) -> BoxFuture<()> {
    //!         let mut shutdown = self.0.clone();
    //!         Box::pin(async move {
    //!             tokio::select! {
    //!                 _ = tokio::time::sleep(duration) => {}
    //!                 _ = shutdown.wait_for(|down| *down) => {}
    //!             }
    //!         })
    //!     }
    //! }
    //!
    //! let (_stop, shutdown) = tokio::sync::watch::channel(false);
    //! let _ = reqwest_safe_retry::RetryPolicy::builder().sleeper(UntilShutdown(shutdown));
    //! ```
    // `test`: the crate's own unit tests use it without the feature.
    #[cfg(any(test, feature = "test-util"))]
    #[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
    pub use crate::engine::ManualClock;
    pub use crate::engine::{BoxFuture, Clock, Sleeper, SystemClock, TokioSleeper};
}
