//! Parsing the `Idempotency-Key` header value and fingerprinting requests.

use http::request::Parts;
use http::{HeaderName, HeaderValue};
use sha2::{Digest, Sha256};

use crate::store::Fingerprint;

/// Longest accepted key, in characters: the limit the client checks too.
pub(crate) const MAX_KEY_LEN: usize = idempotency_key::MAX_LEN;

#[derive(Debug, PartialEq, Eq)]
pub(crate) enum KeyError {
    Empty,
    TooLong,
    Invalid(&'static str),
}

impl From<idempotency_key::KeyError> for KeyError {
    fn from(e: idempotency_key::KeyError) -> Self {
        match e {
            idempotency_key::KeyError::Empty => KeyError::Empty,
            idempotency_key::KeyError::TooLong => KeyError::TooLong,
            other => KeyError::Invalid(other.reason()),
        }
    }
}

/// Parses a key given bare (`abc`) or as a structured-field string (`"abc"`,
/// with `\"` and `\\` escapes), by the rules the client sends it with (the
/// `idempotency-key` crate): 1 to 255 visible ASCII characters.
pub(crate) fn parse_key(value: &HeaderValue) -> Result<String, KeyError> {
    Ok(idempotency_key::parse(value.as_bytes())?.into_owned())
}

fn field(hasher: &mut Sha256, bytes: &[u8]) {
    hasher.update((bytes.len() as u64).to_be_bytes());
    hasher.update(bytes);
}

/// SHA-256 over method, path and query, the selected headers and the body;
/// every field is length-prefixed so that different requests cannot collide
/// by shifting bytes between fields.
pub(crate) fn fingerprint(parts: &Parts, headers: &[HeaderName], body: &[u8]) -> Fingerprint {
    let mut hasher = Sha256::new();
    field(&mut hasher, parts.method.as_str().as_bytes());
    let path = parts
        .uri
        .path_and_query()
        .map(|pq| pq.as_str())
        .unwrap_or_else(|| parts.uri.path());
    field(&mut hasher, path.as_bytes());
    for name in headers {
        field(&mut hasher, name.as_str().as_bytes());
        let values: Vec<&HeaderValue> = parts.headers.get_all(name).iter().collect();
        hasher.update((values.len() as u64).to_be_bytes());
        for value in values {
            field(&mut hasher, value.as_bytes());
        }
    }
    field(&mut hasher, body);
    Fingerprint(hasher.finalize().into())
}

#[cfg(test)]
mod tests {
    use super::*;

    include!("../../fixtures/key_vectors.rs");

    /// Every vector a header can hold is read as the client sends it.
    #[test]
    fn the_shared_key_vectors() {
        let mut checked = 0;
        for v in key_vectors(include_str!("../../fixtures/keys.tsv")) {
            let Ok(value) = HeaderValue::from_bytes(&v.wire) else {
                continue; // bytes no header can hold
            };
            let got = parse_key(&value);
            match &v.expected {
                Ok(key) => assert_eq!(got.as_ref(), Ok(key), "line {}", v.line),
                Err(name) => {
                    let want = match *name {
                        "empty" => KeyError::Empty,
                        "too_long" => KeyError::TooLong,
                        _ => {
                            KeyError::Invalid(idempotency_key::parse(&v.wire).unwrap_err().reason())
                        }
                    };
                    assert_eq!(got, Err(want), "line {}", v.line);
                }
            }
            checked += 1;
        }
        assert!(checked >= 30, "only {checked} vectors fit in a header");
    }

    #[test]
    fn fingerprint_depends_on_fields() {
        let req = |m: &str, u: &str| {
            http::Request::builder()
                .method(m)
                .uri(u)
                .header("x-a", "1")
                .body(())
                .unwrap()
                .into_parts()
                .0
        };
        let h = [HeaderName::from_static("x-a")];
        let a = fingerprint(&req("POST", "/p?x=1"), &h, b"body");
        assert_eq!(a, fingerprint(&req("POST", "/p?x=1"), &h, b"body"));
        assert_ne!(a, fingerprint(&req("PATCH", "/p?x=1"), &h, b"body"));
        assert_ne!(a, fingerprint(&req("POST", "/p?x=2"), &h, b"body"));
        assert_ne!(a, fingerprint(&req("POST", "/p?x=1"), &h, b"bodY"));
        assert_ne!(a, fingerprint(&req("POST", "/p?x=1"), &[], b"body"));
    }
}
