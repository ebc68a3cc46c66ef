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
use redis::{AsyncConnectionConfig, ConnectionAddr, IntoConnectionInfo};

use crate::store::StoreError;

use super::keys::Layout;
use super::shared::{check_durability, redis_err, Shared, RESPONSE_TIMEOUT};

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
        Self::check_durability(nodes).await?;
        Self::connect_volatile(nodes).await
    }

    /// Connects to the cluster at `nodes` whatever it may lose. A key it
    /// loses is a request that runs again: use it where that is
    /// acceptable, or for tests.
    pub async fn connect_volatile(nodes: &[&str]) -> Result<Self, StoreError> {
        let conn = client(nodes)?
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
    /// The cluster client holds connections to masters only (and skips a
    /// node it has none to), so each node the cluster lists is asked on a
    /// connection of its own, with the first URL's credentials and TLS.
    async fn check_durability(nodes: &[&str]) -> Result<(), StoreError> {
        let first = nodes
            .first()
            .ok_or_else(|| StoreError::msg("no Redis Cluster node given"))?;
        let template = first
            .into_connection_info()
            .map_err(|e| StoreError::with_source("the Redis Cluster's URLs are not valid", e))?;
        let mut conn = client(nodes)?
            .get_async_connection()
            .await
            .map_err(redis_err("connecting to the Redis Cluster"))?;
        let listed: String = redis::cmd("CLUSTER")
            .arg("NODES")
            .query_async(&mut conn)
            .await
            .map_err(redis_err("reading the Redis Cluster's nodes"))?;
        for (host, port) in listed.lines().filter_map(live_node) {
            let mut addr = template.addr().clone();
            match &mut addr {
                ConnectionAddr::Tcp(h, p)
                | ConnectionAddr::TcpTls {
                    host: h, port: p, ..
                } => {
                    *h = host.to_owned();
                    *p = port;
                }
                _ => return Err(StoreError::msg("a Redis Cluster is reached over TCP")),
            }
            let config = AsyncConnectionConfig::new()
                .set_connection_timeout(Some(RESPONSE_TIMEOUT))
                .set_response_timeout(Some(RESPONSE_TIMEOUT));
            let mut node = redis::Client::open(template.clone().set_addr(addr))
                .map_err(|e| StoreError::with_source("a Redis Cluster node's address", e))?
                .get_multiplexed_async_connection_with_config(&config)
                .await
                .map_err(redis_err("connecting to a Redis Cluster node"))?;
            let info: String = redis::cmd("INFO")
                .arg("persistence")
                .arg("memory")
                .query_async(&mut node)
                .await
                .map_err(redis_err("reading a Redis Cluster node's settings"))?;
            check_durability(&info, "RedisClusterStore::connect_volatile")
                .map_err(|e| StoreError::msg(format!("node {host}:{port}: {e}")))?;
        }
        Ok(())
    }
}

/// The address of a node from its line of `CLUSTER NODES`
/// (`<id> <host>:<port>@<bus>[,<hostname>] <flags> …`), unless it is failed
/// or not yet part of the cluster.
fn live_node(line: &str) -> Option<(&str, u16)> {
    let mut fields = line.split_whitespace();
    let addr = fields.nth(1)?;
    let flags = fields.next()?;
    if flags
        .split(',')
        .any(|f| matches!(f, "fail" | "noaddr" | "handshake"))
    {
        return None;
    }
    let (host, port) = addr.split(['@', ',']).next()?.rsplit_once(':')?;
    Some((host, port.parse().ok()?))
}

/// The cluster client of the nodes at `nodes`.
fn client(nodes: &[&str]) -> Result<ClusterClient, StoreError> {
    ClusterClient::builder(nodes.iter().copied())
        .connection_timeout(RESPONSE_TIMEOUT)
        .response_timeout(RESPONSE_TIMEOUT)
        .retries(CLUSTER_RETRIES)
        .min_retry_wait(10)
        .max_retry_wait(CLUSTER_MAX_RETRY_WAIT_MS)
        .build()
        .map_err(|e| StoreError::with_source("the Redis Cluster's URLs are not valid", e))
}

#[cfg(test)]
mod tests {
    use super::live_node;

    #[test]
    fn a_live_node_is_read_from_its_line_and_a_failed_one_skipped() {
        let line = "07c3 127.0.0.1:30004@31004,host-4 slave e7d1 0 1426238317239 4 connected";
        assert_eq!(live_node(line), Some(("127.0.0.1", 30004)));
        let line = "e7d1 127.0.0.1:30001@31001 myself,master - 0 0 1 connected 0-5460";
        assert_eq!(live_node(line), Some(("127.0.0.1", 30001)));
        let line = "6ec2 127.0.0.1:30002@31002 master,fail - 1426238316232 0 2 disconnected";
        assert_eq!(live_node(line), None);
        assert_eq!(live_node("garbage"), None);
    }
}
