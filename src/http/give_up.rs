//! One retry layer in a stack of services: when a call a service made on
//! its caller's behalf gives up, the service answers "do not retry".
//!
//! ```
//! use reqwest_safe_retry::StopReason;
//! use reqwest_safe_retry::deadline::GiveUp;
//!
//! // The call to the database tier gave up before its deadline.
//! let give_up = GiveUp::for_reason(StopReason::Deadline).unwrap();
//! let response: http::Response<String> = give_up.into_response();
//! assert_eq!(response.status(), 504);
//! assert_eq!(response.headers()["stripe-should-retry"], "false");
//!
//! // A call that succeeded needs no verdict.
//! assert!(GiveUp::for_reason(StopReason::Success).is_none());
//! ```

use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::StatusCode;

use crate::vocabulary::{RetryReport, StopReason};

/// The header of the "do not retry" verdict by default:
/// `Stripe-Should-Retry`, with the value `false`.
pub const DEFAULT_VERDICT_HEADER: &str = "stripe-should-retry";

/// What a service answers its caller when a call it made for it gave up.
///
/// Retries multiply down a stack: three attempts at each of four layers is
/// 81 at the bottom. The service that made the call already retried it as
/// far as its policy, its admission and its deadline allowed; its caller
/// retrying too only multiplies the load (the SRE book's "overloaded; don't
/// retry", Finagle's non-retryable nack). So the answer carries
/// `Stripe-Should-Retry: false`, the verdict this crate's client honours
/// by default (and Stripe's SDKs do), and the caller stops at once with
/// [`StopReason::ServerSaidNo`]. Only the innermost layer retries.
///
/// The status says what happened:
///
/// | the call stopped with | status |
/// |---|---|
/// | `Deadline` | 504 Gateway Timeout |
/// | `Permanent` (with no response to pass on: a decode error, say) | 502 Bad Gateway |
/// | any other reason (`AttemptsExhausted`, `BudgetExhausted`, `RetryAfterTooLong`, `ServerSaidNo`, …) | 503 Service Unavailable |
///
/// When the call did get a response (a 503 after its last attempt), pass
/// that on and add the verdict with [`GiveUp::add_verdict`] instead.
/// [`crate::deadline::InheritDeadlineLayer`] adds it by itself to a handler's answer
/// that a client would retry, when a call made inside the handler gave up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GiveUp {
    reason: StopReason,
}

impl GiveUp {
    /// The answer for a call that stopped for `reason`; `None` for a
    /// success.
    pub fn for_reason(reason: StopReason) -> Option<GiveUp> {
        (reason != StopReason::Success).then_some(GiveUp { reason })
    }

    /// The answer for the call `report` describes; `None` for a success.
    pub fn for_report(report: &RetryReport) -> Option<GiveUp> {
        GiveUp::for_reason(report.stop_reason())
    }

    /// Why the call stopped.
    pub fn reason(&self) -> StopReason {
        self.reason
    }

    /// The status to answer with when there is no response to pass on:
    /// 504 for `Deadline`, 502 for `Permanent`, 503 for any other reason.
    pub fn status(&self) -> StatusCode {
        match self.reason {
            StopReason::Deadline => StatusCode::GATEWAY_TIMEOUT,
            StopReason::Permanent => StatusCode::BAD_GATEWAY,
            _ => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// Adds `Stripe-Should-Retry: false` to `headers`, replacing a verdict
    /// they held.
    pub fn add_verdict(&self, headers: &mut HeaderMap) {
        do_not_retry(headers, &HeaderName::from_static(DEFAULT_VERDICT_HEADER));
    }

    /// The whole answer: [`GiveUp::status`], the verdict, an empty body.
    pub fn into_response<B: Default>(self) -> http::Response<B> {
        let mut response = http::Response::new(B::default());
        *response.status_mut() = self.status();
        self.add_verdict(response.headers_mut());
        response
    }
}

/// Sets `name: false`.
pub(crate) fn do_not_retry(headers: &mut HeaderMap, name: &HeaderName) {
    headers.insert(name.clone(), HeaderValue::from_static("false"));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_but_success_says_do_not_retry() {
        let table = [
            (StopReason::Deadline, 504),
            (StopReason::Permanent, 502),
            (StopReason::AttemptsExhausted, 503),
            (StopReason::BudgetExhausted, 503),
            (StopReason::RetryAfterTooLong, 503),
            (StopReason::NotIdempotent, 503),
            (StopReason::BodyNotCloneable, 503),
            (StopReason::BodyTooLargeToReplay, 503),
            (StopReason::ServerSaidNo, 503),
        ];
        for (reason, status) in table {
            let response: http::Response<()> = GiveUp::for_reason(reason).unwrap().into_response();
            assert_eq!(response.status(), status, "{reason}");
            assert_eq!(response.headers()["stripe-should-retry"], "false");
        }
        assert_eq!(GiveUp::for_reason(StopReason::Success), None);
    }

    #[test]
    fn a_verdict_already_there_is_replaced() {
        let mut headers = HeaderMap::new();
        headers.insert("stripe-should-retry", HeaderValue::from_static("true"));
        GiveUp::for_reason(StopReason::AttemptsExhausted)
            .unwrap()
            .add_verdict(&mut headers);
        let values: Vec<_> = headers.get_all("stripe-should-retry").iter().collect();
        assert_eq!(values, ["false"]);
    }
}
