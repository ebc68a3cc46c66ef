//! The crate's errors: small, opaque, with lowercase messages.

use std::fmt;

use crate::report::RetryReport;

/// A setting that cannot work, reported by a builder's `build()` or a
/// validating constructor. It names the setting.
///
/// ```
/// use std::time::Duration;
/// use reqwest_safe_retry::RetryPolicy;
///
/// let err = RetryPolicy::builder()
///     .deadline(Duration::from_millis(50))
///     .min_attempt_window(Duration::from_millis(100))
///     .build()
///     .unwrap_err();
/// assert_eq!(err.setting(), "deadline");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    setting: &'static str,
    message: &'static str,
}

impl ConfigError {
    /// An error that names no setting (a standalone constructor).
    pub(crate) fn new(message: &'static str) -> Self {
        ConfigError {
            setting: "",
            message,
        }
    }

    /// An error about `setting`.
    pub(crate) fn named(setting: &'static str, message: &'static str) -> Self {
        ConfigError { setting, message }
    }

    /// The same error, naming `setting` when it named none.
    pub(crate) fn in_setting(mut self, setting: &'static str) -> Self {
        if self.setting.is_empty() {
            self.setting = setting;
        }
        self
    }

    /// The builder setting (or config field) that was wrong, such as
    /// `max_attempts` or `budget.capacity`; empty when a standalone
    /// constructor was called.
    pub fn setting(&self) -> &'static str {
        self.setting
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.setting.is_empty() {
            write!(f, "invalid retry configuration: {}", self.message)
        } else {
            write!(
                f,
                "invalid retry configuration: {}: {}",
                self.setting, self.message
            )
        }
    }
}

impl std::error::Error for ConfigError {}

/// An idempotency key that cannot be sent: empty, longer than 255
/// characters, holding characters an HTTP header cannot carry, or a
/// request carrying its key header more than once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyError {
    reason: &'static str,
}

impl KeyError {
    pub(crate) fn new(reason: &'static str) -> Self {
        KeyError { reason }
    }
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid idempotency key: {}", self.reason)
    }
}

impl std::error::Error for KeyError {}

/// The circuit breaker refused a call: its host keeps failing.
#[derive(Debug)]
pub(crate) struct CircuitOpen;

impl fmt::Display for CircuitOpen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("circuit open: the host keeps failing, the call was not sent")
    }
}

impl std::error::Error for CircuitOpen {}

/// The error a caller gets when the request was refused before anything was
/// sent (an idempotency key that cannot be sent, or a circuit breaker that
/// is open).
///
/// It carries the [`RetryReport`]; [`std::error::Error::source`] is the
/// underlying error. The middleware returns it inside
/// [`reqwest_middleware::Error::Middleware`]; [`RetryError::from_middleware`]
/// finds it again. A transport error is *not* wrapped: it comes back as
/// reqwest made it, and the report goes to a [`crate::ReportSlot`].
#[derive(Debug)]
pub struct RetryError {
    report: RetryReport,
    source: reqwest_middleware::Error,
}

impl RetryError {
    pub(crate) fn new(report: RetryReport, source: reqwest_middleware::Error) -> Self {
        RetryError { report, source }
    }

    /// What the retry loop did before giving up.
    pub fn report(&self) -> &RetryReport {
        &self.report
    }

    /// The last underlying error.
    pub fn last_error(&self) -> &reqwest_middleware::Error {
        &self.source
    }

    /// The underlying error, taking ownership.
    pub fn into_last_error(self) -> reqwest_middleware::Error {
        self.source
    }

    /// Finds the `RetryError` inside an error returned by a
    /// `ClientWithMiddleware` that uses [`crate::RetryMiddleware`].
    pub fn from_middleware(err: &reqwest_middleware::Error) -> Option<&RetryError> {
        match err {
            reqwest_middleware::Error::Middleware(inner) => inner.downcast_ref::<RetryError>(),
            reqwest_middleware::Error::Reqwest(_) => None,
        }
    }

    /// Whether the last error was a timeout (per-attempt or deadline).
    pub fn is_timeout(&self) -> bool {
        crate::classify::is_timeout(&self.source)
    }

    /// Whether the last error was a failure to connect.
    pub fn is_connect(&self) -> bool {
        crate::classify::is_connect(&self.source)
    }
}

impl fmt::Display for RetryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "request failed after {} attempt{} ({})",
            self.report.attempts(),
            if self.report.attempts() == 1 { "" } else { "s" },
            self.report.stop_reason()
        )
    }
}

impl std::error::Error for RetryError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}
