//! RFC 9457 `application/problem+json` error responses.
//!
//! Every document has `type: "about:blank"` (RFC 9457 §4.2.1: the status
//! says it all), `title` (the status's reason phrase), `status`, `detail`
//! (for a human) and `code`, an extension member naming the
//! [`ProblemKind`] for programs (`"in_progress"`, `"key_reused"`, ...). The
//! crate README lists every code under "Problem responses".

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};

/// The kinds of error the layer answers itself, each with its `code` and
/// HTTP status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProblemKind {
    /// 400 `invalid_key`: the key header is missing, empty, longer than 255
    /// characters, repeated or malformed. Nothing was claimed.
    BadKey,
    /// 400 `unreadable_body`: the request body could not be read. Nothing
    /// was claimed.
    BadBody,
    /// 413 `request_too_large`: the request body exceeds the configured
    /// limit. Nothing was claimed.
    RequestTooLarge,
    /// 408 `request_timeout`: the request body did not arrive within the
    /// layer's `request_body_timeout`. Nothing was claimed.
    RequestTimeout,
    /// 409 `in_progress` (with `Retry-After`): a request with the same key
    /// and fingerprint is still running; retry later to get its response.
    InProgress,
    /// 422 `key_reused`: the key was already used with a different request.
    KeyReused,
    /// 410 `response_not_retained`: the handler ran (or may have run: it
    /// panicked or failed) but its response could not be kept (too large,
    /// or the store failed). The key stays completed and this answer is
    /// replayed: retrying with the same key never runs the handler again.
    /// Check the operation's outcome by other means.
    ResponseNotRetained,
    /// 500 `store_failed`: the store refused the operation with an error that
    /// retrying will not fix. Nothing was run.
    StoreFailed,
    /// 500 `internal`: unexpected internal error (a corrupt stored response,
    /// a server shutting down).
    Internal,
    /// 503 `store_unavailable` (with `Retry-After`): the store could not be
    /// reached. Nothing was run; retrying later is safe.
    StoreUnavailable,
}

impl ProblemKind {
    /// HTTP status code used for this problem.
    pub fn status(self) -> StatusCode {
        match self {
            Self::BadKey | Self::BadBody => StatusCode::BAD_REQUEST,
            Self::RequestTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Self::RequestTimeout => StatusCode::REQUEST_TIMEOUT,
            Self::InProgress => StatusCode::CONFLICT,
            Self::KeyReused => StatusCode::UNPROCESSABLE_ENTITY,
            Self::ResponseNotRetained => StatusCode::GONE,
            Self::StoreFailed | Self::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            Self::StoreUnavailable => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// The problem `type` URI: `about:blank` for every kind (RFC 9457
    /// §4.2.1); programs tell kinds apart by [`code`](Self::code).
    pub fn type_uri(self) -> &'static str {
        "about:blank"
    }

    /// The `code` extension member: a stable, machine-readable name.
    pub fn code(self) -> &'static str {
        match self {
            Self::BadKey => "invalid_key",
            Self::BadBody => "unreadable_body",
            Self::RequestTooLarge => "request_too_large",
            Self::RequestTimeout => "request_timeout",
            Self::InProgress => "in_progress",
            Self::KeyReused => "key_reused",
            Self::ResponseNotRetained => "response_not_retained",
            Self::StoreFailed => "store_failed",
            Self::Internal => "internal",
            Self::StoreUnavailable => "store_unavailable",
        }
    }

    /// The problem `title`: the status's reason phrase, as RFC 9457 asks for
    /// `about:blank`.
    pub fn title(self) -> &'static str {
        self.status().canonical_reason().unwrap_or("Error")
    }
}

/// The JSON document of a problem.
pub(crate) fn problem_body(kind: ProblemKind, detail: &str) -> Bytes {
    let body = serde_json::json!({
        "type": kind.type_uri(),
        "title": kind.title(),
        "status": kind.status().as_u16(),
        "detail": detail,
        "code": kind.code(),
    });
    Bytes::from(body.to_string())
}

/// The media type of problem documents.
pub(crate) const PROBLEM_JSON: &str = "application/problem+json";

/// Builds an `application/problem+json` response.
pub(crate) fn problem<B: From<Bytes>>(
    kind: ProblemKind,
    detail: &str,
    retry_after: Option<HeaderValue>,
) -> Response<B> {
    let mut response = Response::new(B::from(problem_body(kind, detail)));
    *response.status_mut() = kind.status();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
    if let Some(value) = retry_after {
        response.headers_mut().insert(header::RETRY_AFTER, value);
    }
    response
}
