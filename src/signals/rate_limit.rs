//! Reading a server's own rate-limit numbers: the IETF `RateLimit` and
//! `RateLimit-Policy` fields (draft-ietf-httpapi-ratelimit-headers-12) and
//! the common `X-RateLimit-Remaining` / `X-RateLimit-Reset` pair.
//!
//! ```
//! use std::time::{Duration, SystemTime};
//! use reqwest_safe_retry::pacing::rate_limit::from_headers;
//!
//! let mut headers = http::HeaderMap::new();
//! headers.insert("ratelimit", r#""default";r=0;t=3"#.parse().unwrap());
//! headers.insert("ratelimit-policy", r#""default";q=100;w=60"#.parse().unwrap());
//! let limit = from_headers(&headers, SystemTime::now()).unwrap();
//! assert_eq!(limit.remaining, Some(0));
//! assert_eq!(limit.reset, Some(Duration::from_secs(3)));
//! assert_eq!(limit.quota, Some((100, Duration::from_secs(60))));
//! ```
//!
//! # What is read, and what is ignored
//!
//! Both IETF fields are structured-field lists (RFC 9651): each member a
//! policy name with parameters. Of `RateLimit`, `r` (quota units left) and
//! `t` (seconds until the quota resets) are read; of `RateLimit-Policy`,
//! `q` (the quota) and `w` (its window in seconds). With several policies
//! the tightest wins, whatever their order: the fewest units left, and
//! among policies with none left the latest reset. A field that does not parse as a list is ignored
//! whole, as RFC 9651 asks; a parameter that is not a non-negative integer
//! of at most 15 digits is ignored. A parameter repeated in a member is
//! its last value (RFC 9651 §4.2.3.2: `r=5;r=0` is `r=0`). A list sent on
//! several field lines is one list, the lines joined with commas in the
//! order they came (RFC 9651 §4.2, as gateways with one limiter each send
//! them); a line that is not text makes the whole field unreadable.
//!
//! The name of the policy whose numbers are read is kept (as a digest):
//! a limit belongs to the policy the server names, and two differently
//! named policies on one host are two limits.
//!
//! `X-RateLimit-Reset` is read as seconds from now, unless it is large
//! enough to be a Unix time (at least 10⁹, that is after September 2001),
//! which GitHub and others send: then it is measured against the response's
//! own `Date` header, as a Retry-After date is. A reset more than a year
//! ahead cannot be a time (epoch milliseconds read as seconds, a broken
//! clock) and is ignored. Two values that disagree, a negative,
//! fractional or garbled value: ignored. Nothing here panics.
//!
//! No crate for structured fields is in the dependency tree; the subset
//! these two fields need (a list of items with integer parameters) is
//! small enough to read here, and rejecting anything else is the safe side.

use std::borrow::Cow;
use std::time::{Duration, SystemTime};

use http::HeaderMap;

/// A value at least this large in `X-RateLimit-Reset` is a Unix time.
const EPOCH_THRESHOLD: u64 = 1_000_000_000;

/// A reset further ahead than this is not a time: no rate-limit window
/// is longer than a year, and a value this far ahead is another unit
/// (epoch milliseconds) or a broken clock.
const MAX_RESET: Duration = Duration::from_secs(366 * 86_400);

/// RFC 9651 integers have at most 15 digits.
const MAX_DIGITS: usize = 15;

/// What a response said about its host's rate limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct RateLimit {
    /// Quota units left in the current window, if the server said.
    pub remaining: Option<u64>,
    /// Time until the quota resets, if the server said.
    pub reset: Option<Duration>,
    /// The quota and its window (`RateLimit-Policy`'s `q` and `w`).
    pub quota: Option<(u64, Duration)>,
    /// A digest of the name of the policy `remaining` and `reset` are
    /// from (`RateLimit`'s member), when the server named one.
    pub(crate) policy: Option<u64>,
}

impl RateLimit {
    /// A digest of the name of the policy whose `remaining` and `reset`
    /// these are, when the server named one in `RateLimit`: two answers
    /// with different names speak of two limits.
    pub fn policy_id(&self) -> Option<u64> {
        self.policy
    }

    /// Whether the host has no quota left (a known reset is then how long
    /// to hold requests).
    pub fn exhausted(&self) -> bool {
        self.remaining == Some(0)
    }

    /// The quota's rate, units per second, when the policy was given.
    pub fn quota_rate(&self) -> Option<f64> {
        let (q, w) = self.quota?;
        #[allow(clippy::cast_precision_loss)] // at most 15 digits
        let q = q as f64;
        (!w.is_zero() && q > 0.0).then(|| q / w.as_secs_f64())
    }
}

