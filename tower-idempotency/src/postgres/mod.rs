//! [`PostgresStore`]: a store shared by every server instance, in PostgreSQL.
//!
//! The schema lives in the crate's `migrations/` folder and is applied by
//! [`PostgresStore::migrate`]. Every timestamp (claim, lease, expiry, sweep)
//! is computed by the database with `now()`, never from a replica's clock, so
//! a replica whose clock runs ahead cannot take over a live claim.
//!
//! This file holds the store, its pools and its settings. Below it, files
//! that import nothing above them: `sql.rs` (the statements and the
//! migrations) and `error.rs` (what a failure means). Above it, each an
//! `impl PostgresStore` of its own: `lease.rs` (keeping leases alive),
//! `maintenance.rs` (migrating, sweeping), `claim.rs` (one key's row, on a
//! given connection, which the transactional mode uses too) and `ops.rs`
//! (the store trait). They use the store's types and the request context,
//! nothing of the layer.

mod claim;
mod error;
mod lease;
mod maintenance;
mod ops;
mod sql;

use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::{PgPool, PgPoolOptions};

use crate::store::{StoreError, SweepSchedule};

pub(crate) use self::error::db_err;
pub use self::sql::MIGRATION_SQL;
use self::sql::{Queries, DEFAULT_TABLE};

/// Connections in the pool that [`PostgresStore::connect`] opens: enough
/// for 30 requests in flight at once, each holding a connection (the whole
/// request long, in the transactional mode), while three replicas, each
/// with its lease pool of 2, still fit in the 97 connections PostgreSQL's
/// default `max_connections` of 100 leaves to ordinary roles (3 × 32 = 96).
/// (sqlx's default of 10 left 32 concurrent requests queueing for
/// connections.)
pub const DEFAULT_POOL_SIZE: u32 = 30;

/// An idempotency store backed by a PostgreSQL table (default
/// `idempotency_keys`), shared by every instance of a service.
///
/// Claims are atomic single statements (`INSERT ... ON CONFLICT DO UPDATE ...
/// WHERE <expired or lock timed out> RETURNING`), so exactly one of many
/// concurrent requests wins a key, across processes.
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use tower_idempotency::{IdempotencyLayer, PostgresStore};
/// let store = PostgresStore::connect("postgres://postgres@127.0.0.1:5432/test").await?;
/// store.migrate().await?;
/// let layer = IdempotencyLayer::new(store);
/// # let _ = layer; Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct PostgresStore {
    pool: PgPool,
    queries: Arc<Queries>,
    /// The lease pool and the sweeping schedule, shared by clones.
    shared: Arc<Shared>,
}

/// Default interval of the sweeps a store starts by itself.
const DEFAULT_SWEEP_EVERY: Duration = Duration::from_secs(300);

#[derive(Debug)]
struct Shared {
    /// A small pool of its own for lease extensions, opened on first use
    /// with the main pool's options and hooks.
    lease_pool: std::sync::OnceLock<LeasePool>,
    /// When the next sweep is due.
    sweep: SweepSchedule,
}

/// The lease pool, with the main pool's connect options it was made with
/// (a newer set, from `Pool::set_connect_options`, is passed on).
#[derive(Debug)]
struct LeasePool {
    pool: PgPool,
    options: std::sync::Mutex<Arc<sqlx::postgres::PgConnectOptions>>,
}

impl Shared {
    fn new(sweep_every: Option<Duration>) -> Self {
        Self {
            lease_pool: std::sync::OnceLock::new(),
            // The first sweep within a minute of the store's start.
            sweep: SweepSchedule::new(sweep_every, Duration::from_secs(60)),
        }
    }
}

