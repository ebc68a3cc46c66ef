//! The errors of an HTTP call that was refused before anything was sent:
//! small, opaque, with lowercase messages.

use std::fmt;

use crate::vocabulary::RetryReport;

/// The circuit breaker refused a call: its host keeps failing.
#[derive(Debug)]
pub(crate) struct CircuitOpen;

impl fmt::Display for CircuitOpen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("circuit open: the host keeps failing, the call was not sent")
    }
}

impl std::error::Error for CircuitOpen {}

/// The call's deadline (its own, or inherited from the request being
/// served) left no room for an attempt: nothing was sent.
#[derive(Debug)]
pub(crate) struct DeadlineSpent;

impl fmt::Display for DeadlineSpent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("deadline spent: no time left for an attempt, the call was not sent")
    }
}

impl std::error::Error for DeadlineSpent {}

/// The error a caller gets when the request was refused before anything was
/// sent (an idempotency key that cannot be sent, a circuit breaker that is
/// open, or a deadline that leaves no room for an attempt).
///
/// It carries the [`RetryReport`]; [`std::error::Error::source`] is the
/// underlying error. The middleware returns it inside
/// [`reqwest_middleware::Error::Middleware`](https://docs.rs/reqwest-middleware/0.5/reqwest_middleware/enum.Error.html#variant.Middleware); [`RetryError::from_middleware`]
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

    /// Whether the last error was a timeout (per-attempt or deadline),
    /// a call refused because its deadline left no room for an attempt
    /// included.
    ///
    /// `reqwest_middleware::Error::is_timeout` answers `false` for every
    /// middleware's error, this one included: ask this error instead.
    pub fn is_timeout(&self) -> bool {
        let spent = match &self.source {
            reqwest_middleware::Error::Middleware(e) => e.is::<DeadlineSpent>(),
            reqwest_middleware::Error::Reqwest(_) => false,
        };
        spent || crate::signals::is_timeout(&self.source)
    }

    /// Whether the last error was a failure to connect.
    pub fn is_connect(&self) -> bool {
        crate::signals::is_connect(&self.source)
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
