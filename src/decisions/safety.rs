//! The safety rule: may this request be sent again at all? A pure function,
//! next to the classifier.
//!
//! | method | key | failure | transient outcome → |
//! |---|---|---|---|
//! | idempotent (GET, HEAD, OPTIONS, TRACE, PUT, DELETE) | any | any | retry |
//! | other (POST, PATCH, …) | yes | any | retry |
//! | other | no | connect error (never reached the server) | retry |
//! | other | no | anything else | stop: `not_idempotent` |
//!
//! A body that cannot be copied (a stream) is sent once: `body_not_cloneable`.
//! Success and permanent outcomes pass through unchanged.

use http::Method;

use crate::signals::{Class, TransportFailure};
use crate::vocabulary::{is_idempotent, StopReason};

/// What the safety rule makes of a classified attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Judgement {
    /// The attempt succeeded.
    Success,
    /// Another attempt may be made.
    Retry,
    /// Stop. `failed` is true when the attempt itself failed transiently
    /// and only the safety rule stopped it.
    Stop { reason: StopReason, failed: bool },
}

/// One attempt, as the safety rule sees it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Attempt<'a> {
    pub(crate) method: &'a Method,
    /// The request carried an idempotency key.
    pub(crate) keyed: bool,
    /// The transport failure, when there was no response.
    pub(crate) failure: Option<TransportFailure>,
    /// A copy of the request exists for another attempt (or none can
    /// follow).
    pub(crate) cloneable: bool,
}

/// Applies the safety rule to a classified attempt.
pub(crate) fn judge(attempt: Attempt<'_>, class: Class) -> Judgement {
    match class {
        Class::Success => Judgement::Success,
        Class::Transient => {
            let repeatable = is_idempotent(attempt.method) || attempt.keyed;
            // A connect error proves the request never reached the server.
            let never_sent = attempt.failure == Some(TransportFailure::Connect);
            if !repeatable && !never_sent {
                Judgement::Stop {
                    reason: StopReason::NotIdempotent,
                    failed: true,
                }
            } else if !attempt.cloneable {
                Judgement::Stop {
                    reason: StopReason::BodyNotCloneable,
                    failed: true,
                }
            } else {
                Judgement::Retry
            }
        }
        // Permanent, and any class added later: stop.
        _ => Judgement::Stop {
            reason: StopReason::Permanent,
            failed: false,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FAILURES: [Option<TransportFailure>; 5] = [
        None,
        Some(TransportFailure::Connect),
        Some(TransportFailure::Timeout),
        Some(TransportFailure::Interrupted),
        Some(TransportFailure::Other),
    ];

    fn methods() -> Vec<(Method, bool)> {
        let idempotent = ["GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"];
        let other = ["POST", "PATCH", "CONNECT", "PROPFIND"];
        idempotent
            .iter()
            .map(|m| (m.parse().unwrap(), true))
            .chain(other.iter().map(|m| (m.parse().unwrap(), false)))
            .collect()
    }

    /// Every method × keyed × failure × class × cloneable, against the table
    /// in the module docs written out independently.
    #[test]
    fn the_whole_table() {
        let mut cases = 0;
        for (method, idempotent) in methods() {
            for keyed in [false, true] {
                for failure in FAILURES {
                    for cloneable in [false, true] {
                        for class in [Class::Success, Class::Transient, Class::Permanent] {
                            let got = judge(
                                Attempt {
                                    method: &method,
                                    keyed,
                                    failure,
                                    cloneable,
                                },
                                class,
                            );
                            let stop = |reason, failed| Judgement::Stop { reason, failed };
                            let want = match class {
                                Class::Success => Judgement::Success,
                                Class::Permanent => stop(StopReason::Permanent, false),
                                _ if !(idempotent
                                    || keyed
                                    || failure == Some(TransportFailure::Connect)) =>
                                {
                                    stop(StopReason::NotIdempotent, true)
                                }
                                _ if !cloneable => stop(StopReason::BodyNotCloneable, true),
                                _ => Judgement::Retry,
                            };
                            assert_eq!(
                                got, want,
                                "{method} keyed={keyed} {failure:?} cloneable={cloneable} {class:?}"
                            );
                            cases += 1;
                        }
                    }
                }
            }
        }
        assert_eq!(cases, 10 * 2 * 5 * 2 * 3);
    }

    #[test]
    fn the_rules_that_matter_most() {
        let post = Method::POST;
        let at = |keyed, failure| Attempt {
            method: &post,
            keyed,
            failure,
            cloneable: true,
        };
        // An unkeyed POST that got a 5xx may have been processed.
        assert_eq!(
            judge(at(false, None), Class::Transient),
            Judgement::Stop {
                reason: StopReason::NotIdempotent,
                failed: true
            }
        );
        // A reset or a timeout does not prove it was not.
        for f in [TransportFailure::Interrupted, TransportFailure::Timeout] {
            assert!(matches!(
                judge(at(false, Some(f)), Class::Transient),
                Judgement::Stop { .. }
            ));
        }
        // A refused connection does; a key makes any retry safe.
        assert_eq!(
            judge(at(false, Some(TransportFailure::Connect)), Class::Transient),
            Judgement::Retry
        );
        assert_eq!(judge(at(true, None), Class::Transient), Judgement::Retry);
    }
}
