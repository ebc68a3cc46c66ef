//! Parsing the `Idempotency-Key` header value and fingerprinting requests.

use http::request::Parts;
use http::{HeaderName, HeaderValue};
use sha2::{Digest, Sha256};

use crate::store::Fingerprint;

/// Longest accepted key, in characters.
pub(crate) const MAX_KEY_LEN: usize = 255;

#[derive(Debug, PartialEq, Eq)]
pub(crate) enum KeyError {
    Empty,
    TooLong,
    Invalid(&'static str),
}

/// Parses a key given bare (`abc`) or as a structured-field string (`"abc"`,
/// with `\"` and `\\` escapes).
pub(crate) fn parse_key(value: &HeaderValue) -> Result<String, KeyError> {
    let raw = value
        .to_str()
        .map_err(|_| KeyError::Invalid("the key must be visible ASCII"))?
        .trim_matches(|c| c == ' ' || c == '\t');
    let key = if let Some(rest) = raw.strip_prefix('"') {
        let mut out = String::with_capacity(rest.len());
        let mut chars = rest.chars();
        let mut closed = false;
        while let Some(c) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some(e @ ('"' | '\\')) => out.push(e),
                    _ => return Err(KeyError::Invalid("only \\\" and \\\\ escapes are allowed")),
                },
                '"' => {
                    closed = true;
                    break;
                }
                ' '..='~' => out.push(c),
                _ => return Err(KeyError::Invalid("the key must be printable ASCII")),
            }
        }
        if !closed {
            return Err(KeyError::Invalid("unterminated quoted key"));
        }
        if chars.next().is_some() {
            return Err(KeyError::Invalid(
                "unexpected characters after the quoted key",
            ));
        }
        out
    } else {
        if !raw.chars().all(|c| c.is_ascii_graphic()) {
            return Err(KeyError::Invalid(
                "a bare key must be visible ASCII without spaces; quote it otherwise",
            ));
        }
        raw.to_owned()
    };
    if key.is_empty() {
        Err(KeyError::Empty)
    } else if key.len() > MAX_KEY_LEN {
        Err(KeyError::TooLong)
    } else {
        Ok(key)
    }
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

    fn parse(s: &str) -> Result<String, KeyError> {
        parse_key(&HeaderValue::from_str(s).unwrap())
    }

    #[test]
    fn bare_and_quoted() {
        assert_eq!(parse("abc").unwrap(), "abc");
        assert_eq!(parse("\"abc\"").unwrap(), "abc");
        assert_eq!(parse(r#""a\"b\\c""#).unwrap(), r#"a"b\c"#);
        assert_eq!(parse("\"a b\"").unwrap(), "a b");
        assert_eq!(parse(""), Err(KeyError::Empty));
        assert_eq!(parse("\"\""), Err(KeyError::Empty));
        assert!(matches!(parse("\"abc"), Err(KeyError::Invalid(_))));
        assert!(matches!(parse(r#""a\nb""#), Err(KeyError::Invalid(_))));
        assert!(matches!(parse("\"a\"b"), Err(KeyError::Invalid(_))));
        assert!(matches!(parse("a b"), Err(KeyError::Invalid(_))));
        assert_eq!(parse(&"k".repeat(255)).unwrap().len(), 255);
        assert_eq!(parse(&"k".repeat(256)), Err(KeyError::TooLong));
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
