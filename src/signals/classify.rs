//! Transient or permanent, and why.
//!
//! ```
//! use reqwest_safe_retry::{Class, HttpAttempt};
//! use reqwest_safe_retry::classify::Classifier;
//!
//! // Extend the table: this API answers 404 while a replica catches up.
//! let classifier = |attempt: &HttpAttempt<'_>| match attempt.status() {
//!     Some(s) if s.as_u16() == 404 => Some(Class::Transient),
//!     _ => None, // no opinion: the next classifier, then the default table
//! };
//! # fn takes<C: Classifier>(_: C) {}
//! # takes(classifier);
//! ```
//!
//! The default table (the guide's "What it does", docs/using.md, shows the same):
//!
//! | outcome | class |
//! |---|---|
//! | 1xx–3xx | success |
//! | 408, 425, 429, 500, 502, 503, 504 | transient |
//! | 409 to a request that carried an Idempotency-Key | transient (the original is still in progress) |
//! | any 4xx or 5xx marked `Idempotent-Replayed: true` | permanent (the stored outcome of the original) |
//! | 413 with a readable Retry-After | transient (RFC 9110 §15.5.14: the condition is temporary) |
//! | every other 4xx (413 without Retry-After included); 501, 505, 506, 507, 508, 510, 511 and any other 5xx | permanent |
//! | connect refused/failed, timeouts, a connection reset or closed before a complete response | transient |
//! | a TLS handshake the client rejects (the server's certificate untrusted, expired, not for the host, a CA's; its protocol) | permanent |
//! | request build, redirect-policy, body and decode errors | permanent |
//!
//! A server verdict (`Stripe-Should-Retry: true|false`) wins over the table;
//! a user classifier wins over both.
//!
//! # A replay is final
//!
//! A server with an idempotency layer (tower-idempotency, Stripe) answers a
//! retry of a completed operation with the original's stored response and
//! `Idempotent-Replayed: true`. That response will be the same on every
//! further attempt, for as long as the server keeps the key: a stored 503,
//! 408 or 409 is not "try again later" but the operation's outcome. So a
//! replayed failure stops the operation at once with
//! [`StopReason::Permanent`](crate::StopReason::Permanent), and the verdict
//! header stored with it is not read (it spoke about the original attempt).
//!
//! 507 Insufficient Storage stays permanent although RFC 4918 §11.5 calls
//! it temporary: storage is freed by an operator or a cleanup job, in
//! minutes or hours, not in the seconds a retry loop waits, and more
//! writes to a server that is out of space only add to its trouble. A
//! service that knows better can say so with a classifier.

use std::error::Error as StdError;
use std::io;

use http::{HeaderMap, Method, StatusCode};

use super::retry_after;

/// What one attempt's outcome means for the retry loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Class {
    /// Done: hand the response to the caller.
    Success,
    /// Worth another attempt, if the safety rule, the budget and the deadline
    /// allow it.
    Transient,
    /// Retrying cannot help: give up at once.
    Permanent,
}

/// One HTTP attempt as a classifier sees it: the method, whether a key
/// went with it, and the response or the error it ended with. (The engine's
/// [`Outcome`](crate::retry::Outcome) is what a classifier's answer becomes.)
#[derive(Debug)]
pub struct HttpAttempt<'a> {
    pub(crate) method: &'a Method,
    pub(crate) carried_key: bool,
    pub(crate) result: Result<&'a reqwest::Response, &'a reqwest_middleware::Error>,
}

impl<'a> HttpAttempt<'a> {
    /// The request's method.
    pub fn method(&self) -> &Method {
        self.method
    }

    /// Whether the request carried an idempotency key.
    pub fn carried_idempotency_key(&self) -> bool {
        self.carried_key
    }

    /// The response, if the attempt got one.
    pub fn response(&self) -> Option<&'a reqwest::Response> {
        self.result.ok()
    }

    /// The error, if the attempt got no response.
    pub fn error(&self) -> Option<&'a reqwest_middleware::Error> {
        self.result.err()
    }

    /// The response's status, if the attempt got one.
    pub fn status(&self) -> Option<StatusCode> {
        self.response().map(|r| r.status())
    }
}

