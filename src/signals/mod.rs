//! What the server said: pure readings of one answer — its class
//! (transient or permanent, and why), its Retry-After, its rate-limit
//! fields, its "do not retry" verdict, the kind of a transport failure.
//! Functions of the status, the headers and the error alone: no state, no
//! clock but the one passed in, no decision.
//!
//! May use: `vocabulary`.
//!
//! ```
//! use std::time::{Duration, SystemTime};
//! use reqwest_safe_retry::Class;
//! use reqwest_safe_retry::classify::{classify_status, retry_after};
//!
//! assert_eq!(classify_status(http::StatusCode::SERVICE_UNAVAILABLE, false), Class::Transient);
//! assert_eq!(classify_status(http::StatusCode::NOT_FOUND, false), Class::Permanent);
//! let wait = retry_after::parse("120", None, SystemTime::now());
//! assert_eq!(wait, Some(Duration::from_secs(120)));
//! ```

mod classify;
pub mod rate_limit;
pub mod retry_after;

pub use classify::{
    classify_error, classify_status, Class, Classifier, DefaultClassifier, HttpAttempt,
};
pub(crate) use classify::{
    is_connect, is_timeout, retried_by_a_keyed_client, server_verdict, transport_failure,
    TransportFailure,
};
