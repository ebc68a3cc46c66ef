//! Partitions: admission state kept per host (or per any other key), in a
//! bounded map whose idle entries are the first to go.
//!
//! A client is shared across every host it calls, but failure is per host:
//! one host's outage must not drain the retries of the healthy ones, and
//! one host's successes must not release another's waiting retries. Each
//! strategy therefore keeps its state per [`Partition`], by default the
//! request's scheme, host and port.
//!
//! The map is sharded (one lock per shard, so hosts rarely contend) and
//! bounded: a shard that is full drops the partitions idle for longer than
//! the idle expiry, and failing that its least recently used one. A
//! dropped partition starts again fresh, as a new host does.

use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasher, BuildHasherDefault, Hash, Hasher};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::runtime::lock;

/// Which partition of an admission a decision is made for: by default the
/// request's scheme, host and port, or a key of the caller's choosing (a
/// route, a tenant) through [`crate::RequestOptions::partition`].
///
/// A partition is a 64-bit digest of its key, so that finding a host's
/// state allocates nothing: SipHash-1-3 keyed at random per process, so
/// that no host name can be chosen to share another host's partition.
///
/// ```
/// use reqwest_safe_retry::Partition;
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
    /// generic [`crate::retry`] uses unless told otherwise.
    pub const SINGLE: Partition = Partition(0);

    /// The partition of a URL: its scheme, host and port (the known
    /// default port when the URL names none).
    pub fn of_url(url: &reqwest::Url) -> Self {
        // The digest's input is scheme, 0xff, host, 0xff, then the port
        // plus one (0 for none) in four bytes: no scheme or host holds
        // 0xff (a URL is ASCII), so no two authorities share an input, and
        // none starts with 0xff as a named partition's does. Written at
        // once where it fits: SipHash pays for every `write`.
        let scheme = url.scheme().as_bytes();
        let host = url.host_str().unwrap_or_default().as_bytes();
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

/// A partition is already a digest: hash it as it is.
#[derive(Default)]
struct Identity(u64);

impl Hasher for Identity {
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

/// Shards of the map: a power of two.
const SHARD_BITS: u32 = 4;
const SHARDS: usize = 1 << SHARD_BITS;

/// The bounds of a [`Partitions`] map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Bounds {
    /// The most partitions kept (rounded down to a multiple of the 16
    /// shards, and at least 16).
    pub(crate) max: usize,
    /// A partition unused for this long is dropped first when room is
    /// needed.
    pub(crate) idle: Duration,
}

/// A bounded, sharded map from partitions to their state.
pub(crate) struct Partitions<S> {
    shards: Box<[Mutex<Shard<S>>]>,
    per_shard: usize,
    idle: Duration,
}

type Shard<S> = HashMap<Partition, Slot<S>, BuildHasherDefault<Identity>>;

struct Slot<S> {
    state: S,
    used: Instant,
}

impl<S> Partitions<S> {
    pub(crate) fn new(bounds: Bounds) -> Self {
        Partitions {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            per_shard: (bounds.max / SHARDS).max(1),
            idle: bounds.idle,
        }
    }

    /// The most partitions the map keeps.
    pub(crate) fn capacity(&self) -> usize {
        self.per_shard * SHARDS
    }

    /// Partitions kept now.
    pub(crate) fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(s).len()).sum()
    }

    /// The shard of a partition: the digest's top bits (the map inside
    /// the shard indexes by its low bits).
    fn shard(&self, p: Partition) -> &Mutex<Shard<S>> {
        // Top four bits: below 16 by construction.
        #[allow(clippy::cast_possible_truncation)]
        &self.shards[(p.0 >> (64 - SHARD_BITS)) as usize]
    }

    /// Runs `f` on the partition's state, made by `fresh` if it has none,
    /// with the shard locked.
    pub(crate) fn with<R>(
        &self,
        p: Partition,
        now: Instant,
        fresh: impl FnOnce() -> S,
        f: impl FnOnce(&mut S) -> R,
    ) -> R {
        let mut map = lock(self.shard(p));
        // The usual case, a known partition: one lookup.
        if let Some(slot) = map.get_mut(&p) {
            // Out-of-order clocks never move `used` back.
            slot.used = slot.used.max(now);
            return f(&mut slot.state);
        }
        if map.len() >= self.per_shard {
            self.make_room(&mut map, now);
        }
        let slot = map.entry(p).or_insert_with(|| Slot {
            state: fresh(),
            used: now,
        });
        f(&mut slot.state)
    }

    /// Runs `f` on the partition's state if it has one; nothing is made.
    pub(crate) fn peek<R>(&self, p: Partition, f: impl FnOnce(&S) -> R) -> Option<R> {
        lock(self.shard(p)).get(&p).map(|slot| f(&slot.state))
    }

    /// Drops the partitions idle past the expiry, or else the least
    /// recently used one.
    fn make_room(&self, map: &mut Shard<S>, now: Instant) {
        let before = map.len();
        map.retain(|_, slot| now.saturating_duration_since(slot.used) < self.idle);
        if map.len() < before {
            return;
        }
        if let Some(oldest) = map.iter().min_by_key(|(_, s)| s.used).map(|(p, _)| *p) {
            map.remove(&oldest);
        }
    }
}

impl<S> fmt::Debug for Partitions<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Partitions")
            .field("len", &self.len())
            .field("capacity", &self.capacity())
            .field("idle", &self.idle)
            .finish()
    }
}

#[cfg(test)]
mod tests {

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
    use super::*;

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

    #[test]
    fn the_map_never_holds_more_than_its_capacity_and_drops_idle_ones_first() {
        let map: Partitions<u32> = Partitions::new(Bounds {
            max: 64,
            idle: Duration::from_secs(60),
        });
        let t0 = Instant::now();
        let hot = Partition::named("hot");
        for i in 0..100_000u32 {
            let now = t0 + Duration::from_millis(u64::from(i));
            // The hot partition is used all along and keeps its state.
            map.with(hot, now, || 0, |n| *n += 1);
            map.with(Partition::named(&i.to_string()), now, || 0, |_| ());
            assert!(map.len() <= map.capacity());
        }
        assert_eq!(map.capacity(), 64);
        assert_eq!(map.peek(hot, |n| *n), Some(100_000));
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
