//! The values a store exchanges with the layer: the request's
//! [`Fingerprint`], the [`LeaseToken`] of a claim, the claim's request and
//! outcome, and the [`StoredResponse`] replayed to retries.
//!
//! Below the store trait (`store/mod.rs`); uses only the store's error.

use std::fmt;
use std::time::Duration;

use bytes::Bytes;

use super::error::StoreError;

/// SHA-256 digest identifying the content of a request (method, path and
/// query, selected headers, body).
///
/// Two requests with the same idempotency key must carry the same fingerprint;
/// otherwise the second one is rejected with `422 Unprocessable Content`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint(pub [u8; 32]);

impl Fingerprint {
    /// The digest as 32 raw bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Builds a fingerprint from a byte slice; `None` unless it is 32 bytes long.
    pub fn from_slice(bytes: &[u8]) -> Option<Self> {
        let array: [u8; 32] = bytes.try_into().ok()?;
        Some(Self(array))
    }

    /// Lower-case hexadecimal representation (64 characters).
    pub fn to_hex(&self) -> String {
        use std::fmt::Write;
        let mut out = String::with_capacity(64);
        for b in self.0 {
            // Writing into a String never fails.
            let _ = write!(out, "{b:02x}");
        }
        out
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({})", self.to_hex())
    }
}

/// Opaque token proving ownership of an in-progress claim.
///
/// Only the holder of the current lease may complete or release the claim; a
/// claim taken over after the lock timeout gets a fresh token, so the stale
/// owner's later `complete`/`release` calls become no-ops.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct LeaseToken(pub uuid::Uuid);

impl LeaseToken {
    /// A fresh random token.
    pub fn new_random() -> Self {
        Self(uuid::Uuid::new_v4())
    }
}

impl fmt::Debug for LeaseToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LeaseToken({})", self.0)
    }
}

impl fmt::Display for LeaseToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// A final response as persisted by a store and replayed to retries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredResponse {
    /// HTTP status code.
    pub status: u16,
    /// Selected response headers, in order: the name in lower case, the
    /// value as the handler sent it, byte for byte (a value need not be
    /// text: a UTF-8 file name, a Latin-1 byte).
    pub headers: Vec<(String, Bytes)>,
    /// The complete response body.
    pub body: Bytes,
}

impl StoredResponse {
    /// Creates a stored response.
    pub fn new(status: u16, headers: Vec<(String, Bytes)>, body: impl Into<Bytes>) -> Self {
        Self {
            status,
            headers,
            body: body.into(),
        }
    }

    /// A response with a JSON body and `content-type: application/json`.
    ///
    /// Handy for handlers that complete their key inside their own database
    /// transaction (see `PostgresStore::complete_in_tx`).
    pub fn json(status: u16, body: impl Into<Bytes>) -> Self {
        Self::new(
            status,
            vec![(
                "content-type".to_owned(),
                Bytes::from_static(b"application/json"),
            )],
            body,
        )
    }
}

/// A header value as the shared stores write it: a JSON string when its
/// bytes are UTF-8 (every value the format before this one kept, written
/// the same way), else the array of its bytes.
#[cfg(any(feature = "postgres", feature = "redis"))]
#[derive(serde::Serialize)]
#[serde(untagged)]
enum ValueOut<'a> {
    Text(&'a str),
    Bytes(&'a [u8]),
}

/// A header value as the shared stores read it: either form of
/// [`ValueOut`], so records written before values were kept as bytes
/// (text only) are read as they were (a rolling upgrade).
#[cfg(any(feature = "postgres", feature = "redis"))]
#[derive(serde::Deserialize)]
#[serde(untagged)]
enum ValueIn {
    Text(String),
    Bytes(Vec<u8>),
}

/// A stored response's headers as the shared stores keep them: a JSON
/// array of `[name, value]` pairs, each value a string when it is UTF-8,
/// else the array of its bytes.
#[cfg(any(feature = "postgres", feature = "redis"))]
pub(crate) fn headers_to_json(headers: &[(String, Bytes)]) -> Result<String, StoreError> {
    let pairs: Vec<(&str, ValueOut<'_>)> = headers
        .iter()
        .map(|(name, value)| {
            let value = std::str::from_utf8(value).map_or(ValueOut::Bytes(value), ValueOut::Text);
            (name.as_str(), value)
        })
        .collect();
    serde_json::to_string(&pairs).map_err(|e| StoreError::with_source("encoding headers", e))
}

/// The headers [`headers_to_json`] wrote, or the format before it (values
/// as strings only).
#[cfg(any(feature = "postgres", feature = "redis"))]
pub(crate) fn headers_from_json(json: &[u8]) -> Result<Vec<(String, Bytes)>, StoreError> {
    let pairs: Vec<(String, ValueIn)> = serde_json::from_slice(json)
        .map_err(|e| StoreError::with_source("decoding stored headers", e))?;
    Ok(pairs
        .into_iter()
        .map(|(name, value)| match value {
            ValueIn::Text(text) => (name, Bytes::from(text)),
            ValueIn::Bytes(bytes) => (name, Bytes::from(bytes)),
        })
        .collect())
}

/// Parameters of one claim attempt.
#[derive(Clone, Copy, Debug)]
pub struct ClaimRequest<'a> {
    /// Caller identity the key is scoped to (tenant, API key id, ...).
    pub scope: &'a str,
    /// The idempotency key as sent by the client (unquoted).
    pub key: &'a str,
    /// Fingerprint of the request.
    pub fingerprint: Fingerprint,
    /// An in-progress claim whose lock is older than this may be taken over
    /// (in two steps, see [`IdempotencyStore::claim`](super::IdempotencyStore::claim))
    /// by a request with any fingerprint.
    pub lock_timeout: Duration,
    /// How long the record lives (from creation or takeover) before it expires.
    pub ttl: Duration,
}

/// Result of [`IdempotencyStore::claim`](super::IdempotencyStore::claim).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// The key was free (new, expired, or taken over after the lock timeout):
    /// the caller owns it now and must `complete` or `release` it.
    Claimed {
        /// Proves the ownership to the store's other calls.
        lease: LeaseToken,
        /// The key's fencing epoch: greater than that of every earlier
        /// claim of the same key, see [`next_epoch`].
        epoch: u64,
    },
    /// Another request holds the key and its lock has not timed out.
    InProgress {
        /// Whether the stored fingerprint equals the claimed one.
        fingerprint_matches: bool,
    },
    /// The key has a stored final response.
    Completed {
        /// The response to replay.
        response: StoredResponse,
        /// Whether the stored fingerprint equals the claimed one.
        fingerprint_matches: bool,
    },
}

