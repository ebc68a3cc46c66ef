//! The names of a Redis store's keys, on one node and on a cluster.
//!
//! ```text
//! one node:  idempotency:r:<len>:<scope><key>      idempotency:epoch
//!            idempotency:in_progress
//! cluster:   idempotency:{b17}:r:<len>:<scope><key>
//!            idempotency:{b17}:epoch               idempotency:{b17}:in_progress
//! ```
//!
//! Why buckets: a script may only touch keys of one hash slot on a
//! cluster (`CROSSSLOT` otherwise), and the claim touches the record, the
//! epoch high-water mark and the index of records in progress. One hash
//! tag for the whole store would put it in one slot, on one master: no
//! spread at all. So the store-wide structures are split into
//! [`BUCKETS`] buckets, each its own hash tag (`{b17}`), and a record
//! lives in the bucket its scope and key hash to, beside its bucket's
//! epoch mark and index: every script touches one slot, and the store
//! spreads over up to [`BUCKETS`] slots. A key's bucket never changes, so
//! its epochs come from one mark and only go up; the sweep walks every
//! bucket. The number of buckets and the hash are part of the stored
//! format: changing either would lose every record in progress.
//!
//! The single-node layout is the one every earlier version wrote; it is
//! kept, so an upgrade reads the records already there.

use std::sync::Arc;

use crate::store::StoreError;

/// The prefix of every key the store writes, unless
/// [`RedisStore::with_prefix`](super::RedisStore::with_prefix) sets another.
pub const DEFAULT_REDIS_PREFIX: &str = "idempotency";

/// How many buckets a cluster store's keys are spread over (see the
/// module's documentation; part of the stored format).
pub(super) const BUCKETS: u16 = 64;

/// Where the store's keys live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Layout {
    /// One node: the layout of every earlier version.
    Node,
    /// A cluster: hash-tagged buckets.
    Cluster,
}

/// The names of one store's keys.
#[derive(Debug, Clone)]
pub(super) struct Keys {
    prefix: Arc<str>,
    layout: Layout,
}

impl Keys {
    pub(super) fn new(prefix: &str, layout: Layout) -> Self {
        Self {
            prefix: Arc::from(prefix),
            layout,
        }
    }

    /// The same layout under `prefix`, or an error if it is not a plain
    /// name (it must hold no `{`, or it would change the hash tag).
    pub(super) fn with_prefix(&self, prefix: &str) -> Result<Self, StoreError> {
        let valid = !prefix.is_empty()
            && prefix.len() <= 64
            && prefix
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
        if !valid {
            return Err(StoreError::msg(format!(
                "invalid Redis key prefix {prefix:?}: 1 to 64 letters, digits, '_', '-' or '.'"
            )));
        }
        Ok(Self::new(prefix, self.layout))
    }

    pub(super) fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The bucket of `(scope, key)`: FNV-1a over the scope's length, the
    /// scope and the key (a fixed hash: every process and version finds a
    /// key in the same bucket); 0 on one node.
    pub(super) fn bucket(&self, scope: &str, key: &str) -> u16 {
        if self.layout == Layout::Node {
            return 0;
        }
        let mut hash: u32 = 0x811c_9dc5;
        let len = scope.len().to_string();
        for b in len
            .bytes()
            .chain([b':'])
            .chain(scope.bytes())
            .chain(key.bytes())
        {
            hash = (hash ^ u32::from(b)).wrapping_mul(0x0100_0193);
        }
        // The remainder of a division by a u16 fits a u16.
        u16::try_from(hash % u32::from(BUCKETS)).unwrap_or(0)
    }

    /// Every bucket the sweep walks: one on a node.
    pub(super) fn buckets(&self) -> std::ops::Range<u16> {
        match self.layout {
            Layout::Node => 0..1,
            Layout::Cluster => 0..BUCKETS,
        }
    }

    /// The start of every key of `bucket`: the prefix, and on a cluster
    /// the bucket's hash tag.
    fn base(&self, bucket: u16) -> String {
        match self.layout {
            Layout::Node => self.prefix.to_string(),
            Layout::Cluster => format!("{}:{{b{bucket:02}}}", self.prefix),
        }
    }

    /// The record of `(scope, key)`: the scope's length first, so no two
    /// pairs share one.
    pub(super) fn record(&self, scope: &str, key: &str) -> String {
        let base = self.base(self.bucket(scope, key));
        format!("{base}:r:{}:{scope}{key}", scope.len())
    }

    /// The epoch high-water mark of `bucket`.
    pub(super) fn epoch(&self, bucket: u16) -> String {
        format!("{}:epoch", self.base(bucket))
    }

    /// The index of records in progress of `bucket`.
    pub(super) fn index(&self, bucket: u16) -> String {
        format!("{}:in_progress", self.base(bucket))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_node_keeps_the_layout_of_earlier_versions() {
        let keys = Keys::new("idem", Layout::Node);
        assert_eq!(keys.record("ab", "k"), "idem:r:2:abk");
        assert_eq!(keys.epoch(keys.bucket("ab", "k")), "idem:epoch");
        assert_eq!(keys.index(0), "idem:in_progress");
        assert_eq!(keys.buckets(), 0..1);
    }

    /// The record, its epoch mark and its index share the record's hash
    /// tag (one slot), and keys spread over many buckets.
    #[test]
    fn a_cluster_record_shares_its_buckets_tag_and_keys_spread() {
        let keys = Keys::new("idem", Layout::Cluster);
        let b = keys.bucket("scope", "key-1");
        let tag = format!("{{b{b:02}}}");
        for name in [keys.record("scope", "key-1"), keys.epoch(b), keys.index(b)] {
            assert!(name.starts_with(&format!("idem:{tag}:")), "{name}");
        }
        let used: std::collections::BTreeSet<u16> = (0..1000)
            .map(|i| keys.bucket("scope", &format!("key-{i}")))
            .collect();
        assert_eq!(used.len(), usize::from(BUCKETS));
        // Fixed (FNV-1a of "1:sk" is 8 mod 64): the stored format depends on it.
        assert_eq!(keys.record("s", "k"), "idem:{b08}:r:1:sk");
    }
}
