//! The deadline header: the time a caller still waits, in whole
//! milliseconds, on every attempt and read by the inbound layer.

use std::time::Duration;

use http::header::Entry;
use http::{HeaderMap, HeaderValue};
use reqwest::Request;

use crate::engine::{AttemptContext, RetryPolicy};

/// The header that carries the time left, in milliseconds, by default:
/// `Request-Timeout-Ms`.
///
/// No standard name exists for HTTP. This one says what the value is — the
/// time the caller will still wait for this request, as a duration (like
/// gRPC's `grpc-timeout` and userver's `X-YaTaxi-Client-TimeoutMs`) — and
/// its unit; it has no `X-` prefix (RFC 6648) and no vendor prefix (Envoy
/// sets and strips its own `x-envoy-*` headers).
pub const DEFAULT_DEADLINE_HEADER: &str = "request-timeout-ms";

/// The time left a request carries in `name`: whole milliseconds, ASCII
/// digits only. Several values (several lines, or one folded with
/// commas): the smallest. A malformed value (empty,
/// signed, fractional, not a number) is ignored, as if absent; one too
/// large for a `u64` is the largest.
pub(crate) fn time_left_in(headers: &HeaderMap, name: &http::HeaderName) -> Option<Duration> {
    time_left_of(headers.get_all(name).iter())
}

/// [`time_left_in`], of a header's values.
fn time_left_of<'a>(values: impl Iterator<Item = &'a HeaderValue>) -> Option<Duration> {
    values
        // Lines folded into one with commas (RFC 9110 §5.3) count apart,
        // and each piece on its own: bytes that are not text in one piece
        // (a header may carry any byte but controls) spoil that piece only.
        .flat_map(|line| line.as_bytes().split(|&b| b == b','))
        .filter_map(|piece| {
            // Spaces and tabs: the only whitespace a header value holds.
            let digits = piece.trim_ascii();
            if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
                return None;
            }
            // Only digits: valid UTF-8, and the one failure left is overflow.
            let text = std::str::from_utf8(digits).ok()?;
            Some(text.parse::<u64>().unwrap_or(u64::MAX))
        })
        .min()
        .map(Duration::from_millis)
}

/// Sends the attempt number and the time left downstream, when asked to.
/// The time left is what this attempt is waited for (`waited`: the
/// attempt's timeout, which is the call's time left or less), not the
/// whole call's: past it this attempt is abandoned, so work on it is work
/// nobody waits for. A value the request already carries that is smaller
/// (an application passing on its caller's) is kept.
// Inlined into the attempt as it was before the hedge became its second
// caller: out of line it costs every attempt a call (~45 instructions).
#[inline(always)]
pub(super) fn stamp_headers(
    policy: &RetryPolicy,
    request: &mut Request,
    ctx: &AttemptContext,
    waited: Option<std::time::Duration>,
) {
    let settings = &policy.settings;
    if let Some(name) = &settings.attempt_header {
        request
            .headers_mut()
            .insert(name.clone(), HeaderValue::from(ctx.attempt()));
    }
    if let (Some(name), Some(_), Some(left)) = (&settings.deadline_header, ctx.time_left(), waited)
    {
        let value = || {
            let ms = u64::try_from(left.as_millis()).unwrap_or(u64::MAX);
            match &settings.deadline_value {
                Some((whole, value)) if *whole == ms => value.clone(),
                _ => HeaderValue::from(ms),
            }
        };
        let headers = request.headers_mut();
        if headers.is_empty() {
            // Nothing carried (a GET's usual headers are added later, by
            // reqwest): no lookup before the insert.
            headers.insert(name.clone(), value());
            return;
        }
        // One lookup for the read and the write (the name hashed once).
        match headers.entry(name) {
            Entry::Vacant(line) => {
                line.insert(value());
            }
            Entry::Occupied(mut line) => {
                if time_left_of(line.iter()).is_none_or(|carried| left < carried) {
                    line.insert(value());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    /// A byte that is not text spoils only the comma-separated piece it is
    /// in: the valid values on its line still count.
    #[test]
    fn a_piece_that_is_not_text_hides_nothing_beside_it() {
        let name = http::HeaderName::from_static(DEFAULT_DEADLINE_HEADER);
        let mut headers = HeaderMap::new();
        headers.append(&name, HeaderValue::from_static("900"));
        headers.append(&name, HeaderValue::from_bytes(b"300, \xc3\xa9").unwrap());
        assert_eq!(
            time_left_in(&headers, &name),
            Some(Duration::from_millis(300))
        );
        let mut one = HeaderMap::new();
        one.append(&name, HeaderValue::from_bytes(b"\xff7, 250 ,\t").unwrap());
        assert_eq!(time_left_in(&one, &name), Some(Duration::from_millis(250)));
    }

    fn read(values: &[&str]) -> Option<Duration> {
        let name = http::HeaderName::from_static(DEFAULT_DEADLINE_HEADER);
        let mut headers = HeaderMap::new();
        for v in values {
            headers.append(&name, HeaderValue::from_str(v).unwrap());
        }
        time_left_in(&headers, &name)
    }

    #[test]
    fn the_header_is_whole_milliseconds_and_anything_else_is_ignored() {
        assert_eq!(read(&[]), None);
        assert_eq!(read(&["1500"]), Some(Duration::from_millis(1500)));
        assert_eq!(read(&[" 0 "]), Some(Duration::ZERO));
        for bad in ["", "abc", "-5", "+5", "1.5", "1e3", "12 ms", "0x10"] {
            assert_eq!(read(&[bad]), None, "{bad:?}");
        }
        assert_eq!(
            read(&["99999999999999999999999"]),
            Some(Duration::from_millis(u64::MAX))
        );
        assert_eq!(
            read(&["900", "bad", "300"]),
            Some(Duration::from_millis(300))
        );
        // The same lines folded into one with commas.
        assert_eq!(read(&["900, bad,300"]), Some(Duration::from_millis(300)));
    }
}
