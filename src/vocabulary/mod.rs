//! The vocabulary: the words every floor speaks. A [`Partition`] (whose
//! state a decision is about) and its [`Route`]s, an [`IdempotencyKey`] (what makes a request
//! safe to send again), the [`RetryReport`] (what a call came to) and the
//! errors of a setting or a key. Nothing here decides, waits or sends.
//!
//! May use: nothing of the crate, only std and external crates.
//!
//! ```
//! use reqwest_safe_retry::{IdempotencyKey, StopReason};
//! use reqwest_safe_retry::admission::Partition;
//!
//! let key = IdempotencyKey::new("order-7731").unwrap();
//! assert_eq!(key.as_str(), "order-7731");
//! let host = Partition::of_url(&"https://payments.internal/v1".parse().unwrap());
//! assert_ne!(host, Partition::SINGLE);
//! assert_eq!(StopReason::BudgetExhausted.as_str(), "budget_exhausted");
//! ```

mod draw;
mod error;
mod future;
mod idempotency;
mod keygen;
mod lock;
mod partition;
pub(crate) mod replay;
mod report;
mod route;

pub(crate) use draw::uniform;
pub use error::{ConfigError, KeyError};
pub(crate) use future::BoxFuture;
pub(crate) use idempotency::{derivation_seed, scoped_derivation_seed, SharedKey};
pub use idempotency::{is_idempotent, IdempotencyKey, KeyFormat, KeyGenerator, MAX_KEY_LEN};
pub(crate) use lock::lock;
pub(crate) use partition::DigestState;
pub use partition::Partition;
pub use replay::BodySource;
pub use report::{ReportSlot, RetryReport, RetryReportExt, StopReason};
pub use route::Route;
