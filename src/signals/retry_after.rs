//! Reading `Retry-After` in every form RFC 9110 allows, and laying jitter on
//! top of it.
//!
//! ```
//! use std::time::{Duration, SystemTime};
//! use reqwest_safe_retry::classify::retry_after::parse;
//!
//! let now = SystemTime::UNIX_EPOCH + Duration::from_secs(784_111_777);
//! assert_eq!(parse("120", None, now), Some(Duration::from_secs(120)));
//! // An HTTP-date is measured against the response's own Date header.
//! assert_eq!(
//!     parse("Sun, 06 Nov 1994 08:49:47 GMT", Some("Sun, 06 Nov 1994 08:49:37 GMT"), now),
//!     Some(Duration::from_secs(10)),
//! );
//! // Read robustly (RFC 9110 §5.6.7): a numeric zone, with its offset applied.
//! assert_eq!(
//!     parse("Sun, 06 Nov 1994 09:49:47 +0100", Some("Sun, 06 Nov 1994 08:49:37 GMT"), now),
//!     Some(Duration::from_secs(10)),
//! );
//! // A number too large for a u64 is the largest hint, never a sooner retry.
//! assert_eq!(parse(&"9".repeat(40), None, now), Some(Duration::from_secs(u64::MAX)));
//! assert_eq!(parse("soon", None, now), None); // garbage: ignored
//! ```

use std::time::{Duration, SystemTime};

use rand::Rng;

use crate::vocabulary::uniform;

/// The most jitter laid on top of a hint: `min(hint × 0.2, 2 s)`.
const MAX_HINT_JITTER: Duration = Duration::from_secs(2);

mod date;

/// Parses a `Retry-After` value into a delay.
///
/// - delay-seconds (`"120"`): that many seconds. A number too large for a
///   `u64` is the largest value (RFC 9111 §1.2.2, as urllib3 reads it), so
///   it ends the operation as "Retry-After too long" instead of being
///   ignored: a bigger hint never means a sooner retry.
/// - an HTTP-date in IMF-fixdate, obsolete RFC 850 or asctime form, read
///   robustly (RFC 9110 §5.6.7: a numeric zone or `UTC` with its offset
///   applied, a one-digit day, a two-digit year within 50 years of the
///   reference, a leap second): the time from `date` (the response's own
///   `Date` header, when it has a valid one: the server's clock against the
///   server's clock) or else from `now`, to that date; a date in the past
///   means zero.
///
/// Anything else — negative, fractional, garbage, a date the grammar rejects
/// — is `None`, and the computed backoff applies. Never panics.
pub fn parse(value: &str, date: Option<&str>, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if value.is_empty() {
        return None;
    }
    if value.bytes().all(|b| b.is_ascii_digit()) {
        // All digits, so the only way to fail is to overflow.
        return Some(Duration::from_secs(value.parse().unwrap_or(u64::MAX)));
    }
    let reference = date.and_then(|d| date::parse(d, now)).unwrap_or(now);
    let at = date::parse(value, reference)?;
    Some(at.duration_since(reference).unwrap_or(Duration::ZERO))
}

/// Reads `Retry-After` (and `Date`) from response headers; see [`parse`].
///
/// Two `Retry-After` fields that disagree (or one that cannot be read next
/// to one that can) are both ignored: which one is first is an accident of
/// the proxies in between, and a retry must not depend on it.
pub fn from_headers(headers: &http::HeaderMap, now: SystemTime) -> Option<Duration> {
    let date = headers
        .get(http::header::DATE)
        .and_then(|d| d.to_str().ok());
    let mut hints = headers
        .get_all(http::header::RETRY_AFTER)
        .iter()
        .map(|v| parse(v.to_str().ok()?, date, now));
    let first = hints.next()??;
    hints.all(|h| h == Some(first)).then_some(first)
}

/// The time a response's own numbers are measured against: its `Date`
/// header when it has a valid one (the server's clock against the server's
/// clock), else `now`.
pub(crate) fn reference(headers: &http::HeaderMap, now: SystemTime) -> SystemTime {
    headers
        .get(http::header::DATE)
        .and_then(|d| d.to_str().ok())
        .and_then(|d| date::parse(d, now))
        .unwrap_or(now)
}

/// Whether the headers carry a readable `Retry-After`.
pub(crate) fn has_hint(headers: &http::HeaderMap) -> bool {
    // Whether a value can be read does not depend on the clock: `now` only
    // moves the result (and the century of a two-digit year).
    from_headers(headers, SystemTime::UNIX_EPOCH).is_some()
}

