//! A route: the part of a partition that a rate limit is kept for, by
//! default a request's path with its identifiers counted as one.
//!
//! A server limits rates per endpoint or per resource far more often than
//! per host (GitHub's search and core quotas, a payment API's per-account
//! limits), so a throttling answer proves something about the path it
//! came from, not about the host's other paths. Pacing is kept per
//! [`Route`] inside the host's [`crate::Partition`] (and for the whole
//! host once several of its routes are throttled together with none
//! succeeding: a limit per account); the outage admission stays per host.

/// Which route of a partition a request is on: by default its path, with
/// every segment that looks like an identifier counted as one, so that
/// `/items/17` and `/items/18` are one route and `/search` another.
///
/// A segment is an identifier when it is all digits, or when it is at
/// least 16 characters long and holds a digit (a UUID, a hash, a
/// `ch_3MqLsH2eZvKYlo2C0Kx8bT4d`-style object id). The query is not part
/// of the route.
///
/// ```
/// use reqwest_safe_retry::Route;
///
/// let url = |s: &str| Route::of_url(&s.parse().unwrap());
/// assert_eq!(url("https://api.example/items/17"), url("https://api.example/items/18?x=1"));
/// assert_ne!(url("https://api.example/items/17"), url("https://api.example/search"));
/// assert_ne!(url("https://api.example/s501"), url("https://api.example/s409"));
/// assert_ne!(Route::of_path("/search"), Route::WHOLE);
/// ```
///
/// The digest is FNV-1a, unkeyed: unlike a host's partition, two routes
/// that collide only share the pacing of one host, whose answers decide
/// both.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, Debug)]
pub struct Route(u64);

/// FNV-1a's offset basis and prime, 64-bit.
const BASIS: u64 = 0xcbf2_9ce4_8422_2325;
const PRIME: u64 = 0x0100_0000_01b3;
/// Bytes that no UTF-8 text holds: a segment's end, an identifier, a
/// named route's start.
const END: u8 = 0xfe;
const IDENTIFIER: u8 = 0xff;
const NAMED: u8 = 0xfd;

fn fnv(mut h: u64, bytes: &[u8]) -> u64 {
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(PRIME);
    }
    h
}

/// Whether a path segment names one object rather than a kind of them.
fn is_identifier(segment: &str) -> bool {
    let digits = segment.bytes().filter(u8::is_ascii_digit).count();
    digits > 0 && (digits == segment.len() || segment.len() >= 16)
}

impl Route {
    /// The whole partition: what a request with no route (the generic
    /// [`crate::retry`]) is on.
    pub const WHOLE: Route = Route(0);

    /// The route of a URL: its path's.
    pub fn of_url(url: &reqwest::Url) -> Self {
        Route::of_path(url.path())
    }

    /// The route of a path: its segments, each identifier counted as one.
    pub fn of_path(path: &str) -> Self {
        let mut h = BASIS;
        for segment in path.split('/') {
            h = if is_identifier(segment) {
                fnv(h, &[IDENTIFIER])
            } else {
                fnv(h, segment.as_bytes())
            };
            h = fnv(h, &[END]);
        }
        Route::from_digest(h)
    }

    /// A route named by the caller.
    pub fn named(name: &str) -> Self {
        Route::from_digest(fnv(fnv(BASIS, &[NAMED]), name.as_bytes()))
    }

    fn from_digest(d: u64) -> Self {
        Route(d.max(1))
    }

    /// The digest, for logs and metrics.
    pub fn id(&self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_are_one_route_and_names_are_not() {
        let p = Route::of_path;
        assert_eq!(p("/items/17"), p("/items/0042"));
        assert_eq!(
            p("/v1/orders/3f2c1e9a-8b7d-4c6e-9f0a-1b2c3d4e5f60/lines"),
            p("/v1/orders/0c4d2b8e-1a3f-4e5d-8c7b-6a5f4e3d2c1b/lines")
        );
        assert_eq!(
            p("/charges/ch_3MqLsH2eZvKYlo2C0Kx8bT4d"),
            p("/charges/ch_1AbCdEfGhIjKlMn0")
        );
        assert_ne!(p("/items/17"), p("/items"));
        assert_ne!(p("/items/17"), p("/orders/17"));
        assert_ne!(p("/v1/search"), p("/v2/search"));
        assert_ne!(p("/s501"), p("/s409"));
        assert_ne!(p("/a/b"), p("/ab"));
        assert_ne!(p("/a/b"), p("/a/b/"));
        assert_ne!(Route::named("/a"), p("/a"));
        assert_ne!(p(""), Route::WHOLE);
    }
}
