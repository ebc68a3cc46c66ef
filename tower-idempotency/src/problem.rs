//! RFC 9457 `application/problem+json` error responses.

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};

/// The kinds of error the layer answers itself, each with its own problem
/// `type` URI and HTTP status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProblemKind {
    /// 400: the key header is missing, empty, longer than 255 characters,
    /// repeated or malformed.
    BadKey,
    /// 400: the request body could not be read.
    BadBody,
    /// 413: the request body exceeds the configured limit.
    RequestTooLarge,
    /// 409: a request with the same key and fingerprint is still running.
    InProgress,
    /// 422: the key was already used with a different request.
    KeyReused,
    /// 500: the response could not be stored (too large or unreadable); the
    /// key was released.
    ResponseNotStored,
    /// 500: unexpected internal error (for example a corrupt stored response).
    Internal,
    /// 503: the store could not be reached.
    StoreUnavailable,
}

impl ProblemKind {
    /// HTTP status code used for this problem.
    pub fn status(self) -> StatusCode {
        match self {
            Self::BadKey | Self::BadBody => StatusCode::BAD_REQUEST,
            Self::RequestTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Self::InProgress => StatusCode::CONFLICT,
            Self::KeyReused => StatusCode::UNPROCESSABLE_ENTITY,
            Self::ResponseNotStored | Self::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            Self::StoreUnavailable => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// The problem `type` URI.
    pub fn type_uri(self) -> &'static str {
        match self {
            Self::BadKey => "https://docs.rs/tower-idempotency/problems#invalid-key",
            Self::BadBody => "https://docs.rs/tower-idempotency/problems#unreadable-body",
            Self::RequestTooLarge => "https://docs.rs/tower-idempotency/problems#request-too-large",
            Self::InProgress => "https://docs.rs/tower-idempotency/problems#in-progress",
            Self::KeyReused => "https://docs.rs/tower-idempotency/problems#key-reused",
            Self::ResponseNotStored => {
                "https://docs.rs/tower-idempotency/problems#response-not-stored"
            }
            Self::Internal => "https://docs.rs/tower-idempotency/problems#internal",
            Self::StoreUnavailable => {
                "https://docs.rs/tower-idempotency/problems#store-unavailable"
            }
        }
    }

    /// The problem `title`: a short, fixed summary.
    pub fn title(self) -> &'static str {
        match self {
            Self::BadKey => "Invalid or missing Idempotency-Key",
            Self::BadBody => "Unreadable request body",
            Self::RequestTooLarge => "Request body too large",
            Self::InProgress => "Request already in progress",
            Self::KeyReused => "Idempotency-Key reused with a different request",
            Self::ResponseNotStored => "Response could not be stored",
            Self::Internal => "Internal error",
            Self::StoreUnavailable => "Idempotency store unavailable",
        }
    }
}

/// Builds an `application/problem+json` response.
pub(crate) fn problem<B: From<Bytes>>(
    kind: ProblemKind,
    detail: &str,
    retry_after: Option<HeaderValue>,
) -> Response<B> {
    let status = kind.status();
    let body = serde_json::json!({
        "type": kind.type_uri(),
        "title": kind.title(),
        "status": status.as_u16(),
        "detail": detail,
    });
    let mut response = Response::new(B::from(Bytes::from(body.to_string())));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    if let Some(value) = retry_after {
        response.headers_mut().insert(header::RETRY_AFTER, value);
    }
    response
}
