//! Which connection a store call runs on: one borrowed from the main pool
//! and given back (the default), or, when the user opened a store pool
//! ([`PostgresStore::store_connections`]), one of that pool's, kept
//! between statements (see `conns.rs`), with the main pool serving while
//! the store pool cannot.

use std::sync::Arc;
use std::time::Instant;

use sqlx::postgres::PgPool;

use crate::store::StoreError;

use super::conns::{broken, DerivedPool, KeptConn};
use super::error::db_err;
use super::{PostgresStore, Shared, STORE_POOL_REST, STORE_POOL_WAIT};

impl PostgresStore {
    /// Opens a pool of at most `connections` connections of the store's own
    /// for its statements and the transactional mode's transactions (0,
    /// the default: none, the store's [`pool`](Self::pool) serves them).
    /// Count them in PostgreSQL's `max_connections`, a role's
    /// `CONNECTION LIMIT` or a pooler's pool, beside that pool's size and
    /// the lease pool's 2.
    ///
    /// What it buys: that pool is built without sqlx's ping at checkout,
    /// and the store keeps its connections between statements instead of
    /// giving them back (sqlx pings each connection given back), so a
    /// store statement costs one round trip, not three. What it costs:
    /// those connections stay open (up to half of them idle between
    /// requests) whether or not the application's pool needs the slots.
    /// `after_connect` runs on each of its connections; `before_acquire`
    /// and `after_release` run when the store takes one from that pool or
    /// gives one back, not around each statement on a kept connection. A
    /// connection the server closed is found by the statement that fails
    /// on it, which is then repeated on another. When that pool cannot
    /// hand over a connection within 1 s (no slot left on the server),
    /// the store's pool serves for 10 s at a time, logged at `warn` once until the
    /// store pool serves again; a pooler that accepts the connection and
    /// queues it instead (PgBouncer with its pool full) makes the store's
    /// calls wait in its queue: size the pooler's pool for both.
    pub fn store_connections(mut self, connections: u32) -> Self {
        self.store_connections = connections;
        self.shared = Arc::new(Shared::new(self.shared.sweep_every));
        self
    }

    /// The pool of the store's own statements and transactions: `pool`'s
    /// options and hooks, [`store_connections`](Self::store_connections)
    /// in size, without sqlx's ping at checkout (see `conns.rs`), waiting
    /// at most [`STORE_POOL_WAIT`] for a connection.
    pub(super) fn store_pool(&self) -> &PgPool {
        self.shared
            .store_pool
            .get_or_init(|| {
                DerivedPool::new(&self.pool, |options| {
                    let wait = options.get_acquire_timeout().min(STORE_POOL_WAIT);
                    options
                        .max_connections(self.store_connections)
                        .test_before_acquire(false)
                        .min_connections(0)
                        .acquire_timeout(wait)
                })
            })
            .get(&self.pool)
    }

    /// How many connections a store call tries before it gives up on
    /// connections the server closed: as many as its pool holds.
    pub(super) fn retries(&self) -> u32 {
        match self.store_connections {
            0 => self.pool.options().get_max_connections(),
            n => n,
        }
    }

    /// The store pool, unless there is none, or it failed to hand over a
    /// connection less than [`STORE_POOL_REST`] ago, or the main pool was
    /// closed: then the main pool serves (a closed one refuses).
    fn store_pool_now(&self) -> Option<&PgPool> {
        if self.store_connections == 0 {
            return None;
        }
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

    /// Notes that the store pool could not hand over a connection (`err`):
    /// logged at `warn` at the start of an episode, at `debug` after.
    fn store_pool_failed(&self, err: &sqlx::Error) {
        let failed = self.shared.store_pool_failed.lock();
        let mut failed = failed.unwrap_or_else(|p| p.into_inner());
        if failed.is_none() {
            tracing::warn!(
                error = %err,
                "the idempotency store pool could not open a connection; the application's pool \
                 serves the store until it can (size the server's or the pooler's connections \
                 for both)"
            );
        } else {
            tracing::debug!(error = %err, "the store pool failed again; the main pool serves");
        }
        *failed = Some(Instant::now());
    }

    /// Notes that the store pool handed over a connection: an episode of
    /// failures, if any, is over.
    fn store_pool_served(&self) {
        let failed = self.shared.store_pool_failed.lock();
        let mut failed = failed.unwrap_or_else(|p| p.into_inner());
        if failed.take().is_some() {
            tracing::info!("the idempotency store pool serves again");
        }
    }

    /// A connection for the store's statements: one it kept, or a new one
    /// from the store pool, or one of the main pool's if the store pool
    /// cannot hand one over (no connection slot left on the server, say).
    pub(super) async fn kept(&self) -> Result<KeptConn, StoreError> {
        if let Some(pool) = self.store_pool_now() {
            if let Some(conn) = self.shared.stash.take(pool) {
                return Ok(conn);
            }
            match pool.acquire().await {
                Ok(conn) => {
                    self.store_pool_served();
                    return Ok(KeptConn::new(conn, true));
                }
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
    pub(super) fn finish<T>(
        &self,
        tries: &mut u32,
        conn: KeptConn,
        result: &Result<T, StoreError>,
    ) -> bool {
        let limit = self.store_connections.div_ceil(2);
        let again = conn.finish(&self.shared.stash, limit as usize, result);
        if !again || *tries == 0 {
            return false;
        }
        *tries -= 1;
        true
    }

    /// A transaction started with `begin` on the main pool (on the store
    /// pool if the user opened one and it can hand over a connection). A connection
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
                Ok(tx) if !std::ptr::eq(pool, &self.pool) => {
                    self.store_pool_served();
                    return Ok(tx);
                }
                other => return other.map_err(db_err("beginning a transaction")),
            }
        }
    }
}
