//! The [`IdempotencyStore`] calls of a [`PostgresStore`], each on a
//! connection the store keeps (lease extensions on the lease pool first,
//! sweeps on the main pool).

use std::sync::atomic::Ordering;

use async_trait::async_trait;

use sqlx::Executor;

use crate::store::{
    ClaimOutcome, ClaimRequest, Fingerprint, IdempotencyStore, LeaseToken, StoreError,
    StoredResponse,
};

use super::claim::render;
use super::error::db_err;
use super::maintenance::SWEEP_BATCH;
use super::sql::Lit;
use super::PostgresStore;

#[async_trait]
impl IdempotencyStore for PostgresStore {
    async fn claim(&self, req: ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError> {
        // One token for every try: a claim repeated after one that
        // committed on a connection that broke finds its own token and is
        // claimed.
        let lease = LeaseToken::new_random();
        on_kept!(self, conn => async {
            let (outcome, mark) = self.claim_on(&mut conn, req, lease).await?;
            if mark {
                self.mark_stale(Some(&mut conn), req).await?;
            }
            Ok(outcome)
        })
    }

    async fn lookup(
        &self,
        scope: &str,
        key: &str,
        fingerprint: Fingerprint,
    ) -> Result<Option<ClaimOutcome>, StoreError> {
        on_kept!(self, conn => self.read_on(&mut conn, scope, key, fingerprint))
    }

    async fn complete(
        &self,
        scope: &str,
        key: &str,
        lease: LeaseToken,
        response: &StoredResponse,
    ) -> Result<bool, StoreError> {
        on_kept!(self, conn => self.complete_on(&mut conn, scope, key, lease, response))
    }

    async fn extend_lease(
        &self,
        scope: &str,
        key: &str,
        lease: LeaseToken,
    ) -> Result<bool, StoreError> {
        // On the lease pool, then on the main pool if the lease pool could
        // not: see `PostgresStore::new`.
        // (sqlx reports a connection the server refused, for want of a
        // slot say, as a pool timeout, like an unreachable server: either
        // way the main pool gets one bounded try.)
        // The main pool's try is a fallback a user depends on: logged at
        // `warn` once an episode (until the lease pool serves again).
        let failing = &self.shared.lease_pool_failing;
        match self.extend_on(self.lease_pool(), scope, key, lease).await {
            Ok(extended) => {
                if failing.swap(false, Ordering::Relaxed) {
                    tracing::info!("the idempotency lease pool serves again");
                }
                Ok(extended)
            }
            Err(err) => {
                if failing.swap(true, Ordering::Relaxed) {
                    tracing::debug!(error = %err, "the lease pool failed; extending on the main pool");
                } else {
                    tracing::warn!(
                        error = %err,
                        "the idempotency lease pool could not extend a lease; the application's \
                         pool extends leases until it can (count the lease pool's 2 connections \
                         in the server's or the pooler's budget)"
                    );
                }
                self.extend_on(&self.pool, scope, key, lease).await
            }
        }
    }

    async fn release(&self, scope: &str, key: &str, lease: LeaseToken) -> Result<bool, StoreError> {
        let lease = lease.0.to_string();
        let sql = render(
            &self.queries.release,
            &[Lit::Text(scope), Lit::Text(key), Lit::Text(&lease)],
        )?;
        let result = on_kept!(self, conn => async {
            (&mut *conn)
                .execute(sql.as_str())
                .await
                .map_err(db_err("releasing idempotency key"))
        })?;
        Ok(result.rows_affected() == 1)
    }

    async fn sweep_expired(&self) -> Result<u64, StoreError> {
        // In batches, each a short statement of its own: a table with a
        // million expired rows shrinks batch by batch, within any
        // `statement_timeout`, and never holds one long lock.
        let mut swept = 0;
        let sql = render(&self.queries.sweep, &[Lit::Int(SWEEP_BATCH)])?;
        loop {
            let batch = self
                .pool
                .execute(sql.as_str())
                .await
                .map_err(db_err("sweeping expired idempotency keys"))?
                .rows_affected();
            swept += batch;
            if batch < SWEEP_BATCH as u64 {
                return Ok(swept);
            }
        }
    }
}
