//! [`RedisStore`]: the keys in Redis, shared by every replica of a service;
//! [`RedisClusterStore`]: the same on a Redis Cluster.
//!
//! May use: `store`.
//!
//! ```no_run
//! use tower_idempotency::{IdempotencyLayer, RedisStore};
//!
//! # async fn build() -> Result<(), tower_idempotency::StoreError> {
//! // Refuses a Redis that can lose keys (no AOF, or an eviction policy);
//! // `connect_volatile` accepts one, knowing a lost key runs again.
//! let store = RedisStore::connect("redis://127.0.0.1:6379").await?;
//! let layer = IdempotencyLayer::new(store);
//! # let _ = layer; Ok(()) }
//! ```
//!
//! Each store operation is one Lua script (`scripts.rs`), atomic on the
//! server and timed by the server's clock; this file connects to one node
//! and checks what the server may lose, `cluster.rs` connects to a
//! cluster, `keys.rs` names the records (one slot per script on a
//! cluster), `shared.rs` holds what both stores share, and `ops.rs`
//! implements the store trait with the scripts for both.

mod cluster;
mod keys;
mod ops;
mod scripts;
mod shared;

use std::fmt;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use crate::store::StoreError;

pub use cluster::RedisClusterStore;
use keys::Layout;
pub use keys::DEFAULT_REDIS_PREFIX;
use shared::{check_durability, info_field, redis_err, Shared, RESPONSE_TIMEOUT};