/// Whether a response carries a field [`from_headers`] reads, found in one
/// pass over its field names: cheaper, for the few fields of a usual
/// answer, than looking each of the four names up (each lookup parses and
/// hashes the name). A field name is lowercase, so its first byte alone
/// rules out the usual answer's fields (`content-type`, `date`, …) before
/// any prefix is compared.
pub(crate) fn has_fields(headers: &HeaderMap) -> bool {
    headers.keys().any(|name| {
        let name = name.as_str().as_bytes();
        match name.first() {
            Some(b'r') => name.starts_with(b"ratelimit"),
            Some(b'x') => name.starts_with(b"x-ratelimit-"),
            _ => false,
        }
    })
}

/// Reads the rate-limit fields of a response; `None` when it carries none
/// that can be read. `now` is the local wall clock, used for an epoch
/// `X-RateLimit-Reset` only when the response has no valid `Date`.
pub fn from_headers(headers: &HeaderMap, now: SystemTime) -> Option<RateLimit> {
    let mut limit = RateLimit::default();
    if let Some(items) = list_field(headers, "ratelimit")
        .as_deref()
        .and_then(parse_list)
    {
        // The tightest policy: the fewest units left, the first listed
        // among equals; among spent ones, the latest reset. Decided over
        // the whole list, so that the order the server lists its policies
        // in changes nothing.
        let mut tightest: Option<(u64, Option<Duration>, u64)> = None;
        for (name, params) in items {
            let Some(r) = param(&params, "r") else {
                continue;
            };
            let t = param(&params, "t")
                .filter(|t| *t <= MAX_RESET.as_secs())
                .map(Duration::from_secs);
            tightest = match tightest {
                Some(old) if r > old.0 || (r == old.0 && r > 0) => Some(old),
                // Among spent policies the latest reset, and its name.
                Some((0, old_t, old_name)) if r == 0 && old_t >= t => Some((0, old_t, old_name)),
                _ => Some((r, t, name)),
            };
        }
        if let Some((r, t, name)) = tightest {
            limit.remaining = Some(r);
            limit.reset = t;
            limit.policy = Some(name);
        }
    }
    if let Some(items) = list_field(headers, "ratelimit-policy")
        .as_deref()
        .and_then(parse_list)
    {
        // The tightest policy: the lowest rate.
        for (_, params) in items {
            if let (Some(q), Some(w)) = (param(&params, "q"), param(&params, "w")) {
                let candidate = (q, Duration::from_secs(w));
                let rate = |(q, w): (u64, Duration)| {
                    #[allow(clippy::cast_precision_loss)]
                    let q = q as f64;
                    q / w.as_secs_f64().max(f64::MIN_POSITIVE)
                };
                if limit.quota.is_none_or(|old| rate(candidate) < rate(old)) {
                    limit.quota = Some(candidate);
                }
            }
        }
    }
    if limit.remaining.is_none() && limit.reset.is_none() {
        limit.remaining = field(headers, "x-ratelimit-remaining").and_then(integer);
        limit.reset = field(headers, "x-ratelimit-reset")
            .and_then(integer)
            .and_then(|n| reset_of(n, headers, now));
    }
    (limit != RateLimit::default()).then_some(limit)
}

/// `X-RateLimit-Reset`: seconds, or a Unix time measured against the
/// response's `Date`; `None` when it is more than [`MAX_RESET`] ahead
/// (epoch milliseconds read as seconds are tens of thousands of years
/// ahead).
fn reset_of(n: u64, headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let reset = if n < EPOCH_THRESHOLD {
        Duration::from_secs(n)
    } else {
        let reference = super::retry_after::reference(headers, now);
        SystemTime::UNIX_EPOCH
            .checked_add(Duration::from_secs(n))
            .and_then(|at| at.duration_since(reference).ok())
            .unwrap_or(Duration::ZERO)
    };
    (reset <= MAX_RESET).then_some(reset)
}

/// The one value of a field; two that disagree are none (which proxy put
/// which first is an accident).
fn field<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    let mut values = headers.get_all(name).iter();
    let first = values.next()?;
    if values.any(|v| v != first) {
        return None;
    }
    first.to_str().ok()
}

/// A list field's value: its one line, or its lines joined with commas in
/// the order they came (RFC 9651 §4.2: a list sent on several lines is one
/// list). `None` when it is absent or a line is not text.
fn list_field<'h>(headers: &'h HeaderMap, name: &str) -> Option<Cow<'h, str>> {
    let mut values = headers.get_all(name).iter();
    let first = values.next()?.to_str().ok()?;
    let mut joined: Option<String> = None;
    for value in values {
        let text = joined.get_or_insert_with(|| first.to_owned());
        text.push_str(", ");
        text.push_str(value.to_str().ok()?);
    }
    Some(joined.map_or(Cow::Borrowed(first), Cow::Owned))
}

