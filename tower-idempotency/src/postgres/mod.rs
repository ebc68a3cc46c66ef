//! [`PostgresStore`]: a store shared by every server instance, in PostgreSQL.
//!
//! May use: `store`.
//!
//! The schema lives in the crate's `migrations/` folder and is applied by
//! [`PostgresStore::migrate`]. Every timestamp (claim, lease, expiry, sweep)
//! is computed by the database with `now()`, never from a replica's clock, so
//! a replica whose clock runs ahead cannot take over a live claim.
//!
//! This file holds the store, its pools and its settings. Below it, files
//! that import nothing above them: `sql.rs` (the statements, sent as simple
//! queries, and the migrations), `error.rs` (what a failure means) and
//! `conns.rs` (pools derived from the main one and the connections a store
//! pool keeps). Above it, each an `impl PostgresStore` of its own:
//! `pools.rs` (which connection a call runs on: the main pool's by
//! default, inside the budget the user sized), `lease.rs` (keeping leases alive),
//! `maintenance.rs` (migrating, sweeping), `claim.rs` (one key's row, on a
//! given connection, which the transactional mode uses too) and `ops.rs`
//! (the store trait). They use the store's types, nothing of the request
//! path or the layer: the two completions that take the layer's request
//! context live with the request path (`request/in_tx.rs`).

/// Runs `$op` (a future using the connection `$conn`) on a connection of
/// the main pool (or of the store pool, kept, when the user opened one),
/// and once more on another one each time it fails because the connection
/// is broken, as often as that pool holds connections (see `conns.rs`).
/// For statements that are safe to repeat: a read, a
/// claim with the same lease token, a completion or a release (repeated
/// after one that committed, they report the lease as gone, which the
/// layer treats as it treats any lost lease: it answers with what the
/// store holds).
macro_rules! on_kept {
    ($store:expr, $conn:ident => $op:expr) => {{
        let store = &$store;
        let mut tries = store.retries();
        loop {
            let mut $conn = store.kept().await?;
            let result = $op.await;
            if !store.finish(&mut tries, $conn, &result) {
                break result;
            }
        }
    }};
}

mod claim;
mod commit;
mod conns;
mod error;
mod lease;
mod maintenance;
mod ops;
#[cfg(test)]
mod own_claim_tests;
mod pools;
mod sql;

use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::postgres::{PgPool, PgPoolOptions};

use crate::store::{StoreError, SweepSchedule};

use self::conns::{DerivedPool, Stash};
pub(crate) use self::error::db_err;
pub use self::sql::MIGRATION_SQL;
use self::sql::{Queries, DEFAULT_TABLE};

/// Connections in the pool that [`PostgresStore::connect`] opens: enough
/// for 30 requests in flight at once, each holding a connection (the whole
/// request long, in the transactional mode), while three replicas, each
/// with its lease pool of 2, still fit in the 97 connections PostgreSQL's
/// default `max_connections` of 100 leaves to ordinary roles (3 × 32 = 96).
/// (sqlx's default of 10 left 32 concurrent requests queueing for
/// connections.) The store's statements borrow this pool's connections and
/// give them back; nothing else is opened except the lease pool's 2 (see
/// [`PostgresStore::new`]) and, when you ask for one, a store pool of the
/// size you give ([`PostgresStore::store_connections`]).
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
    /// The size of the store pool; 0: none, the main pool serves.
    store_connections: u32,
    queries: Arc<Queries>,
    /// The lease pool and the sweeping schedule, shared by clones.
    shared: Arc<Shared>,
}

/// The longest the store pool takes to hand over a connection before the
/// main pool serves the call (a server with no connection slot left for it
/// refuses, and sqlx tries again until this timeout).
const STORE_POOL_WAIT: Duration = Duration::from_secs(1);

/// After the store pool failed to hand over a connection, the main pool
/// serves for this long before the store pool is tried again.
const STORE_POOL_REST: Duration = Duration::from_secs(10);