/// Decides whether an attempt's outcome is worth another attempt.
///
/// Return `None` to have no opinion: the next classifier decides, and in the
/// end the default table. A classifier that always answers replaces the
/// table. Closures `Fn(&HttpAttempt<'_>) -> Option<Class>` are classifiers.
pub trait Classifier: Send + Sync + 'static {
    /// The class of this outcome, or `None` for no opinion.
    fn classify(&self, attempt: &HttpAttempt<'_>) -> Option<Class>;
}

impl<F> Classifier for F
where
    F: Fn(&HttpAttempt<'_>) -> Option<Class> + Send + Sync + 'static,
{
    fn classify(&self, attempt: &HttpAttempt<'_>) -> Option<Class> {
        self(attempt)
    }
}

/// The default table: a replayed failure is permanent, a 413 with a
/// readable `Retry-After` transient, other statuses as [`classify_status`]
/// and errors as [`classify_error`]; always has an opinion.
#[derive(Debug, Clone, Copy, Default)]
pub struct DefaultClassifier;

impl Classifier for DefaultClassifier {
    fn classify(&self, attempt: &HttpAttempt<'_>) -> Option<Class> {
        Some(match attempt.result {
            Ok(response) if response.status().as_u16() >= 400 && is_replay(response.headers()) => {
                Class::Permanent
            }
            // RFC 9110 §15.5.14: a 413 with Retry-After says the condition
            // is temporary (urllib3 retries it too).
            Ok(response)
                if response.status() == StatusCode::PAYLOAD_TOO_LARGE
                    && retry_after::has_hint(response.headers()) =>
            {
                Class::Transient
            }
            Ok(response) => classify_status(response.status(), attempt.carried_key),
            Err(error) => classify_error(error),
        })
    }
}

/// The status table.
///
/// It sees the status alone: a 413 is permanent here, and
/// [`DefaultClassifier`], which also sees the headers, makes a 413 with a
/// readable `Retry-After` transient.
pub fn classify_status(status: StatusCode, carried_key: bool) -> Class {
    match status.as_u16() {
        100..=399 => Class::Success,
        408 | 425 | 429 | 500 | 502 | 503 | 504 => Class::Transient,
        409 if carried_key => Class::Transient,
        _ => Class::Permanent,
    }
}

/// The transport-error table.
pub fn classify_error(error: &reqwest_middleware::Error) -> Class {
    match transport_failure(error) {
        TransportFailure::Connect | TransportFailure::Timeout | TransportFailure::Interrupted => {
            Class::Transient
        }
        TransportFailure::TlsRejected | TransportFailure::Other => Class::Permanent,
    }
}

/// Whether a response is a stored outcome that the server's idempotency
/// layer replayed (`Idempotent-Replayed: true`): final, whatever its status.
pub(crate) fn is_replay(headers: &HeaderMap) -> bool {
    headers
        .get("idempotent-replayed")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
}

/// Reads an explicit server verdict such as `Stripe-Should-Retry: false`.
///
/// A replay has none: its stored headers spoke about the original attempt,
/// and the replay itself is final.
pub(crate) fn server_verdict(headers: &HeaderMap, name: &http::HeaderName) -> Option<bool> {
    if is_replay(headers) {
        return None;
    }
    let value = headers.get(name)?.to_str().ok()?.trim();
    if value.eq_ignore_ascii_case("true") {
        Some(true)
    } else if value.eq_ignore_ascii_case("false") {
        Some(false)
    } else {
        None
    }
}

/// Whether this crate's client would retry an answer with `status` and
/// `headers`, had its request carried a key, reading its verdict from
/// `verdict`: what the default table retries (a 409 included), a 413 with
/// a readable Retry-After, any 4xx or 5xx whose verdict says "retry"; not
/// a replay, a success, or an answer whose verdict says "do not".
///
/// What a service whose own call gave up must mark "do not retry"
/// (`InheritDeadlineLayer`): a status left unmarked, or an upstream's
/// "retry" handed on, makes each caller above it retry again.
pub(crate) fn retried_by_a_keyed_client(
    status: StatusCode,
    headers: &HeaderMap,
    verdict: &http::HeaderName,
) -> bool {
    // A verdict on a success is not read; a replay is final.
    if status.as_u16() < 400 || is_replay(headers) {
        return false;
    }
    match server_verdict(headers, verdict) {
        Some(retry) => retry,
        None => {
            classify_status(status, true) == Class::Transient
                || (status == StatusCode::PAYLOAD_TOO_LARGE && retry_after::has_hint(headers))
        }
    }
}

/// What kind of transport failure an error is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TransportFailure {
    /// The connection was never made: the request cannot have been processed.
    Connect,
    /// The attempt timed out: the server may or may not have processed it.
    Timeout,
    /// The connection was reset or closed before a complete response.
    Interrupted,
    /// The TLS handshake failed because the client rejected what the
    /// server sent (its certificate, its protocol): no second handshake
    /// will pass it. The request was never sent.
    TlsRejected,
    /// Build, redirect, body or decode errors, and middleware errors.
    Other,
}

