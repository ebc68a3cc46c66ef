//! A partition: the key that admission state, hedging and reports are
//! kept under, by default a request's scheme, host and port.
//!
//! A client is shared across every host it calls, but failure is per host:
//! one host's outage must not drain the retries of the healthy ones, and
//! one host's successes must not release another's waiting retries. Each
//! strategy therefore keeps its state per [`Partition`], by default the
//! request's scheme, host and port.

use std::fmt;
use std::hash::{BuildHasher, BuildHasherDefault, Hash, Hasher};
use std::sync::OnceLock;

/// Hashes a key that is already a digest (a partition's) as it is: the
/// maps kept per partition need no second hash.
pub(crate) type DigestState = BuildHasherDefault<DigestHasher>;

/// See [`DigestState`].
#[derive(Default)]
pub(crate) struct DigestHasher(u64);

impl Hasher for DigestHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | u64::from(b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// Which partition of an admission a decision is made for: by default the
/// request's scheme, host and port, or a key of the caller's choosing (a
/// route, a tenant) through [`crate::RequestOptions::partition`].
///
/// A partition is a 64-bit digest of its key, so that finding a host's
/// state allocates nothing: SipHash-1-3 keyed at random per process, so
/// that no host name can be chosen to share another host's partition.
///
/// ```
/// use reqwest_safe_retry::admission::Partition;
///
/// let url = "https://api.example.com/v1/charges".parse().unwrap();
/// let other = "https://api.example.com:443/v1/refunds".parse().unwrap();
/// // The same scheme, host and port: the same partition.
/// assert_eq!(Partition::of_url(&url), Partition::of_url(&other));
/// assert_ne!(Partition::of_url(&url), Partition::named("tenant-42"));
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Partition(u64);

impl Partition {
    /// The one partition of an admission that is not split: what the
    /// generic [`crate::retry::retry`] uses unless told otherwise.
    pub const SINGLE: Partition = Partition(0);

    /// The partition of a URL: its scheme, host and port (the known
    /// default port when the URL names none). A host written in its
    /// absolute form, with a trailing dot (`api.example.com.`), is the
    /// same host as without it.
    pub fn of_url(url: &reqwest::Url) -> Self {
        // The digest's input is scheme, 0xff, host, 0xff, then the port
        // plus one (0 for none) in four bytes: no scheme or host holds
        // 0xff (a URL is ASCII), so no two authorities share an input, and
        // none starts with 0xff as a named partition's does. Written at
        // once where it fits: SipHash pays for every `write`.
        let scheme = url.scheme().as_bytes();
        let host = url.host_str().unwrap_or_default().as_bytes();
        // `api.example.com.` is the absolute form of `api.example.com`:
        // the same host, so the same partition (a slice, no allocation).
        let host = host.strip_suffix(b".").unwrap_or(host);
        let port = url
            .port_or_known_default()
            .map_or(0, |p| u32::from(p) + 1)
            .to_le_bytes();
        let mut input = [0u8; 128];
        let len = scheme.len() + host.len() + 2 + port.len();
        if let Some(buf) = input.get_mut(..len) {
            let (s, rest) = buf.split_at_mut(scheme.len());
            s.copy_from_slice(scheme);
            let (sep, rest) = rest.split_at_mut(1);
            sep[0] = 0xff;
            let (hst, rest) = rest.split_at_mut(host.len());
            hst.copy_from_slice(host);
            rest[0] = 0xff;
            rest[1..].copy_from_slice(&port);
            let mut h = keyed_hasher();
            h.write(buf);
            Partition::from_digest(h.finish())
        } else {
            // The same input in pieces: SipHash streams, so the digest is
            // the one a single `write` of it would give.
            Partition::from_digest(in_pieces(scheme, host, port))
        }
    }

    /// A partition named by the caller: a route, a tenant, a pool.
    pub fn named(name: &str) -> Self {
        let mut h = keyed_hasher();
        0xff_u8.hash(&mut h); // a URL's digest starts with its scheme instead
        name.len().hash(&mut h);
        name.hash(&mut h);
        Partition::from_digest(h.finish())
    }

    /// The digest, never that of [`Partition::SINGLE`].
    fn from_digest(d: u64) -> Self {
        Partition(d.max(1))
    }

    /// The digest, for logs and metrics.
    pub fn id(&self) -> u64 {
        self.0
    }
}

impl fmt::Debug for Partition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Partition({:016x})", self.0)
    }
}

