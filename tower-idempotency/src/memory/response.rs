//! A completed record's response as a [`MemoryStore`](super::MemoryStore)
//! keeps it. Handed over through the store trait, it is the trait's
//! [`StoredResponse`]; handed over by the layer's direct path, it is what
//! the handler's response holds: its status, the kept headers as the
//! response has them (a `HeaderName` and a `HeaderValue` are shared, not
//! copied into strings, and the first is held inline) and its body. Three
//! allocations fewer per request; a replay, rarer, turns it into the
//! `StoredResponse` the trait returns, the same one
//! [`to_stored`](crate::request::replay) would have made.
//!
//! Uses only the store's types, as the rest of the memory store.

use bytes::Bytes;
use http::response::Parts;
use http::{HeaderName, HeaderValue};

use crate::store::StoredResponse;

/// A completed record's response.
#[derive(Debug)]
pub(crate) enum KeptResponse {
    /// Handed over through the store trait.
    Stored(StoredResponse),
    /// Taken from the handler's response (see [`KeptResponse::of`]).
    Http {
        status: u16,
        headers: Headers,
        body: Bytes,
    },
}

/// The kept headers of a response, in order: the first inline, so that a
/// response with one kept header (`content-type`, the default) needs no
/// allocation.
#[derive(Debug, Default)]
pub(crate) struct Headers {
    first: Option<(HeaderName, HeaderValue)>,
    rest: Vec<(HeaderName, HeaderValue)>,
}

impl Headers {
    fn push(&mut self, header: (HeaderName, HeaderValue)) {
        if self.first.is_none() {
            self.first = Some(header);
        } else {
            self.rest.push(header);
        }
    }

    fn iter(&self) -> impl Iterator<Item = &(HeaderName, HeaderValue)> {
        self.first.iter().chain(&self.rest)
    }
}

impl KeptResponse {
    /// What is kept of a response: its status, the values of its `names`
    /// headers, in order and byte for byte, and its body, as
    /// [`to_stored`](crate::request::replay) keeps them.
    pub(crate) fn of(parts: &Parts, names: &[HeaderName], body: Bytes) -> Self {
        let mut headers = Headers::default();
        // Loops, not `to_stored`'s chain of iterators: ~60 instructions
        // less per request (callgrind). The test below holds the two to
        // the same headers.
        for name in names {
            for value in parts.headers.get_all(name) {
                headers.push((name.clone(), value.clone()));
            }
        }
        Self::Http {
            status: parts.status.as_u16(),
            headers,
            body,
        }
    }

    /// Its status code.
    pub(crate) fn status(&self) -> u16 {
        match self {
            Self::Stored(response) => response.status,
            Self::Http { status, .. } => *status,
        }
    }

    /// The response as the store trait returns it.
    pub(crate) fn to_stored(&self) -> StoredResponse {
        match self {
            Self::Stored(response) => response.clone(),
            Self::Http {
                status,
                headers,
                body,
            } => StoredResponse {
                status: *status,
                // Byte for byte, as `to_stored` keeps them.
                headers: headers
                    .iter()
                    .map(|(name, value)| {
                        let value = Bytes::copy_from_slice(value.as_bytes());
                        (name.as_str().to_owned(), value)
                    })
                    .collect(),
                body: body.clone(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use http::header::{CONTENT_TYPE, LOCATION};

    use super::*;
    use crate::request::replay::to_stored;

    /// Replayed from the direct path, a response is the one the trait's
    /// path stores: the same headers (repeated ones in order, values that
    /// are not text kept, names not asked for left out), status and
    /// body; with no header, one, or several kept.
    #[test]
    fn the_kept_response_replays_as_the_stored_one() {
        let custom = HeaderName::from_static("x-request-id");
        let (mut parts, ()) = http::Response::builder()
            .status(201)
            .header(CONTENT_TYPE, "application/json")
            .header(LOCATION, "/pay/1")
            .header(custom.clone(), "a")
            .header(custom.clone(), HeaderValue::from_bytes(b"\xff").unwrap())
            .header(custom.clone(), "b")
            .header("x-other", "left out")
            .body(())
            .unwrap()
            .into_parts();
        let body = Bytes::from_static(b"{}");
        for names in [
            vec![],
            vec![CONTENT_TYPE],
            vec![custom.clone(), CONTENT_TYPE, LOCATION],
        ] {
            let kept = KeptResponse::of(&parts, &names, body.clone());
            assert_eq!(kept.status(), 201);
            assert_eq!(
                kept.to_stored(),
                to_stored(&parts, &names, body.clone()),
                "{names:?}"
            );
        }
        parts.headers.clear();
        let kept = KeptResponse::of(&parts, &[CONTENT_TYPE], body.clone());
        assert!(kept.to_stored().headers.is_empty());
    }
}
