//! Reading `Retry-After` in every form RFC 9110 allows, and laying jitter on
//! top of it.
//!
//! ```
//! use std::time::{Duration, SystemTime};
//! use reqwest_safe_retry::retry_after::parse;
//!
//! let now = SystemTime::UNIX_EPOCH + Duration::from_secs(784_111_777);
//! assert_eq!(parse("120", None, now), Some(Duration::from_secs(120)));
//! // An HTTP-date is measured against the response's own Date header.
//! assert_eq!(
//!     parse("Sun, 06 Nov 1994 08:49:47 GMT", Some("Sun, 06 Nov 1994 08:49:37 GMT"), now),
//!     Some(Duration::from_secs(10)),
//! );
//! assert_eq!(parse("soon", None, now), None); // garbage: ignored
//! ```

use std::time::{Duration, SystemTime};

use rand::Rng;

use crate::backoff::uniform;

/// The most jitter laid on top of a hint: `min(hint × 0.2, 2 s)`.
const MAX_HINT_JITTER: Duration = Duration::from_secs(2);

/// Parses a `Retry-After` value into a delay.
///
/// - delay-seconds (`"120"`): that many seconds;
/// - an HTTP-date in IMF-fixdate, obsolete RFC 850 or asctime form: the time
///   from `date` (the response's own `Date` header, when it has a valid one:
///   the server's clock against the server's clock) or else from `now`, to
///   that date; a date in the past means zero.
///
/// Anything else — negative, fractional, garbage, a number too large for a
/// `u64` — is `None`, and the computed backoff applies. Never panics.
pub fn parse(value: &str, date: Option<&str>, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if value.is_empty() {
        return None;
    }
    if value.bytes().all(|b| b.is_ascii_digit()) {
        return value.parse::<u64>().ok().map(Duration::from_secs);
    }
    let at = httpdate::parse_http_date(value).ok()?;
    let reference = date
        .and_then(|d| httpdate::parse_http_date(d.trim()).ok())
        .unwrap_or(now);
    Some(at.duration_since(reference).unwrap_or(Duration::ZERO))
}

/// Reads `Retry-After` (and `Date`) from response headers; see [`parse`].
pub fn from_headers(headers: &http::HeaderMap, now: SystemTime) -> Option<Duration> {
    let value = headers.get(http::header::RETRY_AFTER)?.to_str().ok()?;
    let date = headers
        .get(http::header::DATE)
        .and_then(|d| d.to_str().ok());
    parse(value, date, now)
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
