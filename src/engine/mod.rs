//! The engine: the attempt loop, generic over any async operation, and
//! what it runs on — the [`RetryPolicy`] and its settings, a request's own
//! [`RequestOptions`], the deadline and the time a caller still waits, the
//! injectable [`Clock`] and [`Sleeper`], and the counters ([`Metrics`]).
//! It reads the decisions below it and sleeps where they say; it knows
//! nothing of HTTP.
//!
//! May use: `vocabulary`, `signals`, `decisions`.
//!
//! Each turn of the loop, top to bottom: classify → is another attempt
//! allowed → delay (which sees the server's hint) → does it fit the
//! deadline → sleep → admission (which may wait, bounded by the deadline)
//! → next.
//!
//! ```
//! use reqwest_safe_retry::retry::{retry, Outcome};
//! use reqwest_safe_retry::{RetryPolicy, StopReason};
//!
//! // Paused time: the sleeps between attempts end at once.
//! # tokio::runtime::Builder::new_current_thread().enable_all().start_paused(true).build().unwrap().block_on(async {
//! let policy = RetryPolicy::default();
//!
//! let mut calls = 0;
//! let (value, report) = retry(&policy, |ctx| {
//!     calls += 1;
//!     async move {
//!         // Reconnect to a database, call an RPC… and classify the outcome.
//!         if ctx.attempt() < 3 {
//!             Outcome::transient(Err("connection refused"))
//!         } else {
//!             Outcome::success(Ok(42))
//!         }
//!     }
//! })
//! .await;
//! assert_eq!(value, Ok(42));
//! assert_eq!(report.attempts(), 3);
//! assert_eq!(report.stop_reason(), StopReason::Success);
//! assert_eq!(report.delays().len(), 2);
//! # });
//! ```

mod admit;
pub(crate) mod deadline;
mod metrics;
mod options;
mod outcome;
mod policy;
mod run;
mod runtime;

pub use deadline::InheritedDeadline;
pub(crate) use deadline::{shorter, Limits};
#[cfg(feature = "metrics")]
pub use metrics::{describe_metrics, names};
pub use metrics::{Metrics, MetricsSnapshot};
pub(crate) use options::KeyChoice;
pub use options::RequestOptions;
pub(crate) use outcome::{listened, Elsewhere, Signal, Verdict};
pub use outcome::{AttemptContext, Outcome};
pub use policy::RetryPolicy;
pub(crate) use policy::{Replicas, Rng, Settings};
pub use run::{retry, retry_if_time, retry_in};
pub(crate) use run::{Attempt, Run};
#[cfg(any(test, feature = "test-util"))]
pub use runtime::ManualClock;
pub use runtime::{BoxFuture, Clock, Sleeper, SystemClock, TokioSleeper};