/// The delay when a server sent a hint: `max(computed, hint + U(0, min(hint ×
/// 0.2, 2 s)))`. The hint is a floor; the jitter on top keeps obedient clients
/// from coming back in the same instant.
pub fn floor_with_jitter<R: Rng + ?Sized>(
    computed: Duration,
    hint: Duration,
    rng: &mut R,
) -> Duration {
    let spread = hint.mul_f64(0.2).min(MAX_HINT_JITTER);
    computed.max(hint.saturating_add(uniform(rng, Duration::ZERO, spread)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{rngs::StdRng, SeedableRng};

    /// Sun, 06 Nov 1994 08:49:37 GMT.
    fn now() -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(784_111_777)
    }

    #[test]
    fn a_date_is_measured_against_the_response_date() {
        // The local clock is an hour behind the server: the Date header wins.
        let local = now() - Duration::from_secs(3600);
        let got = parse(
            "Sun, 06 Nov 1994 08:49:47 GMT",
            Some("Sun, 06 Nov 1994 08:49:37 GMT"),
            local,
        );
        assert_eq!(got, Some(Duration::from_secs(10)));
        // A broken Date header falls back to the local clock.
        let got = parse("Sun, 06 Nov 1994 08:49:47 GMT", Some("yesterday"), now());
        assert_eq!(got, Some(Duration::from_secs(10)));
    }

    fn headers(pairs: &[(&str, &str)]) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        for (name, value) in pairs {
            h.append(
                http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                value.parse().unwrap(),
            );
        }
        h
    }

    #[test]
    fn two_retry_after_fields_that_disagree_are_both_ignored() {
        let date = ("date", "Sun, 06 Nov 1994 08:49:37 GMT");
        let read = |pairs: &[(&str, &str)]| from_headers(&headers(pairs), now());
        assert_eq!(read(&[("retry-after", "5")]), Some(Duration::from_secs(5)));
        assert_eq!(read(&[("retry-after", "5"), ("retry-after", "600")]), None);
        assert_eq!(read(&[("retry-after", "600"), ("retry-after", "5")]), None);
        assert_eq!(read(&[("retry-after", "soon"), ("retry-after", "5")]), None);
        assert_eq!(read(&[("retry-after", "5"), ("retry-after", "soon")]), None);
        // The same hint twice, even in two forms, is one hint.
        assert_eq!(
            read(&[("retry-after", "5"), ("retry-after", "5")]),
            Some(Duration::from_secs(5))
        );
        assert_eq!(
            read(&[
                date,
                ("retry-after", "10"),
                ("retry-after", "Sun, 06 Nov 1994 08:49:47 GMT")
            ]),
            Some(Duration::from_secs(10))
        );
        assert!(has_hint(&headers(&[("retry-after", "5")])));
        assert!(!has_hint(&headers(&[("retry-after", "soon")])));
        assert!(!has_hint(&headers(&[])));
    }

    #[test]
    fn an_overflowing_number_is_the_largest_value() {
        let max = Some(Duration::from_secs(u64::MAX));
        assert_eq!(parse("18446744073709551616", None, now()), max);
        assert_eq!(parse(&"9".repeat(40), None, now()), max);
        assert_eq!(parse(&"9".repeat(10_000), None, now()), max);
    }

    proptest::proptest! {
        #[test]
        fn any_text_parses_or_is_ignored_without_panicking(
            value in proptest::prelude::any::<String>(),
            date in proptest::option::of(proptest::prelude::any::<String>()),
            secs in proptest::prelude::any::<u64>(),
        ) {
            let now = SystemTime::UNIX_EPOCH + Duration::from_secs(secs / 2);
            let _ = parse(&value, date.as_deref(), now);
        }
    }

    #[test]
    fn jitter_sits_on_top_of_the_hint() {
        let mut rng = StdRng::seed_from_u64(5);
        for _ in 0..1000 {
            let d = floor_with_jitter(Duration::ZERO, Duration::from_secs(3), &mut rng);
            assert!(d >= Duration::from_secs(3) && d <= Duration::from_millis(3600));
            let d = floor_with_jitter(Duration::ZERO, Duration::from_secs(100), &mut rng);
            assert!(d >= Duration::from_secs(100) && d <= Duration::from_secs(102));
        }
        let spread: std::collections::HashSet<_> = (0..100)
            .map(|_| floor_with_jitter(Duration::ZERO, Duration::from_secs(3), &mut rng))
            .collect();
        assert!(
            spread.len() > 90,
            "obedient clients must not return together"
        );
        let d = floor_with_jitter(Duration::from_secs(9), Duration::from_secs(1), &mut rng);
        assert_eq!(d, Duration::from_secs(9));
    }
}
