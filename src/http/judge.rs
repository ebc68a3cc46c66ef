//! The judge: what one answer means. The classifiers, the server's
//! verdict header and the safety rule make the verdict; the answer's
//! throttling and rate-limit fields make the signal the admission learns
//! from.

use std::sync::Arc;

use reqwest::Response;

use crate::decisions::safety::{self, Judgement};
use crate::decisions::RetryKind;
use crate::engine::{RetryPolicy, Signal, Verdict};
use crate::signals::{
    rate_limit, retry_after, server_verdict, transport_failure, Class, Classifier,
    DefaultClassifier, HttpAttempt, TransportFailure,
};
use crate::vocabulary::replay::{Handle, Lost};
use crate::vocabulary::StopReason;

/// What an attempt's verdict needs: the policy, the request's own
/// classifier, whether the request carries a key, and how many attempts
/// it may make.
pub(super) struct Judge<'a> {
    pub(super) policy: &'a RetryPolicy,
    /// The request's own classifier, asked before the policy's.
    pub(super) classifier: Option<Arc<dyn Classifier>>,
    pub(super) keyed: bool,
    /// Beside `keyed`, where it costs the future no room of its own.
    pub(super) max_attempts: u32,
    /// The request's method as the published duration labels it (an
    /// index into `attempt::METHODS`), beside `keyed` too.
    #[cfg(feature = "metrics")]
    pub(super) method: u8,
    /// The replay buffer of a streamed body, once one is kept: the
    /// verdict reads whether it outgrew its limit while it was sent.
    pub(super) replay: Option<Handle>,
}

impl Judge<'_> {
    /// What the answer says about its host's rate, whatever the verdict:
    /// a throttling answer (429, or 503 with Retry-After) and the
    /// rate-limit fields.
    pub(super) fn signal(
        &self,
        result: &reqwest_middleware::Result<Response>,
        verdict: Verdict,
    ) -> Signal {
        let Ok(response) = result else {
            return Signal::default();
        };
        let headers = response.headers();
        let status = response.status().as_u16();
        // The wall clock is read only when a date may need it: most
        // answers are neither throttling nor carry rate-limit fields.
        let wall = || self.policy.clock.wall();
        let retry_after = match verdict {
            Verdict::Transient { retry_after, .. } => retry_after,
            _ if status == 429 || status == 503 => retry_after::from_headers(headers, wall()),
            _ => None,
        };
        let rate_limit = if rate_limit::has_fields(headers) {
            rate_limit::from_headers(headers, wall())
        } else {
            None
        };
        Signal {
            // A 503 that says "later" (a Retry-After of more than zero;
            // a date in the past says "now").
            throttled: status == 429
                || (status == 503 && retry_after.is_some_and(|d| !d.is_zero())),
            too_fast: status == 429,
            retry_after,
            rate_limit,
            ..Signal::default()
        }
    }

    /// Classifies one attempt and applies the safety rule.
    pub(super) fn verdict(
        &self,
        method: &http::Method,
        cloneable: bool,
        result: &reqwest_middleware::Result<Response>,
    ) -> Verdict {
        let policy = self.policy;
        // The common case first: a 1xx-3xx and no classifier but the
        // default, which calls it a success (as `safety::judge` does).
        if let Ok(r) = result {
            if r.status().as_u16() < 400
                && self.classifier.is_none()
                && policy.classifiers.is_empty()
            {
                return Verdict::Success;
            }
        }
        let attempt = HttpAttempt {
            method,
            carried_key: self.keyed,
            result: result.as_ref(),
        };
        let failure = result.as_ref().err().map(transport_failure);
        let user = self
            .classifier
            .iter()
            .chain(policy.classifiers.iter())
            .find_map(|c| c.classify(&attempt));
        // 1xx–3xx pass through untouched: a verdict header on a success is
        // not read.
        let verdict_header = match (result, &policy.settings.verdict_header) {
            (Ok(r), Some(name)) if r.status().as_u16() >= 400 => server_verdict(r.headers(), name),
            _ => None,
        };
        let class = match (user, verdict_header) {
            (Some(class), _) => class,
            (None, Some(false)) => {
                // "Do not retry" ends the call, but speaks of retrying, not
                // of the host: an answer the table calls transient (the
                // 503 of a tier whose own call gave up) is still the host
                // failing, for the breaker and admission alike (as a 503
                // to an unkeyed POST is). A declined card's 402 is not.
                let failed = DefaultClassifier.classify(&attempt) == Some(Class::Transient);
                return Verdict::Stop {
                    reason: StopReason::ServerSaidNo,
                    failed,
                };
            }
            (None, Some(true)) => Class::Transient,
            (None, None) => DefaultClassifier
                .classify(&attempt)
                .unwrap_or(Class::Permanent),
        };
        let lost = self.replay.as_ref().and_then(Handle::lost);
        let facts = safety::Attempt {
            method,
            keyed: self.keyed,
            failure,
            cloneable: cloneable && lost.is_none(),
        };
        match safety::judge(facts, class) {
            Judgement::Success => Verdict::Success,
            Judgement::Stop {
                reason: StopReason::BodyNotCloneable,
                failed,
            } => Verdict::Stop {
                reason: match lost {
                    Some(Lost::TooLarge) => StopReason::BodyTooLargeToReplay,
                    _ => StopReason::BodyNotCloneable,
                },
                failed,
            },
            Judgement::Stop { reason, failed } => Verdict::Stop { reason, failed },
            Judgement::Retry => {
                let response = result.as_ref().ok();
                let kind = if failure == Some(TransportFailure::Timeout) {
                    RetryKind::Timeout
                } else if response.is_some_and(|r| r.status().as_u16() == 429) {
                    RetryKind::Throttled
                } else {
                    RetryKind::Transient
                };
                Verdict::Transient {
                    retry_after: response
                        .and_then(|r| retry_after::from_headers(r.headers(), policy.clock.wall())),
                    kind,
                }
            }
        }
    }
}