/// Default interval of the sweeps a store starts by itself.
const DEFAULT_SWEEP_EVERY: Duration = Duration::from_secs(300);

#[derive(Debug)]
struct Shared {
    /// A small pool of its own for lease extensions, opened on first use
    /// with the main pool's options and hooks.
    lease_pool: std::sync::OnceLock<DerivedPool>,
    /// The pool of the store's own statements and of the transactional
    /// mode's transactions, when the user asked for one (see
    /// [`PostgresStore::store_connections`]), opened on first use with the
    /// main pool's options and hooks.
    store_pool: std::sync::OnceLock<DerivedPool>,
    /// The store pool's connections kept between the store's statements.
    stash: Stash,
    /// When the store pool last failed to hand over a connection, while
    /// the main pool serves for it (an episode, logged once).
    store_pool_failed: std::sync::Mutex<Option<Instant>>,
    /// Whether the lease pool failed its last extension and the main pool
    /// served it (an episode, logged once).
    lease_pool_failing: std::sync::atomic::AtomicBool,
    /// When the next sweep is due.
    sweep: SweepSchedule,
    /// How often sweeps are due (`sweep`'s setting).
    sweep_every: Option<Duration>,
}

impl Shared {
    fn new(sweep_every: Option<Duration>) -> Self {
        Self {
            lease_pool: std::sync::OnceLock::new(),
            store_pool: std::sync::OnceLock::new(),
            stash: Stash::default(),
            store_pool_failed: std::sync::Mutex::new(None),
            lease_pool_failing: std::sync::atomic::AtomicBool::new(false),
            // The first sweep within a minute of the store's start.
            sweep: SweepSchedule::new(sweep_every, Duration::from_secs(60)),
            sweep_every,
        }
    }
}

impl PostgresStore {
    /// A store using `pool` and the default table `idempotency_keys`.
    ///
    /// **Connections.** The store's statements (claims, completions, ...)
    /// and the transactional mode's transactions borrow `pool`'s
    /// connections and give them back after each call: they live inside
    /// the budget you sized `pool` for, and your handlers' own
    /// `pool().begin()` gets every connection `pool` was configured to
    /// open, whatever ran before. A call through `pool` costs sqlx's pings
    /// too (one as a connection is taken, unless the pool was built with
    /// `.test_before_acquire(false)`; one as it goes back):
    /// [`store_connections`](Self::store_connections) trades a budget of
    /// your choosing for those round trips.
    ///
    /// Besides, lease extensions (the heartbeat of running handlers) go
    /// through a pool of at most **2** connections of their own, opened on
    /// first use with `pool`'s options, hooks (`after_connect`, ...) and
    /// connect options (and any newer ones set on `pool` later, such as a
    /// rotated password), each call bounded to 1 s, and closed 10 s after
    /// the last extension: a heartbeat never queues behind the handlers'
    /// own connections (a handler holding a pooled transaction, a pool too
    /// small for the load), and after an outage of the database it is back
    /// within one heartbeat, not after the main pool's connect back-off.
    /// An extension the lease pool cannot make (no connection slot left on
    /// the server, say) is tried once more on `pool`, also bounded to 1 s,
    /// and logged at `warn` once until the lease pool serves again. Count
    /// those 2 connections in PostgreSQL's `max_connections`, a role's
    /// `CONNECTION LIMIT` or a pooler's pool, beside `pool`'s size.
    ///
    /// Every statement goes as a simple query, with no prepared statement:
    /// PgBouncer in session and in transaction mode carries it (see the
    /// stores guide for what a transaction-mode pooler asks of the
    /// handlers' own statements).
    ///
    /// The store sweeps expired records by itself, in bounded batches from
    /// a short task started by a claim at most once per
    /// [`sweep_every`](Self::sweep_every) (default 5 minutes).
    pub fn new(pool: PgPool) -> Self {
        Self {
            pool,
            store_connections: 0,
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