impl TransportFailure {
    pub(crate) fn name(self) -> &'static str {
        match self {
            TransportFailure::Connect => "connect",
            TransportFailure::Timeout => "timeout",
            TransportFailure::Interrupted => "interrupted",
            TransportFailure::TlsRejected => "tls_rejected",
            TransportFailure::Other => "other",
        }
    }
}

pub(crate) fn transport_failure(error: &reqwest_middleware::Error) -> TransportFailure {
    let reqwest_middleware::Error::Reqwest(e) = error else {
        // Another middleware's error: we cannot know what it means.
        return TransportFailure::Other;
    };
    if e.is_builder() || e.is_redirect() || e.is_decode() || e.is_body() {
        return TransportFailure::Other;
    }
    if e.is_connect()
        || any_source(e, |err| {
            io_kind(err) == Some(io::ErrorKind::ConnectionRefused)
        })
    {
        if is_tls_rejection(e) {
            return TransportFailure::TlsRejected;
        }
        return TransportFailure::Connect;
    }
    if e.is_timeout() {
        return TransportFailure::Timeout;
    }
    if is_interrupted(e) {
        return TransportFailure::Interrupted;
    }
    TransportFailure::Other
}

/// A connection reset or closed before a complete response.
///
/// Walk the `source()` chain: reqwest wraps hyper's error, which wraps the
/// I/O error. A reset surfaces as `io::ErrorKind::ConnectionReset` (or
/// `BrokenPipe`/`ConnectionAborted` when the write side notices first); a
/// server that closes the socket after reading the request surfaces as
/// hyper's "connection closed before message completed"
/// (`is_incomplete_message`) or an `UnexpectedEof`.
fn is_interrupted(e: &reqwest::Error) -> bool {
    any_source(e, |err| {
        if let Some(h) = err.downcast_ref::<hyper::Error>() {
            return h.is_incomplete_message() || h.is_canceled() || h.is_closed();
        }
        io_kind(err).is_some_and(|kind| {
            matches!(
                kind,
                io::ErrorKind::ConnectionReset
                    | io::ErrorKind::ConnectionAborted
                    | io::ErrorKind::BrokenPipe
                    | io::ErrorKind::UnexpectedEof
            )
        })
    })
}

/// Whether a connect error is the TLS layer rejecting the server's
/// handshake. rustls (reqwest's default TLS) reports every such rejection
/// (an untrusted, expired or misnamed certificate, a CA's certificate
/// served as the server's, a protocol it does not speak, an alert the
/// server sent) as an I/O error of kind `InvalidData`, wrapped in the
/// connector's I/O error; nothing else in a connect does. A handshake
/// cut short is `UnexpectedEof` or a reset instead, and a timeout a
/// timeout: those stay transient.
///
/// `io::Error::source` skips the error an I/O error wraps (it answers that
/// error's own source), so the chain is walked through `get_ref` too.
fn is_tls_rejection(e: &reqwest::Error) -> bool {
    let mut next = e.source();
    while let Some(err) = next {
        if let Some(io) = err.downcast_ref::<io::Error>() {
            if io.kind() == io::ErrorKind::InvalidData {
                return true;
            }
            if let Some(inner) = io.get_ref() {
                next = Some(inner);
                continue;
            }
        }
        next = err.source();
    }
    false
}

