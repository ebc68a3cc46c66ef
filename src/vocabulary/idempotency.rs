//! Idempotency keys and the method safety rule.
//!
//! ```
//! use reqwest_safe_retry::IdempotencyKey;
//! use reqwest_safe_retry::keys::KeyFormat;
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

use bytes::Bytes;
use http::{HeaderValue, Method};

use super::error::KeyError;

/// The longest key accepted, in characters (bytes: keys are visible ASCII).
/// The same limit the server half reads: both come from the
/// `idempotency-key` crate.
pub const MAX_KEY_LEN: usize = idempotency_key::MAX_LEN;

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
        idempotency_key::validate(&key).map_err(key_error)?;
        Ok(IdempotencyKey(key))
    }

    /// A fresh key from `generator`. A v4 key is drawn from the kernel's
    /// random generator without a system call where the kernel allows it,
    /// and never repeats after `fork()` or a VM snapshot restore (see
    /// [`KeyGenerator::UuidV4`]).
    pub fn generate(generator: KeyGenerator) -> Self {
        let mut text = uuid::Uuid::encode_buffer();
        IdempotencyKey(
            new_uuid(generator)
                .hyphenated()
                .encode_lower(&mut text)
                .to_owned(),
        )
    }

    /// The key itself.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The key, as an owned string.
    pub fn into_string(self) -> String {
        self.0
    }

    /// The header value in the given wire form.
    ///
    /// # Errors
    ///
    /// None for a validated key; the `Result` guards the conversion.
    pub fn header_value(&self, format: KeyFormat) -> Result<HeaderValue, KeyError> {
        let quoted;
        let text = match format {
            KeyFormat::Bare => &self.0,
            KeyFormat::StructuredField => {
                quoted = idempotency_key::quote(&self.0);
                &quoted
            }
        };
        HeaderValue::from_str(text).map_err(|_| KeyError::new("not a valid header value"))
    }

    /// Reads a key a caller already put in a header, in either wire form,
    /// by the rules the server half reads it with.
    pub(crate) fn from_header(value: &HeaderValue) -> Result<Self, KeyError> {
        idempotency_key::parse(value.as_bytes())
            .map(|key| IdempotencyKey(key.into_owned()))
            .map_err(key_error)
    }
}

/// A fresh UUID from `generator`.
fn new_uuid(generator: KeyGenerator) -> uuid::Uuid {
    match generator {
        KeyGenerator::UuidV4 => {
            let mut bytes = [0; 16];
            super::keygen::fill(&mut bytes);
            uuid::Builder::from_random_bytes(bytes).into_uuid()
        }
        KeyGenerator::UuidV7 => uuid::Uuid::now_v7(),
    }
}

/// The length of a hyphenated UUID.
const UUID_LEN: usize = uuid::fmt::Hyphenated::LENGTH;

/// A key's text in one shared allocation: the header every attempt carries
/// and the report hold the same bytes, so a copy of the request for the
/// next attempt copies a reference, not the key.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct SharedKey(Bytes);

impl SharedKey {
    /// A fresh key from `generator`, in one allocation.
    pub(crate) fn generate(generator: KeyGenerator) -> Self {
        SharedKey::of_uuid(new_uuid(generator))
    }

    /// A UUID's hyphenated text, in one allocation.
    fn of_uuid(uuid: uuid::Uuid) -> Self {
        let mut text = [0; UUID_LEN];
        uuid.hyphenated().encode_lower(&mut text);
        SharedKey(Bytes::from_owner(text))
    }

    /// The key's text.
    pub(crate) fn as_str(&self) -> &str {
        // Always UTF-8: made from a validated key or a UUID's ASCII text.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }

    /// The header value in the given wire form; the bare form shares the
    /// key's bytes.
    pub(crate) fn header_value(&self, format: KeyFormat) -> Result<HeaderValue, KeyError> {
        let value = match format {
            KeyFormat::Bare => HeaderValue::from_maybe_shared(self.0.clone()),
            KeyFormat::StructuredField => {
                HeaderValue::from_str(&idempotency_key::quote(self.as_str()))
            }
        };
        value.map_err(|_| KeyError::new("not a valid header value"))
    }

    /// The `ordinal`th key derived from `seed` (a digest of a request's own
    /// key and its caller): the same seed and ordinal give the same key, on
    /// every machine and version, in the shape of a UUID (version 8).
    pub(crate) fn derived(seed: &[u8; 32], ordinal: u32) -> Self {
        use sha2::{Digest, Sha256};
        let digest = Sha256::new()
            .chain_update(seed)
            .chain_update(ordinal.to_be_bytes())
            .finalize();
        let mut bytes = [0u8; 16];
        bytes.copy_from_slice(&digest[..16]);
        SharedKey::of_uuid(uuid::Builder::from_custom_bytes(bytes).into_uuid())
    }
}

/// The seed of the keys derived from a request's `key` for its `caller`
/// (the request's `Authorization`, or nothing): two callers' requests with
/// the same key never derive the same keys.
pub(crate) fn derivation_seed(caller: &[u8], key: &str) -> [u8; 32] {
    seed(b"reqwest-safe-retry derived key 1", caller, key)
}

/// The seed of the keys derived from a request's `key` for the caller a
/// server's idempotency layer scoped it to (`scope`, its stored scope):
/// tagged apart from [`derivation_seed`], so that no scope can meet the
/// bytes of a credential.
pub(crate) fn scoped_derivation_seed(scope: &str, key: &str) -> [u8; 32] {
    seed(
        b"reqwest-safe-retry derived key 1, server scope",
        scope.as_bytes(),
        key,
    )
}

fn seed(tag: &[u8], caller: &[u8], key: &str) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    let len = |n: usize| u64::try_from(n).unwrap_or(u64::MAX).to_be_bytes();
    Sha256::new()
        .chain_update(tag)
        .chain_update(len(caller.len()))
        .chain_update(caller)
        .chain_update(len(key.len()))
        .chain_update(key.as_bytes())
        .finalize()
        .into()
}

