//! Partitions: admission state kept per host (or per any other key), in a
//! bounded map whose idle entries are the first to go.
//!
//! The map is sharded (one lock per shard, so hosts rarely contend) and
//! bounded: a shard that is full drops the partitions idle for longer than
//! the idle expiry, and failing that its least recently used one. A
//! dropped partition starts again fresh, as a new host does.

use std::collections::HashMap;
use std::fmt;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::vocabulary::{lock, DigestState, Partition};

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

type Shard<S> = HashMap<Partition, Slot<S>, DigestState>;

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
        &self.shards[(p.id() >> (64 - SHARD_BITS)) as usize]
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
    use super::*;

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
}