/// The fencing epoch of a claim made at `now` (the store's clock) of a key
/// whose last claim had epoch `previous` (`None`: no record of one).
///
/// The store's time in microseconds since 1970, or one more than
/// `previous` if that is not greater. So an epoch only goes up for a key:
/// each takeover's is greater than its predecessor's, and so is that of a
/// claim made after the key's record was deleted (released, or swept once
/// its owner was gone), since that happens at least a lock timeout after
/// the earlier claim, unless the store's clock was set back by more than
/// that meanwhile. A downstream system that keeps the highest epoch it has
/// seen per key, and refuses a lower one, refuses a stale owner.
pub fn next_epoch(previous: Option<u64>, now: std::time::SystemTime) -> u64 {
    let micros = now
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
    match previous {
        Some(previous) => micros.max(previous.saturating_add(1)),
        None => micros.max(1),
    }
}

/// Longest scope or key a store accepts, in bytes. The layer stores a
/// 64-character digest as the scope and keys of at most 255 characters; the
/// limit protects stores used directly.
pub const MAX_STORED_ID_LEN: usize = 512;

/// Refuses a scope or key longer than [`MAX_STORED_ID_LEN`], with a
/// permanent error (retrying cannot help).
pub(crate) fn check_ids(scope: &str, key: &str) -> Result<(), StoreError> {
    for (what, value) in [("scope", scope), ("key", key)] {
        if value.len() > MAX_STORED_ID_LEN {
            return Err(StoreError::msg(format!(
                "the {what} is {} bytes long; stores accept at most {MAX_STORED_ID_LEN}",
                value.len()
            )));
        }
    }
    Ok(())
}

#[cfg(all(test, any(feature = "postgres", feature = "redis")))]
mod tests {
    use super::*;

    /// Values are written as strings when they are UTF-8, as arrays of
    /// bytes otherwise, and read back byte for byte.
    #[test]
    fn header_values_round_trip_byte_for_byte() {
        let headers = vec![
            ("content-type".to_owned(), Bytes::from_static(b"text/plain")),
            ("location".to_owned(), Bytes::from("/r\u{e9}sum\u{e9}")),
            ("x-latin-1".to_owned(), Bytes::from_static(b"r\xe9sum\xe9")),
        ];
        let json = headers_to_json(&headers).unwrap();
        assert_eq!(
            json,
            r#"[["content-type","text/plain"],["location","/résumé"],["x-latin-1",[114,233,115,117,109,233]]]"#
        );
        assert_eq!(headers_from_json(json.as_bytes()).unwrap(), headers);
    }

    /// A record written before values were kept as bytes (every value a
    /// string) is still read: a rolling upgrade replays what the old
    /// version stored.
    #[test]
    fn headers_of_the_format_before_are_read() {
        let old = br#"[["content-type","application/json"],["x-a","1"]]"#;
        assert_eq!(
            headers_from_json(old).unwrap(),
            vec![
                (
                    "content-type".to_owned(),
                    Bytes::from_static(b"application/json")
                ),
                ("x-a".to_owned(), Bytes::from_static(b"1")),
            ]
        );
    }
}
