//! The rules of the `Idempotency-Key` header, in one place for the client
//! that sends it and the server that reads it.
//!
//! ```
//! use idempotency_key::{parse, quote, validate, KeyError, MAX_LEN};
//!
//! // A key is 1 to 255 visible ASCII characters...
//! assert_eq!(validate("order-42-charge"), Ok(()));
//! assert_eq!(validate("two words"), Err(KeyError::InvalidCharacter));
//! assert_eq!(validate(&"k".repeat(MAX_LEN + 1)), Err(KeyError::TooLong));
//!
//! // ...sent bare (what Stripe and most APIs accept) or as the IETF draft's
//! // structured-field string; both wire forms carry the same key.
//! assert_eq!(quote(r#"a"b"#), r#""a\"b""#);
//! assert_eq!(parse(b"order-42-charge").unwrap(), "order-42-charge");
//! assert_eq!(parse(br#""a\"b""#).unwrap(), r#"a"b"#);
//! assert_eq!(parse(b"\"unterminated"), Err(KeyError::UnterminatedQuote));
//! ```
//!
//! # Why one definition
//!
//! A key the client accepts and the server refuses fails every attempt of a
//! logical operation; a key the server accepts and the client refuses can
//! never be sent. Both crates call these functions, and both crates' tests
//! read the same vectors (`fixtures/keys.tsv` in the repository).
//!
//! # The caller, between a server's layers
//!
//! [`CallerScope`] is the one type the two crates share beyond the rules: a
//! request extension in which the server's idempotency layer says which
//! caller it scoped a request's key to, so that the keys a handler derives
//! for its own calls follow that caller, not the raw credential bytes.
//!
//! # The rules
//!
//! * The key is 1 to [`MAX_LEN`] characters, each visible ASCII (`!` to `~`):
//!   what a header carries as-is, in either wire form. A space, a control
//!   character or non-ASCII text is refused, quoted or not, so every key can
//!   travel in both forms.
//! * Bare form: the header value is the key.
//! * Quoted form (IETF draft "The Idempotency-Key HTTP Header Field", an
//!   RFC 8941 string): `"` key `"`, where `"` and `\` inside are escaped with
//!   `\`; no other escape exists.
//! * Whitespace around the value (spaces, tabs) is not part of it
//!   (RFC 9110 §5.5).
// docs.rs (`--cfg docsrs`, see Cargo.toml) marks each feature-gated item
// with the feature it needs; on today's nightly `doc_cfg` does it alone.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

mod caller;

/// The README's example compiles and runs as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

use std::borrow::Cow;
use std::fmt;

pub use caller::CallerScope;

/// The longest key, in characters (bytes: keys are ASCII). Both the
/// Stripe API and the limits of common database indexes fit it.
pub const MAX_LEN: usize = 255;

/// Why a key, or a header value holding one, is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum KeyError {
    /// The key is empty (or the value holds only `""`).
    Empty,
    /// The key is longer than [`MAX_LEN`] characters.
    TooLong,
    /// The key holds a character outside visible ASCII: a space, a control
    /// character or non-ASCII text.
    InvalidCharacter,
    /// A quoted key has no closing `"`.
    UnterminatedQuote,
    /// A quoted key holds a `\` that is not followed by `"` or `\`.
    InvalidEscape,
    /// Something follows the closing `"` of a quoted key.
    TrailingCharacters,
}

impl KeyError {
    /// A stable snake_case name, for logs, JSON and test vectors.
    pub fn name(&self) -> &'static str {
        match self {
            KeyError::Empty => "empty",
            KeyError::TooLong => "too_long",
            KeyError::InvalidCharacter => "invalid_character",
            KeyError::UnterminatedQuote => "unterminated_quote",
            KeyError::InvalidEscape => "invalid_escape",
            KeyError::TrailingCharacters => "trailing_characters",
        }
    }

    /// What is wrong, in a lowercase phrase without trailing punctuation.
    pub fn reason(&self) -> &'static str {
        match self {
            KeyError::Empty => "the key is empty",
            KeyError::TooLong => "the key is longer than 255 characters",
            KeyError::InvalidCharacter => {
                "the key holds a character a header cannot carry (only visible ASCII is allowed)"
            }
            KeyError::UnterminatedQuote => "the quoted key has no closing quote",
            KeyError::InvalidEscape => "only \\\" and \\\\ escapes are allowed in a quoted key",
            KeyError::TrailingCharacters => "unexpected characters after the quoted key",
        }
    }
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.reason())
    }
}

impl std::error::Error for KeyError {}

/// Checks a key itself (not its wire form): 1 to [`MAX_LEN`] visible ASCII
/// characters.
///
/// # Errors
///
/// [`KeyError::Empty`], [`KeyError::InvalidCharacter`] or
/// [`KeyError::TooLong`], checked in that order.
pub fn validate(key: &str) -> Result<(), KeyError> {
    if key.is_empty() {
        return Err(KeyError::Empty);
    }
    if !key.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(KeyError::InvalidCharacter);
    }
    if key.len() > MAX_LEN {
        return Err(KeyError::TooLong);
    }
    Ok(())
}