impl PostgresStore {
    /// A store using `pool` and the default table `idempotency_keys`.
    ///
    /// Lease extensions (the heartbeat of running handlers) go through a
    /// second pool of at most 2 connections, opened on first use with
    /// `pool`'s options, hooks (`after_connect`, ...) and connect options
    /// (and any newer ones set on `pool` later, such as a rotated
    /// password), each call bounded to 1 s: a heartbeat never queues behind
    /// the handlers' own connections (a handler holding a pooled
    /// transaction, a pool too small for the load), and after an outage of
    /// the database it is back within one heartbeat, not after the main
    /// pool's connect back-off. An extension the lease pool cannot make (no
    /// connection slot left on the server, say) is tried once more on
    /// `pool`, also bounded to 1 s. Count those 2 connections in
    /// PostgreSQL's `max_connections`.
    ///
    /// The store sweeps expired records by itself, in bounded batches from
    /// a short task started by a claim at most once per
    /// [`sweep_every`](Self::sweep_every) (default 5 minutes).
    pub fn new(pool: PgPool) -> Self {
        Self {
            pool,
            queries: Arc::new(Queries::new(DEFAULT_TABLE)),
            shared: Arc::new(Shared::new(Some(DEFAULT_SWEEP_EVERY))),
        }
    }

    /// How often the store sweeps expired records by itself (default every
    /// 5 minutes; `None`: never, the application calls
    /// [`IdempotencyStore::sweep_expired`](crate::IdempotencyStore::sweep_expired)
    /// or [`spawn_sweeper`](crate::spawn_sweeper)). Each sweep deletes in
    /// batches of 5 000 rows, each its own short statement, skipping rows
    /// that another replica's sweep holds.
    pub fn sweep_every(mut self, every: Option<Duration>) -> Self {
        self.shared = Arc::new(Shared::new(every));
        self
    }

    /// Connects a pool of [`DEFAULT_POOL_SIZE`] connections to `url` and
    /// returns a store using it. Other sizes:
    /// [`PostgresStore::connect_with_pool_size`]; any other pool setting:
    /// build the pool yourself and pass it to [`PostgresStore::new`].
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        Self::connect_with_pool_size(url, DEFAULT_POOL_SIZE).await
    }

    /// Connects a pool of at most `max_connections` connections to `url`
    /// and returns a store using it.
    ///
    /// How to size it: every request in flight holds a connection while it
    /// talks to the database; in the transactional mode
    /// ([`IdempotencyLayer::transactional`](crate::IdempotencyLayer::transactional))
    /// it holds one for its whole duration, handler included. A request
    /// that finds none free waits for one, so a pool smaller than the
    /// number of concurrent requests caps throughput (and the commits that
    /// PostgreSQL could flush together). The bound is PostgreSQL's
    /// `max_connections` (100 by default), shared by every replica of the
    /// service and everything else that connects.
    ///
    /// # Errors
    ///
    /// When `max_connections` is 0, or PostgreSQL cannot be reached.
    pub async fn connect_with_pool_size(
        url: &str,
        max_connections: u32,
    ) -> Result<Self, StoreError> {
        if max_connections == 0 {
            return Err(StoreError::msg("the pool needs at least one connection"));
        }
        let pool = PgPoolOptions::new()
            .max_connections(max_connections)
            .connect(url)
            .await
            .map_err(db_err("connecting to PostgreSQL"))?;
        Ok(Self::new(pool))
    }

    /// Uses `table` instead of `idempotency_keys`.
    ///
    /// The name must be a plain lower-case SQL identifier (`[a-z_][a-z0-9_]*`,
    /// at most 48 characters), optionally prefixed by a schema name and a dot.
    pub fn with_table(mut self, table: &str) -> Result<Self, StoreError> {
        fn ident_ok(s: &str) -> bool {
            let mut chars = s.chars();
            matches!(chars.next(), Some(c) if c.is_ascii_lowercase() || c == '_')
                && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
                && s.len() <= 48
        }
        let valid = match table.split_once('.') {
            Some((schema, name)) => ident_ok(schema) && ident_ok(name),
            None => ident_ok(table),
        };
        if !valid {
            return Err(StoreError::msg(format!(
                "invalid table name {table:?}: expected [a-z_][a-z0-9_]* (optionally schema.table)"
            )));
        }
        self.queries = Arc::new(Queries::new(table));
        Ok(self)
    }

    /// The connection pool (share it with your handlers).
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The table this store uses.
    pub fn table(&self) -> &str {
        &self.queries.table
    }
}