impl From<IdempotencyKey> for SharedKey {
    fn from(key: IdempotencyKey) -> Self {
        SharedKey(Bytes::from(key.0))
    }
}

impl fmt::Debug for SharedKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

/// The shared rules' error, as this crate's opaque [`KeyError`].
fn key_error(e: idempotency_key::KeyError) -> KeyError {
    KeyError::new(e.reason())
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
    ///
    /// Its 122 random bits come from the **kernel's** random number
    /// generator, never from a generator kept in this process's memory:
    /// one `getrandom` system call per key, through the `uuid` crate (and
    /// `getrandom`, the crate every Rust program's randomness comes from),
    /// so neither a `fork()` child nor a restored VM snapshot repeats a key
    /// its parent made or will make (`checks/tests/keygen_fork.rs`).
    ///
    /// A generator seeded once and kept in memory (`rand`'s `ThreadRng`) is
    /// faster still, but after `fork()` or a snapshot restore two processes
    /// continue the same sequence and send the same key for two different
    /// payments: the server replays one payment's response to the other.
    #[default]
    UuidV4,
    /// Time-ordered UUID v7: indexes better in the server's key table. Its
    /// random bits cost one `getrandom` system call per key.
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

    include!("../../fixtures/key_vectors.rs");

    /// Every vector a header can hold: a key the caller set is read by the
    /// same rules as the server's, and an accepted key is sent back in both
    /// wire forms unchanged.
    #[test]
    fn the_shared_key_vectors() {
        let mut checked = 0;
        for v in key_vectors(include_str!("../../fixtures/keys.tsv")) {
            let Ok(value) = HeaderValue::from_bytes(&v.wire) else {
                continue; // bytes no header can hold
            };
            let got = IdempotencyKey::from_header(&value);
            match &v.expected {
                Ok(key) => {
                    let got = got.unwrap_or_else(|e| panic!("line {}: {e}", v.line));
                    assert_eq!(got.as_str(), key, "line {}", v.line);
                    assert_eq!(IdempotencyKey::new(key.as_str()).as_ref(), Ok(&got));
                    for format in [KeyFormat::Bare, KeyFormat::StructuredField] {
                        let wire = got.header_value(format).unwrap();
                        assert_eq!(IdempotencyKey::from_header(&wire).unwrap(), got);
                    }
                }
                Err(name) => {
                    let err = got.expect_err(&format!("line {} was accepted", v.line));
                    let shared = idempotency_key::parse(&v.wire).unwrap_err();
                    assert_eq!(shared.name(), *name, "line {}", v.line);
                    assert_eq!(err, key_error(shared), "line {}", v.line);
                }
            }
            checked += 1;
        }
        assert!(checked >= 30, "only {checked} vectors fit in a header");
    }

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
    fn a_shared_key_reads_prints_and_travels_as_its_text() {
        let key = SharedKey::from(IdempotencyKey::new(r#"a"b"#).unwrap());
        assert_eq!(key.as_str(), r#"a"b"#);
        assert_eq!(format!("{key:?}"), format!("{:?}", r#"a"b"#));
        assert_eq!(key.header_value(KeyFormat::Bare).unwrap(), r#"a"b"#);
        assert_eq!(
            key.header_value(KeyFormat::StructuredField).unwrap(),
            r#""a\"b""#
        );
        for generator in [KeyGenerator::UuidV4, KeyGenerator::UuidV7] {
            let fresh = SharedKey::generate(generator);
            let version = if generator == KeyGenerator::UuidV4 {
                "4"
            } else {
                "7"
            };
            assert_eq!(fresh.as_str().len(), 36);
            assert_eq!(&fresh.as_str()[14..15], version);
            let wire = fresh.header_value(KeyFormat::Bare).unwrap();
            assert_eq!(
                IdempotencyKey::from_header(&wire).unwrap().as_str(),
                fresh.as_str()
            );
            assert_ne!(fresh, SharedKey::generate(generator));
        }
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
