//! What the caller learns about a logical operation: attempts, delays, the
//! key, and why the loop stopped.

use std::fmt;
use std::time::Duration;

/// Why the retry loop stopped. An enum, not a string, so callers can match.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum StopReason {
    /// The last attempt succeeded.
    Success,
    /// The outcome was permanent: retrying cannot help.
    Permanent,
    /// The outcome was transient but the maximum number of attempts was made.
    AttemptsExhausted,
    /// Another attempt would not fit before the deadline.
    Deadline,
    /// The client-wide retry budget had no token for another attempt.
    BudgetExhausted,
    /// The server's Retry-After exceeds the configured maximum or the time
    /// left before the deadline.
    RetryAfterTooLong,
    /// A non-idempotent request without an idempotency key failed in a way
    /// that does not prove it never reached the server.
    NotIdempotent,
    /// The request body is a stream that cannot be sent twice.
    BodyNotCloneable,
    /// The server said not to retry (`Stripe-Should-Retry: false`).
    ServerSaidNo,
}

impl StopReason {
    /// The snake_case name used in JSON and logs.
    pub fn as_str(&self) -> &'static str {
        match self {
            StopReason::Success => "success",
            StopReason::Permanent => "permanent",
            StopReason::AttemptsExhausted => "attempts_exhausted",
            StopReason::Deadline => "deadline",
            StopReason::BudgetExhausted => "budget_exhausted",
            StopReason::RetryAfterTooLong => "retry_after_too_long",
            StopReason::NotIdempotent => "not_idempotent",
            StopReason::BodyNotCloneable => "body_not_cloneable",
            StopReason::ServerSaidNo => "server_said_no",
        }
    }
}

impl fmt::Display for StopReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The record of one logical operation.
///
/// The middleware puts it in the final response's extensions
/// (`response.extensions().get::<RetryReport>()`) and in the
/// [`crate::RetryError`] of a failed call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryReport {
    pub(crate) attempts: u32,
    pub(crate) delays: Vec<Duration>,
    pub(crate) idempotency_key: Option<String>,
    pub(crate) stop_reason: StopReason,
    pub(crate) retry_after_honoured: u32,
}

impl RetryReport {
    pub(crate) fn new() -> Self {
        RetryReport {
            attempts: 0,
            delays: Vec::new(),
            idempotency_key: None,
            stop_reason: StopReason::Success,
            retry_after_honoured: 0,
        }
    }

    /// Attempts made, the first included.
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// The delays slept before each retry, in order.
    pub fn delays(&self) -> &[Duration] {
        &self.delays
    }

    /// The Idempotency-Key every attempt carried, if any.
    pub fn idempotency_key(&self) -> Option<&str> {
        self.idempotency_key.as_deref()
    }

    /// Why the loop stopped.
    pub fn stop_reason(&self) -> StopReason {
        self.stop_reason
    }

    /// How many of the delays were set by a server's Retry-After.
    pub fn retry_after_honoured(&self) -> u32 {
        self.retry_after_honoured
    }
}
