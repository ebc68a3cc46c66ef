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
//! that import nothing above them: `sql.rs` (the statements and the
//! migrations), `error.rs` (what a failure means) and `conns.rs` (the
//! store's own pools and the connections it keeps). Above it, each an
//! `impl PostgresStore` of its own: `lease.rs` (keeping leases alive),
//! `maintenance.rs` (migrating, sweeping), `claim.rs` (one key's row, on a
//! given connection, which the transactional mode uses too) and `ops.rs`
//! (the store trait). They use the store's types, nothing of the request
//! path or the layer: the two completions that take the layer's request
//! context live with the request path (`request/in_tx.rs`).

/// Runs `$op` (a future using the connection `$conn`) on a connection the
/// store keeps, and once more on another one each time it fails because
/// the connection is broken, as often as the store pool holds connections
/// (see `conns.rs`). For statements that are safe to repeat: a read, a
/// claim with the same lease token, a completion or a release (repeated
/// after one that committed, they report the lease as gone, which the
/// layer treats as it treats any lost lease: it answers with what the
/// store holds).
macro_rules! on_kept {
    ($store:expr, $conn:ident => $op:expr) => {{
        let store = &$store;
        let mut tries = store.store_pool().options().get_max_connections();
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
mod sql;

use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::postgres::{PgPool, PgPoolOptions};

use crate::store::{StoreError, SweepSchedule};

use self::conns::{broken, DerivedPool, KeptConn, Stash};
pub(crate) use self::error::db_err;
pub use self::sql::MIGRATION_SQL;
use self::sql::{Queries, DEFAULT_TABLE};

/// Connections in the pool that [`PostgresStore::connect`] opens: enough
/// for 30 requests in flight at once, each holding a connection (the whole
/// request long, in the transactional mode), while three replicas, each
/// with its lease pool of 2, still fit in the 97 connections PostgreSQL's
/// default `max_connections` of 100 leaves to ordinary roles (3 × 32 = 96).
/// (sqlx's default of 10 left 32 concurrent requests queueing for
/// connections.) The store's own pool (see [`PostgresStore::new`]) may
/// open as many again at peak; where the server has no slot left for it,
/// the store's statements go through this pool.
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
    /// mode's transactions (see [`PostgresStore::new`]), opened on first
    /// use with the main pool's options and hooks.
    store_pool: std::sync::OnceLock<DerivedPool>,
    /// The store pool's connections kept between the store's statements.
    stash: Stash,
    /// When the store pool last failed to hand over a connection.
    store_pool_failed: std::sync::Mutex<Option<Instant>>,
    /// When the next sweep is due.
    sweep: SweepSchedule,
}

impl Shared {
    fn new(sweep_every: Option<Duration>) -> Self {
        Self {
            lease_pool: std::sync::OnceLock::new(),
            store_pool: std::sync::OnceLock::new(),
            stash: Stash::default(),
            store_pool_failed: std::sync::Mutex::new(None),
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
    /// The store's own statements (claims, completions, ...) and the
    /// transactional mode's transactions go through a third pool, as large
    /// as `pool` and opened on first use the same way, with `pool`'s
    /// options and hooks but without sqlx's liveness ping at checkout; the
    /// store keeps its connections between statements instead of giving
    /// them back (sqlx pings each connection given back): a statement
    /// costs one round trip, not three. `after_connect` runs on each of its
    /// connections; `before_acquire` and `after_release` run when the store
    /// takes one from that pool or gives one back, not around each
    /// statement on a kept connection. A connection the server closed is
    /// found by the statement that fails on it, which is then repeated on
    /// another (a claim keeps its lease token, so a repeated claim that
    /// finds its own row is claimed). When that pool cannot hand over a
    /// connection within 1 s (no slot left on the server), `pool` serves
    /// for 10 s. Count up to `pool`'s size again in `max_connections`.
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

    /// The pool of the store's own statements and transactions: `pool`'s
    /// options, hooks and size, without sqlx's ping at checkout (see
    /// `conns.rs`), waiting at most [`STORE_POOL_WAIT`] for a connection.
    fn store_pool(&self) -> &PgPool {
        self.shared
            .store_pool
            .get_or_init(|| {
                DerivedPool::new(&self.pool, |options| {
                    let wait = options.get_acquire_timeout().min(STORE_POOL_WAIT);
                    options
                        .test_before_acquire(false)
                        .min_connections(0)
                        .acquire_timeout(wait)
                })
            })
            .get(&self.pool)
    }

    /// The store pool, unless it failed to hand over a connection less than
    /// [`STORE_POOL_REST`] ago, or the main pool was closed: then the main
    /// pool serves (a closed one refuses).
    fn store_pool_now(&self) -> Option<&PgPool> {
        if self.pool.is_closed() {
            self.shared.stash.flush();
            return None;
        }
        let failed = self.shared.store_pool_failed.lock();
        let failed = *failed.unwrap_or_else(|p| p.into_inner());
        match failed {
            Some(at) if at.elapsed() < STORE_POOL_REST => None,
            _ => Some(self.store_pool()),
        }
    }

    /// Notes that the store pool could not hand over a connection (`err`).
    fn store_pool_failed(&self, err: &sqlx::Error) {
        tracing::debug!(error = %err, "the store pool failed; the main pool serves for a while");
        let failed = self.shared.store_pool_failed.lock();
        *failed.unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
    }

    /// A connection for the store's statements: one it kept, or a new one
    /// from the store pool, or one of the main pool's if the store pool
    /// cannot hand one over (no connection slot left on the server, say).
    async fn kept(&self) -> Result<KeptConn, StoreError> {
        if let Some(pool) = self.store_pool_now() {
            if let Some(conn) = self.shared.stash.take(pool) {
                return Ok(conn);
            }
            match pool.acquire().await {
                Ok(conn) => return Ok(KeptConn::new(conn, true)),
                Err(err) => self.store_pool_failed(&err),
            }
        }
        let conn = self
            .pool
            .acquire()
            .await
            .map_err(db_err("acquiring a connection"))?;
        Ok(KeptConn::new(conn, false))
    }

    /// Done with `conn` after `result` (see [`KeptConn::finish`]); `true`:
    /// try again on another connection, if `tries` are left. At most half
    /// of the store pool is kept idle: the transactional mode takes its
    /// transactions from the same pool.
    fn finish<T>(&self, tries: &mut u32, conn: KeptConn, result: &Result<T, StoreError>) -> bool {
        let limit = self
            .store_pool()
            .options()
            .get_max_connections()
            .div_ceil(2);
        let again = conn.finish(&self.shared.stash, limit as usize, result);
        if !again || *tries == 0 {
            return false;
        }
        *tries -= 1;
        true
    }

    /// A transaction started with `begin` on the store pool (on the main
    /// pool if the store pool cannot hand over a connection). A connection
    /// the server closed fails the `BEGIN` (which changes nothing): then
    /// on another, as many times as the pool holds connections.
    pub(crate) async fn begin_with(
        &self,
        begin: std::borrow::Cow<'static, str>,
    ) -> Result<sqlx::Transaction<'static, sqlx::Postgres>, StoreError> {
        let mut pool = self.store_pool_now().unwrap_or(&self.pool);
        let mut tries = pool.options().get_max_connections();
        loop {
            match pool.begin_with(begin.clone()).await {
                Err(err) if broken(&err) && tries > 0 => tries -= 1,
                Err(err @ sqlx::Error::PoolTimedOut) if !std::ptr::eq(pool, &self.pool) => {
                    self.store_pool_failed(&err);
                    pool = &self.pool;
                }
                other => return other.map_err(db_err("beginning a transaction")),
            }
        }
    }
}
