//! [`RedisClusterStore`]: the Redis store on a Redis Cluster.
//!
//! ```no_run
//! use tower_idempotency::{IdempotencyLayer, RedisClusterStore};
//!
//! # async fn build() -> Result<(), tower_idempotency::StoreError> {
//! // Any of the cluster's nodes: the client learns the others from them.
//! let store = RedisClusterStore::connect(&[
//!     "redis://10.0.0.1:6379",
//!     "redis://10.0.0.2:6379",
//! ])
//! .await?;
//! let layer = IdempotencyLayer::new(store);
//! # let _ = layer; Ok(()) }
//! ```
//!
//! The same scripts as on one node, on keys laid out so that each script
//! touches one slot while the store spreads over many (`keys.rs`); the
//! `redis` crate's cluster client routes each script to its slot's master
//! and follows `MOVED` and `ASK` while slots move or a replica takes over.

use std::fmt;
use std::time::Duration;

use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{MultipleNodeRoutingInfo, ResponsePolicy, RoutingInfo};
use redis::Value;

use crate::store::StoreError;

use super::keys::Layout;
use super::{check_durability, redis_err, Shared, RESPONSE_TIMEOUT};

/// How often one store call is sent again after a redirection (`MOVED`,
/// `ASK`), `TRYAGAIN` during a slot's migration, or a node that stopped
/// answering (a failover), and the longest wait between two: a call
/// rides through a reshard, and fails (transient: the layer answers 503 or
/// tries again) rather than hang while a failover lasts.
const CLUSTER_RETRIES: u32 = 6;
const CLUSTER_MAX_RETRY_WAIT_MS: u64 = 400;

/// An [`IdempotencyStore`](crate::IdempotencyStore) on a Redis Cluster
/// (feature `redis`): what [`RedisStore`](super::RedisStore) guarantees on
/// one node (claim, lease and heartbeat, fencing epoch, takeover, sweep,
/// the durability check), with the store spread over the cluster's
/// masters.
///
/// **Layout.** A script may touch one hash slot only, so the store-wide
/// structures of the single-node store (the epoch high-water mark, the
/// index of records in progress) are split into 64 buckets, each with its
/// own hash tag (`idempotency:{b17}:…`); a record lives in the bucket its
/// scope and key hash to. Each script touches its record's bucket, the
/// sweep walks the 64 buckets. A key's epochs come from its bucket's mark,
/// so they only go up, as on one node.
///
/// **Reshards and failovers.** The cluster client follows `MOVED` and
/// `ASK` (and waits out `TRYAGAIN` while a slot's keys move), and after a
/// master fails it finds the replica promoted in its place. A call made
/// while no master serves the key's slot fails as transient, and the
/// layer answers it as it answers a store that is down for seconds.
///
/// **What a failover can lose.** A cluster replicates asynchronously: a
/// master acknowledges a claim or a completion before its replica has
/// it. If the master dies in that window (usually under a millisecond),
/// the promoted replica misses the write: a lost claim means a retry runs
/// the handler again; a lost completion leaves the record in progress with
/// an owner that has already answered, and a retry takes it over after
/// the takeover's two steps and runs again. `WAIT 1 <timeout>` after each
/// write would close the window for one failure at the cost of a round
/// trip to a replica per write (two per first request), and would still
/// not make a write durable if no replica acknowledges; this store does
/// not send it. The guide (`Stores`) lists the deployments and their
/// tests.
#[derive(Clone)]
pub struct RedisClusterStore {
    pub(super) inner: Shared<ClusterConnection>,
}

impl fmt::Debug for RedisClusterStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisClusterStore")
            .field("prefix", &self.inner.keys.prefix())
            .finish_non_exhaustive()
    }
}

