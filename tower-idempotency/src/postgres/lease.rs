//! Keeping leases alive: the small pool of its own that extends them,
//! each extension bounded in time (see [`PostgresStore::new`]).

use std::time::Duration;

use sqlx::postgres::PgPool;

use sqlx::Executor;

use crate::store::{LeaseToken, StoreError};

use super::claim::render;
use super::error::db_err;
use super::sql::Lit;
use super::{DerivedPool, PostgresStore};

/// Connections of the pool that extends leases (see
/// [`PostgresStore::new`]).
const LEASE_POOL_SIZE: u32 = 2;

/// How long a lease pool connection stays open after its last extension:
/// while handlers run long enough to need a heartbeat (every third of a
/// lock timeout), their extensions find it open; once none does, the slot
/// goes back to the server (or the pooler) within this.
const LEASE_POOL_IDLE: Duration = Duration::from_secs(10);

/// How long one lease extension may take on one pool, connecting
/// included, before it counts as failed. Short: after an outage the
/// heartbeat must be back well within a lock timeout of a retry marking
/// the lease stale (two tries, then the next tick a third of a lock
/// timeout later: under 4 s with the defaults, against 5 s).
const LEASE_CALL_TIMEOUT: Duration = Duration::from_secs(1);

impl PostgresStore {
    /// The pool for lease extensions (see [`PostgresStore::new`]), with the
    /// main pool's current connect options.
    pub(super) fn lease_pool(&self) -> &PgPool {
        self.shared
            .lease_pool
            .get_or_init(|| {
                DerivedPool::new(&self.pool, |options| {
                    options
                        .max_connections(LEASE_POOL_SIZE)
                        .min_connections(0)
                        .idle_timeout(LEASE_POOL_IDLE)
                        .acquire_timeout(LEASE_CALL_TIMEOUT)
                })
            })
            .get(&self.pool)
    }

    /// One extension on `pool`, bounded to [`LEASE_CALL_TIMEOUT`].
    pub(super) async fn extend_on(
        &self,
        pool: &PgPool,
        scope: &str,
        key: &str,
        lease: LeaseToken,
    ) -> Result<bool, StoreError> {
        let lease = lease.0.to_string();
        let sql = render(
            &self.queries.extend,
            &[Lit::Text(scope), Lit::Text(key), Lit::Text(&lease)],
        )?;
        let extend = pool.execute(sql.as_str());
        let Ok(result) = tokio::time::timeout(LEASE_CALL_TIMEOUT, extend).await else {
            let err = StoreError::msg(format!(
                "extending the lease of an idempotency key: no answer within {LEASE_CALL_TIMEOUT:?}"
            ));
            return Err(err.transient());
        };
        let done = result.map_err(db_err("extending the lease of an idempotency key"))?;
        Ok(done.rows_affected() == 1)
    }
}
