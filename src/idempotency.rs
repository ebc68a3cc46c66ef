//! Idempotency keys and the method safety rule.
//!
//! ```
//! use reqwest_safe_retry::{IdempotencyKey, KeyFormat};
//!
//! let key = IdempotencyKey::new("order-42-charge").unwrap();
//! assert_eq!(key.header_value(KeyFormat::Bare).unwrap(), "order-42-charge");
//! assert_eq!(key.header_value(KeyFormat::StructuredField).unwrap(), "\"order-42-charge\"");
//! assert!(IdempotencyKey::new("line\nbreak").is_err());
//! assert!(IdempotencyKey::new("x".repeat(256)).is_err());
//! ```
//!
//! # Why a key
//!
//! A `POST /payments` whose response was lost may or may not have charged
//! the card. Sending it again is a double charge unless the server can tell
//! the retry from a new payment: the Idempotency-Key (IETF draft "The
//! Idempotency-Key HTTP Header Field"; Stripe) names the logical operation,
//! and every attempt of it carries the same key.

use std::fmt;

use http::{HeaderValue, Method};

use crate::error::KeyError;

/// The longest key accepted, in characters (bytes: keys are visible ASCII).
pub const MAX_KEY_LEN: usize = 255;

/// A validated idempotency key: 1 to 255 visible ASCII characters.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    /// Validates a key.
    ///
    /// # Errors
    ///
    /// [`KeyError`] when the key is empty, longer than 255 characters, or
    /// holds a character outside visible ASCII (`!` to `~`): control
    /// characters, spaces and non-ASCII text cannot travel in a header as-is.
    pub fn new(key: impl Into<String>) -> Result<Self, KeyError> {
        let key = key.into();
        validate(&key)?;
        Ok(IdempotencyKey(key))
    }

    /// A fresh key from `generator`.
    pub fn generate(generator: KeyGenerator) -> Self {
        let uuid = match generator {
            KeyGenerator::UuidV4 => uuid::Uuid::new_v4(),
            KeyGenerator::UuidV7 => uuid::Uuid::now_v7(),
        };
        IdempotencyKey(uuid.hyphenated().to_string())
    }

    /// The key itself.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The header value in the given wire form.
    ///
    /// # Errors
    ///
    /// None for a validated key; the `Result` guards the conversion.
    pub fn header_value(&self, format: KeyFormat) -> Result<HeaderValue, KeyError> {
        let text = match format {
            KeyFormat::Bare => self.0.clone(),
            KeyFormat::StructuredField => {
                let mut s = String::with_capacity(self.0.len() + 2);
                s.push('"');
                for c in self.0.chars() {
                    if c == '"' || c == '\\' {
                        s.push('\\');
                    }
                    s.push(c);
                }
                s.push('"');
                s
            }
        };
        HeaderValue::from_str(&text).map_err(|_| KeyError::new("not a valid header value"))
    }

    /// Reads a key a caller already put in a header, in either wire form.
    pub(crate) fn from_header(value: &HeaderValue) -> Result<Self, KeyError> {
        let text = value
            .to_str()
            .map_err(|_| KeyError::new("the header holds non-ASCII bytes"))?;
        let unquoted = match text.strip_prefix('"').and_then(|t| t.strip_suffix('"')) {
            Some(inner) => {
                let mut out = String::with_capacity(inner.len());
                let mut chars = inner.chars();
                while let Some(c) = chars.next() {
                    out.push(if c == '\\' {
                        chars.next().unwrap_or(c)
                    } else {
                        c
                    });
                }
                out
            }
            None => text.to_owned(),
        };
        IdempotencyKey::new(unquoted)
    }
}

fn validate(key: &str) -> Result<(), KeyError> {
    if key.is_empty() {
        return Err(KeyError::new("the key is empty"));
    }
    if key.len() > MAX_KEY_LEN {
        return Err(KeyError::new("the key is longer than 255 characters"));
    }
    if !key.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(KeyError::new(
            "the key holds a character a header cannot carry (only visible ASCII is allowed)",
        ));
    }
    Ok(())
}

impl fmt::Debug for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("IdempotencyKey").field(&self.0).finish()
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// How the key travels on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum KeyFormat {
    /// A bare token, `Idempotency-Key: 8e03…`: what Stripe and most APIs
    /// accept. The default.
    #[default]
    Bare,
    /// The IETF draft's structured-field string, `Idempotency-Key: "8e03…"`.
    StructuredField,
}

/// How a fresh key is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum KeyGenerator {
    /// Random UUID v4. The default.
    #[default]
    UuidV4,
    /// Time-ordered UUID v7: indexes better in the server's key table.
    UuidV7,
}

/// RFC 9110 §9.2.2: GET, HEAD, OPTIONS, TRACE, PUT and DELETE are idempotent.
pub fn is_idempotent(method: &Method) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::PUT | Method::DELETE
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_validated() {
        assert!(IdempotencyKey::new("a").is_ok());
        assert!(IdempotencyKey::new("k".repeat(255)).is_ok());
        assert!(IdempotencyKey::new("k".repeat(256)).is_err());
        assert!(IdempotencyKey::new("").is_err());
        assert!(IdempotencyKey::new("with space").is_err());
        assert!(IdempotencyKey::new("tab\t").is_err());
        assert!(IdempotencyKey::new("naïve").is_err());
    }

    #[test]
    fn structured_field_form_round_trips() {
        let key = IdempotencyKey::new(r#"a"b\c"#).unwrap();
        let value = key.header_value(KeyFormat::StructuredField).unwrap();
        assert_eq!(value, r#""a\"b\\c""#);
        assert_eq!(IdempotencyKey::from_header(&value).unwrap(), key);
    }

    #[test]
    fn generated_keys_differ_and_v7_is_time_ordered() {
        let a = IdempotencyKey::generate(KeyGenerator::UuidV4);
        let b = IdempotencyKey::generate(KeyGenerator::UuidV4);
        assert_ne!(a, b);
        assert_eq!(a.as_str().len(), 36);
        let first = IdempotencyKey::generate(KeyGenerator::UuidV7);
        let second = IdempotencyKey::generate(KeyGenerator::UuidV7);
        assert!(first.as_str() < second.as_str());
        assert_eq!(&first.as_str()[14..15], "7");
    }

    #[test]
    fn idempotent_methods_follow_rfc_9110() {
        for m in ["GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"] {
            assert!(
                is_idempotent(&Method::from_bytes(m.as_bytes()).unwrap()),
                "{m}"
            );
        }
        for m in ["POST", "PATCH", "CONNECT", "PURGE"] {
            assert!(
                !is_idempotent(&Method::from_bytes(m.as_bytes()).unwrap()),
                "{m}"
            );
        }
    }
}
