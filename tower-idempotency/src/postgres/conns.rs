//! The store's own connections: pools made from the main pool's options,
//! hooks and connect options (the lease pool; the store pool, when the
//! user opens one with `PostgresStore::store_connections`), and the store
//! pool's connections the store keeps between its statements.
//!
//! sqlx pings a connection (one round trip) each time one is taken from a
//! pool (`test_before_acquire`) and each time one is given back (always).
//! The store's statements are one round trip each, so those pings tripled
//! them. The store pool skips the first ping, and the store keeps its
//! connections instead of giving them back, so it skips the second: a
//! statement costs its own round trip only. What the pings were for (a
//! connection the server closed) is found by the statement that fails on
//! it: the caller repeats the statement on another connection, for as
//! many connections as the pool holds, as sqlx's ping-and-discard loop
//! would have (see [`KeptConn::finish`]). Uses the store's types only.

use std::collections::VecDeque;
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::{PgConnection, Postgres};

use crate::store::StoreError;

/// A pool made from the main pool's options and hooks (`after_connect`,
/// `before_acquire`, ...) and its connect options, following any newer
/// connect options set on the main pool later (a rotated password).
#[derive(Debug)]
pub(super) struct DerivedPool {
    pool: PgPool,
    options: Mutex<Arc<PgConnectOptions>>,
}

impl DerivedPool {
    /// A pool of `main`'s options changed by `tune`, connecting lazily.
    pub(super) fn new(main: &PgPool, tune: impl FnOnce(PgPoolOptions) -> PgPoolOptions) -> Self {
        let current = main.connect_options();
        Self {
            pool: tune(main.options().clone()).connect_lazy_with((*current).clone()),
            options: Mutex::new(current),
        }
    }

    /// The pool, with `main`'s current connect options.
    pub(super) fn get(&self, main: &PgPool) -> &PgPool {
        let current = main.connect_options();
        let mut options = self.options.lock().unwrap_or_else(|p| p.into_inner());
        if !Arc::ptr_eq(&options, &current) {
            self.pool.set_connect_options((*current).clone());
            *options = current;
        }
        &self.pool
    }
}

/// Connections of the store pool that the store keeps between its
/// statements, most recently used last.
#[derive(Debug, Default)]
pub(super) struct Stash {
    idle: Mutex<VecDeque<Idle>>,
}

#[derive(Debug)]
struct Idle {
    conn: PoolConnection<Postgres>,
    taken_at: Instant,
    idle_since: Instant,
}

impl Stash {
    /// The most recently used kept connection that `pool`'s `max_lifetime`
    /// and `idle_timeout` still allow; the others go back to the pool,
    /// which closes them.
    pub(super) fn take(&self, pool: &PgPool) -> Option<KeptConn> {
        let options = pool.options();
        let (lifetime, idle_timeout) = (options.get_max_lifetime(), options.get_idle_timeout());
        let mut expired = Vec::new();
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        let found = loop {
            let Some(kept) = idle.pop_back() else {
                break None;
            };
            let old = lifetime.is_some_and(|max| kept.taken_at.elapsed() > max)
                || idle_timeout.is_some_and(|max| kept.idle_since.elapsed() > max);
            if !old {
                break Some(KeptConn {
                    conn: kept.conn,
                    taken_at: kept.taken_at,
                    keep: true,
                });
            }
            expired.push(kept);
        };
        drop(idle);
        // Given back outside the lock (each drop starts a task).
        drop(expired);
        found
    }

    /// Keeps `conn`, unless `limit` are kept already: then it goes back to
    /// the pool.
    fn keep(&self, conn: KeptConn, limit: usize) {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        if idle.len() < limit {
            idle.push_back(Idle {
                conn: conn.conn,
                taken_at: conn.taken_at,
                idle_since: Instant::now(),
            });
        }
    }

    /// Gives every kept connection back to the pool, which pings each and
    /// closes those the server closed (after a restart, all of them).
    pub(super) fn flush(&self) {
        let all = std::mem::take(&mut *self.idle.lock().unwrap_or_else(|p| p.into_inner()));
        drop(all);
    }
}

impl Drop for Stash {
    fn drop(&mut self) {
        // Given back, a pooled connection starts a task: outside a Tokio
        // runtime (a store dropped after its runtime) that would panic, so
        // there the kept connections are closed as they are.
        if tokio::runtime::Handle::try_current().is_ok() {
            return;
        }
        let idle = self.idle.get_mut().unwrap_or_else(|p| p.into_inner());
        for kept in idle.drain(..) {
            drop(kept.conn.detach());
        }
    }
}

/// A connection of the store pool, kept by the store between statements.
/// Dropped without [`finish`](Self::finish) (the request's future dropped
/// mid-statement), it goes back to the pool, which pings it and so reads
/// whatever answer was still coming, or closes it.
#[derive(Debug)]
pub(super) struct KeptConn {
    conn: PoolConnection<Postgres>,
    taken_at: Instant,
    /// Whether it may be kept: not one of the main pool's, which its
    /// handlers may be waiting for.
    keep: bool,
}

impl KeptConn {
    /// A connection just taken from a pool: the store pool's (`keep`), or
    /// the main pool's.
    pub(super) fn new(conn: PoolConnection<Postgres>, keep: bool) -> Self {
        Self {
            conn,
            taken_at: Instant::now(),
            keep,
        }
    }

    /// Done with the connection after `result`: kept for the next
    /// statement (at most `limit` kept; a main pool's connection goes
    /// back), or, when `result` says the
    /// connection is broken, dropped together with every kept one (they
    /// are likely broken too); `true` then: the caller repeats its
    /// statement on another connection.
    pub(super) fn finish<T>(
        self,
        stash: &Stash,
        limit: usize,
        result: &Result<T, StoreError>,
    ) -> bool {
        match result {
            Err(err) if broken_store(err) => {
                drop(self);
                stash.flush();
                true
            }
            _ if self.keep => {
                stash.keep(self, limit);
                false
            }
            _ => false,
        }
    }
}

impl Deref for KeptConn {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        &self.conn
    }
}

impl DerefMut for KeptConn {
    fn deref_mut(&mut self) -> &mut PgConnection {
        &mut self.conn
    }
}

/// Whether `err` says the connection it happened on is unusable: it was
/// closed or cut, or the server ended the session (what a ping finds).
pub(super) fn broken(err: &sqlx::Error) -> bool {
    match err {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::WorkerCrashed => true,
        // 08: connection exception; 57P01-57P03: the session ended by the
        // server (terminated, shut down, restarting).
        sqlx::Error::Database(db) => db.code().is_some_and(|code| {
            code.starts_with("08") || matches!(code.as_ref(), "57P01" | "57P02" | "57P03")
        }),
        _ => false,
    }
}

fn broken_store(err: &StoreError) -> bool {
    std::error::Error::source(err)
        .and_then(|source| source.downcast_ref::<sqlx::Error>())
        .is_some_and(broken)
}