/// Whether any error in `e`'s `source()` chain satisfies `pred`.
fn any_source(e: &reqwest::Error, pred: impl Fn(&(dyn StdError + 'static)) -> bool) -> bool {
    std::iter::successors(e.source(), |&err| err.source()).any(pred)
}

/// The kind of an I/O error, if `err` is one.
fn io_kind(err: &(dyn StdError + 'static)) -> Option<io::ErrorKind> {
    err.downcast_ref::<io::Error>().map(io::Error::kind)
}

pub(crate) fn is_timeout(error: &reqwest_middleware::Error) -> bool {
    transport_failure(error) == TransportFailure::Timeout
}

pub(crate) fn is_connect(error: &reqwest_middleware::Error) -> bool {
    transport_failure(error) == TransportFailure::Connect
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_table() {
        let class =
            |code: u16, key: bool| classify_status(StatusCode::from_u16(code).unwrap(), key);
        for code in [100, 200, 201, 204, 301, 304, 399] {
            assert_eq!(class(code, false), Class::Success, "{code}");
        }
        for code in [408, 425, 429, 500, 502, 503, 504] {
            assert_eq!(class(code, false), Class::Transient, "{code}");
        }
        assert_eq!(class(409, true), Class::Transient);
        assert_eq!(class(409, false), Class::Permanent);
        for code in [
            400, 401, 403, 404, 405, 410, 413, 422, 451, 501, 505, 507, 511,
        ] {
            assert_eq!(class(code, true), Class::Permanent, "{code}");
        }
    }

    #[test]
    fn server_verdict_reads_booleans_only() {
        let name = http::HeaderName::from_static("stripe-should-retry");
        let mut h = HeaderMap::new();
        assert_eq!(server_verdict(&h, &name), None);
        h.insert(&name, "false".parse().unwrap());
        assert_eq!(server_verdict(&h, &name), Some(false));
        h.insert(&name, " TRUE ".parse().unwrap());
        assert_eq!(server_verdict(&h, &name), Some(true));
        h.insert(&name, "maybe".parse().unwrap());
        assert_eq!(server_verdict(&h, &name), None);
        h.insert(&name, "true".parse().unwrap());
        h.insert("idempotent-replayed", "true".parse().unwrap());
        assert_eq!(server_verdict(&h, &name), None, "a replay has no verdict");
    }

    #[test]
    fn what_a_keyed_client_retries() {
        let name = http::HeaderName::from_static("stripe-should-retry");
        let retried = |code: u16, pairs: &[(&'static str, &'static str)]| {
            let mut h = HeaderMap::new();
            for (n, v) in pairs {
                h.insert(*n, v.parse().unwrap());
            }
            retried_by_a_keyed_client(StatusCode::from_u16(code).unwrap(), &h, &name)
        };
        for code in [408, 409, 425, 429, 500, 502, 503, 504] {
            assert!(retried(code, &[]), "{code}");
        }
        for code in [200, 400, 404, 413, 501, 507] {
            assert!(!retried(code, &[]), "{code}");
        }
        assert!(retried(413, &[("retry-after", "1")]));
        assert!(!retried(413, &[("retry-after", "soon")]));
        let retry = ("stripe-should-retry", "true");
        let do_not = ("stripe-should-retry", "false");
        assert!(retried(404, &[retry]), "the verdict wins over the table");
        assert!(!retried(503, &[do_not]));
        assert!(!retried(200, &[retry]), "a success's verdict is not read");
        let replayed = ("idempotent-replayed", "true");
        assert!(!retried(503, &[replayed, retry]), "a replay is final");
    }

    #[test]
    fn replay_marker() {
        let mut h = HeaderMap::new();
        assert!(!is_replay(&h));
        for yes in ["true", "TRUE", " true "] {
            h.insert("idempotent-replayed", yes.parse().unwrap());
            assert!(is_replay(&h), "{yes:?}");
        }
        for no in ["false", "1", ""] {
            h.insert("idempotent-replayed", no.parse().unwrap());
            assert!(!is_replay(&h), "{no:?}");
        }
    }
}