impl RedisClusterStore {
    /// Connects to the cluster one or more of whose nodes are at `nodes`
    /// (`redis://host:port`), refusing it if a node, master or replica,
    /// can lose keys: no append-only file, or an eviction policy other than
    /// `noeviction` (a replica is checked too: a failover makes it the
    /// master).
    pub async fn connect(nodes: &[&str]) -> Result<Self, StoreError> {
        let store = Self::connect_volatile(nodes).await?;
        store.check_durability().await?;
        Ok(store)
    }

    /// Connects to the cluster at `nodes` whatever it may lose. A key it
    /// loses is a request that runs again: use it where that is
    /// acceptable, or for tests.
    pub async fn connect_volatile(nodes: &[&str]) -> Result<Self, StoreError> {
        let client = ClusterClient::builder(nodes.iter().copied())
            .connection_timeout(RESPONSE_TIMEOUT)
            .response_timeout(RESPONSE_TIMEOUT)
            .retries(CLUSTER_RETRIES)
            .min_retry_wait(10)
            .max_retry_wait(CLUSTER_MAX_RETRY_WAIT_MS)
            .build()
            .map_err(|e| StoreError::with_source("the Redis Cluster's URLs are not valid", e))?;
        let conn = client
            .get_async_connection()
            .await
            .map_err(redis_err("connecting to the Redis Cluster"))?;
        Ok(Self {
            inner: Shared::new(conn, Layout::Cluster),
        })
    }

    /// How often the store sweeps expired records in progress by itself,
    /// started by a claim (as [`RedisStore::sweep_every`](super::RedisStore::sweep_every)).
    pub fn sweep_every(mut self, every: Option<Duration>) -> Self {
        self.inner = self.inner.sweep_every(every);
        self
    }

    /// The same store writing its keys under `prefix` (as
    /// [`RedisStore::with_prefix`](super::RedisStore::with_prefix)).
    pub fn with_prefix(mut self, prefix: &str) -> Result<Self, StoreError> {
        self.inner = self.inner.with_prefix(prefix)?;
        Ok(self)
    }

    /// A connection to the store's cluster (routing each command to its
    /// key's slot; clones share it), for the application's own commands
    /// and for maintenance.
    pub fn connection(&self) -> ClusterConnection {
        self.inner.conn.clone()
    }

    /// The prefix of this store's keys.
    pub fn prefix(&self) -> &str {
        self.inner.keys.prefix()
    }

    /// The Redis key of `(scope, key)`: its bucket's hash tag, then the
    /// scope's length, so no two pairs share one.
    pub fn record_key(&self, scope: &str, key: &str) -> String {
        self.inner.keys.record(scope, key)
    }

    /// Refuses the cluster if any node, master or replica, may lose keys.
    async fn check_durability(&self) -> Result<(), StoreError> {
        let mut conn = self.inner.conn.clone();
        let mut info = redis::cmd("INFO");
        info.arg("persistence").arg("memory");
        let routing = RoutingInfo::MultiNode((
            MultipleNodeRoutingInfo::AllNodes,
            Some(ResponsePolicy::Special),
        ));
        let answers = conn
            .route_command(info, routing)
            .await
            .map_err(redis_err("reading the Redis Cluster's settings"))?;
        let Value::Map(by_node) = answers else {
            return Err(StoreError::msg(
                "the Redis Cluster answered a malformed INFO",
            ));
        };
        for (node, answer) in by_node {
            let text = match (&node, &answer) {
                (Value::BulkString(n), Value::BulkString(a)) => (
                    String::from_utf8_lossy(n).into_owned(),
                    String::from_utf8_lossy(a).into_owned(),
                ),
                (Value::BulkString(n), Value::VerbatimString { text, .. }) => {
                    (String::from_utf8_lossy(n).into_owned(), text.clone())
                }
                _ => {
                    return Err(StoreError::msg(
                        "the Redis Cluster answered a malformed INFO",
                    ))
                }
            };
            check_durability(&text.1, "RedisClusterStore::connect_volatile")
                .map_err(|e| StoreError::msg(format!("node {}: {e}", text.0)))?;
        }
        Ok(())
    }
}
