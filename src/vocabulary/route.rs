//! A route: the part of a partition that a rate limit is kept for, by
//! default a request's path with its identifiers counted as one.
//!
//! A server limits rates per endpoint or per resource far more often than
//! per host (GitHub's search and core quotas, a payment API's per-account
//! limits), so a throttling answer proves something about the path it
//! came from, not about the host's other paths. Pacing is kept per
//! [`Route`] inside the host's [`crate::admission::Partition`] (and for the routes of
//! one caller that several of its routes' throttling answers, together
//! and none succeeding, show to share a limit: a limit per account); the
//! outage admission stays per host.
//!
//! A limit belongs to whoever met it: a request that carries credentials
//! (`Authorization`) is on its route *for that caller*
//! ([`Route::for_caller`]), so one token's spent quota holds no call of
//! another token's, as keys are scoped by the credential's digest on the
//! server.

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
/// use reqwest_safe_retry::admission::Route;
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
/// both. A caller's credential enters it through a keyed digest
/// ([`Route::for_caller`]): no route's id says anything about a token.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, Debug)]
pub struct Route {
    digest: u64,
    /// The caller's: a keyed digest of its credential, 0 with none.
    caller: u64,
}

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
    /// [`crate::retry::retry`]) is on.
    pub const WHOLE: Route = Route {
        digest: 0,
        caller: 0,
    };

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
        Route {
            digest: d.max(1),
            caller: 0,
        }
    }

    /// This route for the caller whose credential (an `Authorization`
    /// value, as sent) is `credential`: a limit met by one caller is
    /// that caller's, and another caller on the same path is on another
    /// route. The digest is keyed per process (SipHash, as the standard
    /// library's maps use), so no id logged says anything about the
    /// token; an empty credential is no caller.
    pub fn for_caller(self, credential: &[u8]) -> Self {
        if credential.is_empty() {
            return self;
        }
        let caller = caller_digest(credential).max(1);
        Route {
            digest: fnv(self.digest, &caller.to_le_bytes()).max(1),
            caller,
        }
    }

    /// Whose limits this route's are: a digest of the caller's
    /// credential ([`Route::for_caller`]), `None` for a request that
    /// carried none.
    pub fn caller(&self) -> Option<u64> {
        (self.caller != 0).then_some(self.caller)
    }

    /// The digest, for logs and metrics.
    pub fn id(&self) -> u64 {
        self.digest
    }
}

/// A keyed digest of a credential, the key drawn once per process.
fn caller_digest(credential: &[u8]) -> u64 {
    use std::hash::BuildHasher;
    static KEYS: std::sync::OnceLock<std::collections::hash_map::RandomState> =
        std::sync::OnceLock::new();
    KEYS.get_or_init(Default::default).hash_one(credential)
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

    /// One path, two callers: two routes; one caller: one route, whose
    /// digest keeps the path's distinctions.
    #[test]
    fn a_route_is_its_callers() {
        let p = Route::of_path;
        let (a, b) = (b"Bearer tenant-a".as_slice(), b"Bearer tenant-b".as_slice());
        assert_ne!(p("/items").for_caller(a), p("/items").for_caller(b));
        assert_ne!(p("/items").for_caller(a), p("/items"));
        assert_eq!(p("/items/1").for_caller(a), p("/items/2").for_caller(a));
        assert_ne!(p("/items").for_caller(a), p("/search").for_caller(a));
        assert_eq!(
            p("/items").for_caller(a).caller(),
            p("/search").for_caller(a).caller()
        );
        assert_ne!(
            p("/items").for_caller(a).caller(),
            p("/items").for_caller(b).caller()
        );
        assert_eq!(p("/items").caller(), None);
        assert_eq!(p("/items").for_caller(b""), p("/items"));
    }
}
