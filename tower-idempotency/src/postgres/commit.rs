//! Storing a response and committing the transaction it belongs to, in
//! one round trip: for [`PostgresStore::commit_completed`] and the
//! transactional mode.

use sqlx::{Executor, Postgres, Transaction};

use crate::store::{headers_to_json, LeaseToken, StoreError, StoredResponse};

use super::claim::status_column;
use super::error::db_err;
use super::sql::complete_and_commit;
use super::PostgresStore;

impl PostgresStore {
    /// Completes `(scope, key)` under `lease` with `response` in `tx` and
    /// commits `tx`: `Ok(true)`. `Ok(false)`: the lease is not current,
    /// `tx` was rolled back, nothing of it committed. An error may come
    /// before the commit or from it: committed or not, the caller cannot
    /// tell.
    pub(crate) async fn complete_and_commit(
        &self,
        mut tx: Transaction<'static, Postgres>,
        scope: &str,
        key: &str,
        lease: LeaseToken,
        response: &StoredResponse,
    ) -> Result<bool, StoreError> {
        let status = status_column(response)?;
        let headers = headers_to_json(&response.headers)?;
        let lease_text = lease.0.to_string();
        let Some(sql) = complete_and_commit(
            &self.queries.table,
            scope,
            key,
            &lease_text,
            status,
            &headers,
            &response.body,
        ) else {
            // A body too large to write into the query: bound, in an
            // unnamed statement (parsed, then executed: inside the
            // transaction, which a transaction-mode pooler keeps on one
            // server), then committed.
            let stored = sqlx::query(&self.queries.complete_bound)
                .bind(scope)
                .bind(key)
                .bind(&lease_text)
                .bind(status)
                .bind(&headers)
                .bind(response.body.as_ref())
                .persistent(false)
                .execute(&mut *tx)
                .await
                .map_err(db_err("completing idempotency key"))?;
            if stored.rows_affected() != 1 {
                return rolled_back(tx).await;
            }
            tx.commit()
                .await
                .map_err(db_err("committing an idempotent response"))?;
            return Ok(true);
        };
        // A `&str` without arguments: sent as a simple query.
        match tx.execute(sql.as_str()).await {
            // Committed; `tx` now holds the empty transaction begun after
            // the commit, rolled back when it is dropped (sent with the
            // connection's next message: sqlx's ping as it goes back to
            // its pool).
            Ok(_) => Ok(true),
            Err(sqlx::Error::Database(db)) if db.code().as_deref() == Some("22012") => {
                rolled_back(tx).await
            }
            Err(err) => Err(db_err("storing an idempotent response and committing")(err)),
        }
    }
}

/// `Ok(false)` once `tx` is rolled back.
async fn rolled_back(tx: Transaction<'static, Postgres>) -> Result<bool, StoreError> {
    tx.rollback()
        .await
        .map_err(db_err("rolling back a request whose lease was taken over"))?;
    Ok(false)
}