/// A non-negative integer of at most 15 digits.
fn integer(s: &str) -> Option<u64> {
    let s = s.trim();
    if s.is_empty() || s.len() > MAX_DIGITS || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// A member's parameters: each key once, in the order it first appeared,
/// with its last value when that is a non-negative integer.
type Params<'a> = Vec<(&'a str, Option<u64>)>;

/// The value of parameter `key`, when it is a non-negative integer.
fn param(params: &[(&str, Option<u64>)], key: &str) -> Option<u64> {
    params.iter().find(|(k, _)| *k == key).and_then(|(_, v)| *v)
}

/// An RFC 9651 list whose members are items (a string or a token) with
/// parameters: each member's name (a digest of the item's text) and its
/// parameters, with integer values read and any other bare item as
/// `None`. `None` when the field does not parse.
fn parse_list(field: &str) -> Option<Vec<(u64, Params<'_>)>> {
    let mut members = Vec::new();
    let mut rest = field.trim_matches([' ', '\t']);
    if rest.is_empty() {
        return None;
    }
    loop {
        let (params, after) = member(rest)?;
        members.push(params);
        rest = after.trim_start_matches([' ', '\t']);
        if rest.is_empty() {
            return Some(members);
        }
        rest = rest.strip_prefix(',')?.trim_start_matches([' ', '\t']);
        if rest.is_empty() {
            return None; // a trailing comma
        }
    }
}

/// One list member: a digest of its bare item's text, and its parameters.
fn member(s: &str) -> Option<((u64, Params<'_>), &str)> {
    let (_, mut rest) = bare_item(s)?;
    let name = name_digest(&s[..s.len() - rest.len()]);
    let mut params = Vec::new();
    while let Some(after) = rest.strip_prefix(';') {
        let after = after.trim_start_matches(' ');
        let end = after
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || "_-.*".contains(c)))
            .unwrap_or(after.len());
        let key = &after[..end];
        if !key.starts_with(|c: char| c.is_ascii_lowercase() || c == '*') {
            return None;
        }
        rest = &after[end..];
        let value = if let Some(v) = rest.strip_prefix('=') {
            let (item, after) = bare_item(v)?;
            rest = after;
            item
        } else {
            None // a boolean true
        };
        // RFC 9651 §4.2.3.2: a key seen before keeps its place and takes
        // the new value, so the last one wins (`r=5;r=0` is `r=0`).
        if let Some(seen) = params.iter_mut().find(|(k, _)| *k == key) {
            seen.1 = value;
            continue;
        }
        if params.len() >= 64 {
            return None; // no server needs more; a hostile one gets nothing
        }
        params.push((key, value));
    }
    Some(((name, params), rest))
}

/// FNV-1a of a member's item as sent (`"search"` and `search` differ:
/// a server spells its names one way).
fn name_digest(item: &str) -> u64 {
    item.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// A bare item: `Some(n)` for a non-negative integer, `None` for anything
/// else that parses (a string, a token, a byte sequence, a boolean, a
/// negative or decimal number); `None` overall when it does not parse.
#[allow(clippy::option_option)]
fn bare_item(s: &str) -> Option<(Option<u64>, &str)> {
    let bytes = s.as_bytes();
    match *bytes.first()? {
        b'"' => {
            let mut i = 1;
            while i < bytes.len() {
                match bytes[i] {
                    b'\\' => i += 2,
                    b'"' => return Some((None, &s[i + 1..])),
                    b if !(0x20..0x7f).contains(&b) => return None,
                    _ => i += 1,
                }
            }
            None
        }
        b':' => {
            let end = s[1..].find(':')? + 1;
            Some((None, &s[end + 1..]))
        }
        b'?' => match bytes.get(1) {
            Some(b'0' | b'1') => Some((None, &s[2..])),
            _ => None,
        },
        b'-' | b'0'..=b'9' => {
            let negative = bytes[0] == b'-';
            let digits = usize::from(negative);
            let end = s[digits..]
                .find(|c: char| !(c.is_ascii_digit() || c == '.'))
                .map_or(s.len(), |e| e + digits);
            let number = &s[digits..end];
            if number.is_empty() || number.starts_with('.') || number.ends_with('.') {
                return None;
            }
            if number.contains('.') {
                return Some((None, &s[end..])); // a decimal: not a count
            }
            if number.len() > MAX_DIGITS {
                return None;
            }
            let n = number.parse::<u64>().ok()?;
            Some(((!negative).then_some(n), &s[end..]))
        }
        b if b.is_ascii_alphabetic() || b == b'*' => {
            let end = s
                .find(|c: char| !(c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~:/".contains(c)))
                .unwrap_or(s.len());
            Some((None, &s[end..]))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests;
