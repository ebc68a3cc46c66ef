//! HTTP: the [`RetryMiddleware`] that puts the engine on a
//! `reqwest_middleware` client — one attempt, the hedge race, the judge of
//! an answer, the deadline header — and, on the receiving side, the
//! [`InheritDeadlineLayer`] that reads the header and the [`GiveUp`]
//! answer of a service whose own call gave up.
//!
//! May use: `vocabulary`, `signals`, `decisions`, `engine`.
//!
//! ```
//! use reqwest_safe_retry::{RetryMiddleware, RetryPolicy};
//!
//! let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
//!     .with(RetryMiddleware::new(RetryPolicy::default()))
//!     .build();
//! # drop(client);
//! ```

mod attempt;
mod deadline_header;
mod error;
mod give_up;
mod hedge_race;
mod inbound;
mod judge;
mod middleware;
mod replica_resolver;

pub use deadline_header::DEFAULT_DEADLINE_HEADER;
pub use error::RetryError;
pub use give_up::{GiveUp, DEFAULT_VERDICT_HEADER};
pub use inbound::{InheritDeadline, InheritDeadlineFuture, InheritDeadlineLayer};
pub use middleware::RetryMiddleware;
pub use replica_resolver::ReplicaResolver;