/// Reads a key from a header value in either wire form, bare or quoted.
///
/// Takes bytes because a header value may hold any byte but a few control
/// characters; a bare key is borrowed, a quoted one is unescaped.
///
/// # Errors
///
/// [`KeyError::TooLong`] for a quoted value longer than any key of
/// [`MAX_LEN`] characters can be when quoted (checked before anything is
/// unescaped, so a huge value costs nothing), then the quoting errors for a
/// malformed quoted value, then the errors of [`validate`] for the key
/// inside.
pub fn parse(value: &[u8]) -> Result<Cow<'_, str>, KeyError> {
    let value = trim_ows(value);
    match value.strip_prefix(b"\"") {
        // Every character escaped, and the closing quote.
        Some(quoted) if quoted.len() > 2 * MAX_LEN + 1 => Err(KeyError::TooLong),
        Some(quoted) => {
            let key = unquote(quoted)?;
            validate(&key)?;
            Ok(Cow::Owned(key))
        }
        None => {
            // One pass over the bytes, then the checks `validate` would make
            // again, in its order (empty, invalid, too long).
            if !value.iter().all(u8::is_ascii_graphic) {
                return Err(KeyError::InvalidCharacter);
            }
            if value.is_empty() {
                return Err(KeyError::Empty);
            }
            if value.len() > MAX_LEN {
                return Err(KeyError::TooLong);
            }
            // Visible ASCII is checked above, so the conversion cannot fail;
            // the error arm keeps that promise without a panic.
            let key = std::str::from_utf8(value).map_err(|_| KeyError::InvalidCharacter)?;
            Ok(Cow::Borrowed(key))
        }
    }
}

/// The quoted (structured-field string) wire form of `key`: `"` and `\`
/// escaped, the whole in double quotes. The caller validates `key` first;
/// this only encodes.
pub fn quote(key: &str) -> String {
    let mut out = String::with_capacity(key.len() + 2);
    out.push('"');
    for c in key.chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

/// The text after an opening `"`: unescaped up to the closing `"`, which
/// must end the value.
fn unquote(quoted: &[u8]) -> Result<String, KeyError> {
    let mut out = String::with_capacity(quoted.len());
    let mut bytes = quoted.iter();
    while let Some(&b) = bytes.next() {
        match b {
            b'\\' => match bytes.next() {
                Some(&e @ (b'"' | b'\\')) => out.push(char::from(e)),
                _ => return Err(KeyError::InvalidEscape),
            },
            b'"' if bytes.as_slice().is_empty() => return Ok(out),
            b'"' => return Err(KeyError::TrailingCharacters),
            b if b.is_ascii_graphic() => out.push(char::from(b)),
            _ => return Err(KeyError::InvalidCharacter),
        }
    }
    Err(KeyError::UnterminatedQuote)
}

/// The value without the spaces and tabs around it.
fn trim_ows(mut value: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = value {
        value = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = value {
        value = rest;
    }
    value
}

#[cfg(test)]
mod tests {
    use super::*;

    include!("../fixtures/key_vectors.rs");

    #[test]
    fn every_vector_in_the_fixture() {
        let vectors = key_vectors(include_str!("../fixtures/keys.tsv"));
        for v in &vectors {
            let got = parse(&v.wire).map(Cow::into_owned).map_err(|e| e.name());
            assert_eq!(got, v.expected, "line {}: {:?}", v.line, v.wire);
        }
        assert!(vectors.len() >= 30, "only {} vectors", vectors.len());
    }

    #[test]
    fn every_accepted_key_survives_both_wire_forms() {
        for v in key_vectors(include_str!("../fixtures/keys.tsv")) {
            let Ok(key) = v.expected else { continue };
            assert_eq!(validate(&key), Ok(()), "line {}", v.line);
            assert_eq!(parse(key.as_bytes()).unwrap(), key, "line {}", v.line);
            assert_eq!(
                parse(quote(&key).as_bytes()).unwrap(),
                key,
                "line {}",
                v.line
            );
        }
    }

    /// A huge quoted value is refused by its length before it is
    /// unescaped (a 4 MiB one took half a second in a debug build): even
    /// one that is malformed at its end.
    #[test]
    fn a_huge_quoted_value_is_too_long_before_it_is_read() {
        let mut value = vec![b'"'];
        value.extend(std::iter::repeat_n(b'a', 4 << 20));
        value.extend_from_slice(b"\\x");
        assert_eq!(parse(&value), Err(KeyError::TooLong));
        // The longest quoted form of a key of MAX_LEN characters is read.
        let longest = quote(&"\"".repeat(MAX_LEN));
        assert_eq!(parse(longest.as_bytes()).unwrap(), "\"".repeat(MAX_LEN));
    }

    #[test]
    fn names_and_reasons_are_distinct() {
        let all = [
            KeyError::Empty,
            KeyError::TooLong,
            KeyError::InvalidCharacter,
            KeyError::UnterminatedQuote,
            KeyError::InvalidEscape,
            KeyError::TrailingCharacters,
        ];
        for (i, a) in all.iter().enumerate() {
            for b in &all[i + 1..] {
                assert_ne!(a.name(), b.name());
                assert_ne!(a.reason(), b.reason());
            }
        }
    }
}
