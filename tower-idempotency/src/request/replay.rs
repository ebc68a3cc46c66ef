//! What a retry gets back: the stored response, or the marker left when a
//! response could not be kept.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Response, StatusCode};

use crate::request::context::IDEMPOTENT_REPLAYED;
use crate::request::problem::{problem, problem_body, ProblemKind, PROBLEM_JSON};
use crate::store::StoredResponse;

/// `Retry-After` in whole seconds, rounded up; never overflows.
pub(crate) fn retry_after_value(d: Duration) -> HeaderValue {
    let secs = d.as_secs().saturating_add(u64::from(d.subsec_nanos() > 0));
    HeaderValue::from(secs)
}

/// The record stored when a started request's response cannot be kept:
/// `410` problem+json (`response_not_retained`), replayed like any stored
/// response so the handler never runs again for this key.
pub(crate) fn marker(detail: &str) -> StoredResponse {
    StoredResponse::new(
        ProblemKind::ResponseNotRetained.status().as_u16(),
        vec![(
            "content-type".to_owned(),
            Bytes::from_static(PROBLEM_JSON.as_bytes()),
        )],
        problem_body(ProblemKind::ResponseNotRetained, detail),
    )
}

/// What is kept of a response: its status, the values of its `names`
/// headers, in order and byte for byte, and the body.
pub(crate) fn to_stored(
    parts: &http::response::Parts,
    names: &[HeaderName],
    body: Bytes,
) -> StoredResponse {
    let headers = names
        .iter()
        .flat_map(|name| {
            parts.headers.get_all(name).iter().map(move |v| {
                (
                    name.as_str().to_owned(),
                    Bytes::copy_from_slice(v.as_bytes()),
                )
            })
        })
        .collect();
    StoredResponse {
        status: parts.status.as_u16(),
        headers,
        body,
    }
}

/// Turns a stored response into an HTTP response; `replayed` adds
/// `Idempotent-Replayed: true`.
pub(crate) fn to_response<B: From<Bytes>>(stored: StoredResponse, replayed: bool) -> Response<B> {
    let Ok(status) = StatusCode::from_u16(stored.status) else {
        return problem(
            ProblemKind::Internal,
            "the stored response has an invalid status code",
            None,
        );
    };
    let mut response = Response::new(B::from(stored.body));
    *response.status_mut() = status;
    for (name, value) in stored.headers {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_maybe_shared(value),
        ) {
            response.headers_mut().append(name, value);
        }
    }
    if replayed {
        response
            .headers_mut()
            .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_rounds_up_without_overflow() {
        assert_eq!(retry_after_value(Duration::from_millis(4500)), "5");
        assert_eq!(retry_after_value(Duration::from_secs(1)), "1");
        assert_eq!(
            retry_after_value(Duration::MAX),
            u64::MAX.to_string().as_str()
        );
    }
}