/// An [`IdempotencyStore`](crate::IdempotencyStore) in Redis (feature
/// `redis`): replicas of a service share its keys with one round trip per
/// operation. It talks to one node; on a Redis Cluster use
/// [`RedisClusterStore`] (`connect` refuses a cluster's node and says so).
///
/// **What Redis keeps is the guarantee.** A key Redis loses (a restart
/// without persistence, a failover to a replica that had not received it,
/// an eviction under `maxmemory`) is a key the next retry runs again.
/// [`connect`](Self::connect) therefore refuses a server without the
/// append-only file (`appendonly yes`) or with an eviction policy other than
/// `noeviction`; [`connect_volatile`](Self::connect_volatile) accepts one,
/// for caches of idempotency that may rerun. With `appendfsync everysec`
/// (Redis's default once AOF is on) a crash of the server loses up to a
/// second of writes; `appendfsync always` loses none, at a flush per write.
/// Replication is asynchronous: a failover can lose the last writes, as a
/// crash would.
///
/// Times (lock, stale mark, expiry) are the server's (`TIME`), so replicas'
/// clocks do not matter. Redis deletes a completed record at its expiry;
/// one in progress follows the takeover's two steps, expired or not (its
/// owner may only be cut off), and the store's sweep, started by claims
/// every [`sweep_every`](Self::sweep_every), marks an expired one seen
/// stale and deletes it a time to live after the mark if no heartbeat came
/// since.
///
/// **Upgrading.** The records' fields and their meanings are those of
/// every earlier version; from this one on a completed record keeps its
/// last owner's lease fields (no script reads them once it is completed)
/// and Redis keeps it to its own expiry, not a millisecond past. Replicas
/// of either version, side by side in a rolling upgrade, read each other's
/// records: one in progress is completed, extended, released, marked,
/// taken over and swept by either, as if one version had written it.
///
/// **What it costs Redis.** Two script calls a first request: the claim
/// and the completion, one round trip each (and a heartbeat only for a
/// handler that outlives
/// [`heartbeat_every`](crate::IdempotencyLayerBuilder::heartbeat_every)).
/// Redis runs one script at a time, and a script costs it more than a
/// plain command: measured with callgrind, the two take Redis about
/// 178 000 instructions a request, where two plain `SET`s take 22 000 and
/// two scripts that do nothing 52 000
/// (`bench-results/issue47-redis-2026-12-06.txt`).
#[derive(Clone)]
pub struct RedisStore {
    inner: Shared<ConnectionManager>,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("prefix", &self.inner.keys.prefix())
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// Connects to the Redis at `url` (`redis://host:port/db`), refusing a
    /// server that can lose keys: no append-only file, or an eviction
    /// policy other than `noeviction` (see the type's documentation).
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let store = Self::connect_volatile(url).await?;
        store.check_durability().await?;
        Ok(store)
    }

    /// Connects to the Redis at `url` whatever it may lose. A key it loses
    /// is a request that runs again: use it where that is acceptable, or
    /// for tests.
    pub async fn connect_volatile(url: &str) -> Result<Self, StoreError> {
        let client = redis::Client::open(url)
            .map_err(|e| StoreError::with_source("the Redis URL is not valid", e))?;
        let config = ConnectionManagerConfig::new()
            .set_response_timeout(Some(RESPONSE_TIMEOUT))
            .set_connection_timeout(Some(RESPONSE_TIMEOUT))
            .set_number_of_retries(1)
            .set_max_delay(RESPONSE_TIMEOUT);
        let mut conn = ConnectionManager::new_with_config(client, config)
            .await
            .map_err(redis_err("connecting to Redis"))?;
        refuse_a_cluster_node(&mut conn).await?;
        Ok(Self {
            inner: Shared::new(conn, Layout::Node),
        })
    }

    /// How often the store sweeps expired records in progress by itself,
    /// started by a claim (default every 5 minutes; `None`: never, the
    /// application calls
    /// [`IdempotencyStore::sweep_expired`](crate::IdempotencyStore::sweep_expired)
    /// or [`spawn_sweeper`](crate::spawn_sweeper)). Completed records need
    /// no sweep: Redis expires them.
    pub fn sweep_every(mut self, every: Option<Duration>) -> Self {
        self.inner = self.inner.sweep_every(every);
        self
    }

    /// The same store writing its keys under `prefix` (default
    /// [`DEFAULT_REDIS_PREFIX`]): several services, or tests, sharing one
    /// Redis. Letters, digits, `_`, `-` and `.` only.
    pub fn with_prefix(mut self, prefix: &str) -> Result<Self, StoreError> {
        self.inner = self.inner.with_prefix(prefix)?;
        Ok(self)
    }

    /// A connection to the store's Redis (one multiplexed connection,
    /// reconnecting by itself; clones share it), for the application's own
    /// commands and for maintenance.
    pub fn connection(&self) -> ConnectionManager {
        self.inner.conn.clone()
    }

    /// The prefix of this store's keys.
    pub fn prefix(&self) -> &str {
        self.inner.keys.prefix()
    }

    /// The Redis key of `(scope, key)`: the scope's length first, so no
    /// two pairs share one.
    pub fn record_key(&self, scope: &str, key: &str) -> String {
        self.inner.keys.record(scope, key)
    }

    /// Refuses a server that may lose keys.
    async fn check_durability(&self) -> Result<(), StoreError> {
        let mut conn = self.inner.conn.clone();
        let info: String = redis::cmd("INFO")
            .arg("persistence")
            .arg("memory")
            .query_async(&mut conn)
            .await
            .map_err(redis_err("reading the Redis server's settings"))?;
        check_durability(&info, "RedisStore::connect_volatile")
    }
}

/// Refuses a node of a cluster: a script there fails with `CROSSSLOT` or
/// `MOVED`. One `INFO cluster`, at connection.
async fn refuse_a_cluster_node(conn: &mut ConnectionManager) -> Result<(), StoreError> {
    let info: String = redis::cmd("INFO")
        .arg("cluster")
        .query_async(conn)
        .await
        .map_err(redis_err("reading the Redis server's settings"))?;
    if info_field(&info, "cluster_enabled") == Some("1") {
        return Err(StoreError::msg(
            "this Redis is a node of a Redis Cluster (cluster_enabled:1): RedisStore talks to \
             one node; connect with RedisClusterStore::connect instead",
        ));
    }
    Ok(())
}
