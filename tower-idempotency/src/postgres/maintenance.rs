//! Keeping the table: creating it ([`PostgresStore::migrate`]) and
//! sweeping its expired rows, in bounded batches, from a short task a claim
//! starts at most once per `sweep_every`.

use sqlx::Executor;

use crate::store::{spawn_sweep, StoreError};

use super::error::db_err;
use super::sql::MIGRATION_SQL;
use super::PostgresStore;

/// Rows deleted per sweeping statement.
pub(super) const SWEEP_BATCH: i64 = 5_000;

impl PostgresStore {
    /// Starts a sweep in a task of its own if one is due.
    pub(super) fn maybe_sweep(&self) {
        if self.shared.sweep.due() {
            spawn_sweep(self.clone());
        }
    }

    /// Creates the table and index if they do not exist (the SQL of
    /// `migrations/0001_create_idempotency_keys.sql`, with the table name
    /// substituted). Safe to call concurrently and repeatedly.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        let table = &self.queries.table;
        let index_table = table.replace('.', "_");
        let sql = MIGRATION_SQL
            .replace(
                "idempotency_keys_expires_at_idx",
                &format!("{index_table}_expires_at_idx"),
            )
            .replace("idempotency_keys", table);
        let mut tx = self.pool.begin().await.map_err(db_err("migrate: begin"))?;
        // A simple query, as every statement of the store (see `sql.rs`).
        (&mut *tx)
            .execute("SELECT pg_advisory_xact_lock(hashtext('tower_idempotency_migrate'))")
            .await
            .map_err(db_err("migrate: advisory lock"))?;
        sqlx::raw_sql(&sql)
            .execute(&mut *tx)
            .await
            .map_err(db_err("migrate: create table"))?;
        tx.commit().await.map_err(db_err("migrate: commit"))?;
        Ok(())
    }
}