/// SipHash-1-3 (std's `RandomState`) keyed once per process. A keyed hash
/// that resists chosen collisions, not a fast multiply-rotate one: the
/// authority is often chosen by someone else (a webhook URL, a link to
/// preview), and a multiply-rotate digest let a chosen host name land in
/// another host's partition in every process, so a dead host of an
/// attacker's drained a healthy host's retries. Each field is written with
/// its length or a terminator (`str`'s `Hash`), so no two keys run into
/// each other. About 400 instructions a request more than the fast digest.
fn keyed_hasher() -> std::collections::hash_map::DefaultHasher {
    static KEYS: OnceLock<std::collections::hash_map::RandomState> = OnceLock::new();
    KEYS.get_or_init(std::collections::hash_map::RandomState::new)
        .build_hasher()
}

/// A URL partition's digest, its input written field by field.
fn in_pieces(scheme: &[u8], host: &[u8], port: [u8; 4]) -> u64 {
    let mut h = keyed_hasher();
    h.write(scheme);
    h.write_u8(0xff);
    h.write(host);
    h.write_u8(0xff);
    h.write(&port);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Host names crafted against the earlier multiply-rotate digest (the
    /// 8th byte's bit 6 flipped, the 9th byte XORed to cancel it) shared
    /// `api.example.com`'s partition in every process; with a keyed
    /// SipHash they do not, nor does a name with a trailing NUL share its
    /// prefix's.
    #[test]
    fn chosen_names_do_not_share_a_partition() {
        let url = |s: &str| Partition::of_url(&s.parse().unwrap());
        let victim = url("https://api.example.com/");
        for crafted in ["https://api.exa-xle.com/", "https://api.exa-hle.com/"] {
            assert_ne!(url(crafted), victim, "{crafted}");
        }
        assert_ne!(Partition::named("tenant"), Partition::named("tenant\0"));
        // The port is part of the input, whichever way the host is written.
        let long = format!("https://{}.example.com", "a".repeat(200));
        assert_ne!(url(&format!("{long}:8443/")), url(&format!("{long}/")));
        assert_ne!(url("https://a.example:8443/"), url("https://a.example/"));
        assert_ne!(Partition::named(""), Partition::named("\0"));
    }

    /// A host short enough for one `write` gets the digest the field by
    /// field input gives, so the two ways never split one host in two.
    #[test]
    fn one_write_and_the_pieces_give_one_digest() {
        for (url, scheme, host, port) in [
            (
                "https://api.example.com/v1",
                "https",
                "api.example.com",
                443_u16,
            ),
            ("http://127.0.0.1:8080/", "http", "127.0.0.1", 8080),
            ("http://[::1]:9/", "http", "[::1]", 9),
        ] {
            let port = (u32::from(port) + 1).to_le_bytes();
            let pieces =
                Partition::from_digest(in_pieces(scheme.as_bytes(), host.as_bytes(), port));
            assert_eq!(Partition::of_url(&url.parse().unwrap()), pieces, "{url}");
        }
    }

    /// `api.example.com.` is the absolute form of `api.example.com`
    /// (RFC 1034 §3.1): one host, one partition, whatever its length.
    #[test]
    fn a_trailing_dot_names_the_same_host() {
        let p = |s: &str| Partition::of_url(&s.parse().unwrap());
        assert_eq!(
            p("https://api.example.com./v1"),
            p("https://api.example.com/v1")
        );
        assert_eq!(p("http://a.example.:8080/"), p("http://a.example:8080/"));
        let long = format!("https://{}.example.com", "a".repeat(200));
        assert_eq!(p(&format!("{long}./")), p(&format!("{long}/")));
        // Only the one dot of the absolute form: the port still counts.
        assert_ne!(p("https://a.example.:8443/"), p("https://a.example./"));
    }

    #[test]
    fn urls_partition_by_scheme_host_and_port() {
        let p = |s: &str| Partition::of_url(&s.parse().unwrap());
        assert_eq!(p("http://a.example/x"), p("http://a.example:80/y?q"));
        assert_ne!(p("http://a.example/"), p("https://a.example/"));
        assert_ne!(p("http://a.example/"), p("http://a.example:8080/"));
        assert_ne!(p("http://a.example/"), p("http://b.example/"));
        assert_ne!(p("http://a.example/"), Partition::SINGLE);
    }
}
