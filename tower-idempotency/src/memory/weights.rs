//! Which caller holds the most: the scopes of a
//! [`MemoryStore`](super::MemoryStore) ordered by the number of records
//! each holds, so that a full store finds the heaviest in O(log n) and
//! takes room from it, never from a caller within its fair share.
//!
//! Kept beside the scopes' table (`map.rs`), which tells it each change
//! of a scope's count (one removal and one insertion in a B-tree per new
//! or removed record) once the store has been full since its last sweep;
//! until then it is not kept, and a store that never fills pays nothing
//! for it.

use std::collections::BTreeSet;
use std::ops::Bound;
use std::sync::Arc;

/// A scope's place in [`Weights`]: its count, its keyed hash, and the
/// address of its shared name (two scopes whose hashes collide still
/// differ by it, for as long as both hold records).
pub(super) type Weight = (usize, u64, usize);

/// The address that identifies a scope's shared name in [`Weights`].
pub(super) fn id_of(scope: &Arc<str>) -> usize {
    Arc::as_ptr(scope).cast::<u8>() as usize
}

/// The scopes holding records, ordered by how many they hold.
#[derive(Debug, Default)]
pub(super) struct Weights(BTreeSet<Weight>);

impl Weights {
    /// Notes that the scope whose keyed hash is `hash` and whose name is
    /// at `id` went from holding `from` records to holding `to`.
    pub(super) fn moved(&mut self, hash: u64, id: usize, from: usize, to: usize) {
        if from == to {
            return;
        }
        if from > 0 {
            self.0.remove(&(from, hash, id));
        }
        if to > 0 {
            self.0.insert((to, hash, id));
        }
    }

    /// The heaviest scope holding more than `above` records, lighter than
    /// `below` (`None`: the heaviest of all).
    pub(super) fn heaviest(&self, above: usize, below: Option<Weight>) -> Option<Weight> {
        let from = Bound::Included((above.saturating_add(1), 0, 0));
        let to = below.map_or(Bound::Unbounded, Bound::Excluded);
        self.0.range((from, to)).next_back().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_heaviest_is_found_and_follows_each_move() {
        let mut weights = Weights::default();
        weights.moved(1, 10, 0, 3);
        weights.moved(2, 20, 0, 5);
        weights.moved(3, 30, 0, 1);
        assert_eq!(weights.heaviest(0, None), Some((5, 2, 20)));
        assert_eq!(weights.heaviest(0, Some((5, 2, 20))), Some((3, 1, 10)));
        assert_eq!(weights.heaviest(3, None), Some((5, 2, 20)));
        assert_eq!(weights.heaviest(5, None), None);
        weights.moved(2, 20, 5, 2);
        assert_eq!(weights.heaviest(0, None), Some((3, 1, 10)));
        weights.moved(1, 10, 3, 0);
        assert_eq!(weights.heaviest(0, None), Some((2, 2, 20)));
    }
}
