//! Per-request settings, passed through reqwest-middleware's request
//! extensions.
//!
//! ```no_run
//! use std::time::Duration;
//! use reqwest_safe_retry::{IdempotencyKey, RequestOptions, RetryMiddleware, RetryPolicy};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
//!     .with(RetryMiddleware::new(RetryPolicy::default()))
//!     .build();
//! let response = client
//!     .post("http://payments.internal/payments")
//!     .with_extension(
//!         RequestOptions::new()
//!             .idempotency_key(IdempotencyKey::new("order-42-charge")?)
//!             .deadline(Duration::from_secs(5)),
//!     )
//!     .send()
//!     .await?;
//! # Ok(()) }
//! ```

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::decisions::HedgeConfig;
use crate::signals::Classifier;
use crate::vocabulary::{IdempotencyKey, Partition};

/// Settings for one request that override the policy's.
#[derive(Clone, Default)]
#[must_use]
pub struct RequestOptions {
    pub(crate) key: KeyChoice,
    pub(crate) deadline: Option<Duration>,
    pub(crate) max_attempts: Option<u32>,
    pub(crate) attempt_timeout: Option<Duration>,
    pub(crate) classifier: Option<Arc<dyn Classifier>>,
    pub(crate) partition: Option<Partition>,
    /// `Some(None)`: not hedged; `Some(Some(c))`: hedged as `c` says.
    pub(crate) hedge: Option<Option<HedgeConfig>>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) enum KeyChoice {
    /// The policy decides by method.
    #[default]
    Auto,
    /// Use this key on every attempt.
    Use(IdempotencyKey),
    /// Attach none.
    Skip,
}

impl RequestOptions {
    /// No overrides.
    pub fn new() -> Self {
        RequestOptions::default()
    }

    /// Use this key on every attempt (e.g. derived from an order id), whatever
    /// the method.
    pub fn idempotency_key(mut self, key: IdempotencyKey) -> Self {
        self.key = KeyChoice::Use(key);
        self
    }

    /// Attach no key to this request. A non-idempotent request without a key
    /// is then retried only after a connect error.
    pub fn no_idempotency_key(mut self) -> Self {
        self.key = KeyChoice::Skip;
        self
    }

    /// Total time for this logical operation. Zero is ignored (the policy's
    /// deadline applies).
    ///
    /// It is a budget to use: the first attempt is sent whatever its
    /// length, with the time left as its timeout, as reqwest's own
    /// `timeout` would be, even when it is shorter than the policy's
    /// `min_attempt_window` (a 50 ms deadline to a service that answers
    /// in 2 ms completes). The window still guards what follows: a retry
    /// starts only with the window left, and a deadline inherited from an
    /// inbound request ([`crate::deadline::InheritedDeadline`]) that leaves less than
    /// the window sends nothing. When an inherited deadline is shorter
    /// than this one, it is the inherited one that binds, window included.
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = Some(deadline).filter(|d| !d.is_zero());
        self
    }

    /// Most attempts for this logical operation (0 is taken as 1).
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = Some(n.max(1));
        self
    }

    /// Time limit for each attempt of this request. Zero is ignored (the
    /// policy's attempt timeout applies).
    pub fn attempt_timeout(mut self, timeout: Duration) -> Self {
        self.attempt_timeout = Some(timeout).filter(|d| !d.is_zero());
        self
    }

    /// Decide this request's retry admission in `partition` instead of its
    /// host's (scheme, host and port): a route, a tenant, or several hosts
    /// behind one name that fail together.
    pub fn partition(mut self, partition: Partition) -> Self {
        self.partition = Some(partition);
        self
    }

    /// Hedge this request as `config` says, whatever the policy's hedging
    /// (the host's latencies and hedge budget are the same ones the
    /// policy's hedging uses; this request's first attempt earns the budget
    /// its own `max_extra_load`). A `config` with a setting out of range
    /// (see [`HedgeConfig`]) is ignored: the options keep what they had
    /// (the policy's hedging, unless set before).
    pub fn hedge(mut self, config: HedgeConfig) -> Self {
        if config.validate().is_ok() {
            self.hedge = Some(Some(config));
        }
        self
    }

    /// Never hedge this request, whatever the policy's hedging.
    pub fn no_hedge(mut self) -> Self {
        self.hedge = Some(None);
        self
    }

    /// A classifier asked before the policy's.
    pub fn classifier(mut self, classifier: impl Classifier) -> Self {
        self.classifier = Some(Arc::new(classifier));
        self
    }
}

impl fmt::Debug for RequestOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RequestOptions")
            .field("key", &self.key)
            .field("deadline", &self.deadline)
            .field("max_attempts", &self.max_attempts)
            .field("attempt_timeout", &self.attempt_timeout)
            .field("classifier", &self.classifier.is_some())
            .field("partition", &self.partition)
            .field("hedge", &self.hedge)
            .finish()
    }
}
