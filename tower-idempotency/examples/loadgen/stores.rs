//! The PostgreSQL side: the pool, the layer's key table and the
//! handlers' payments table, emptied before each measurement.

use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use tower_idempotency::PostgresStore;

/// The handlers' table.
pub(crate) const PAYMENTS: &str = "loadgen_payments";
/// The layer's table of keys.
const KEYS: &str = "loadgen_keys";

/// A pool of `pool_size` connections to `DATABASE_URL`, the store over it
/// (with a store pool of `store_connections`) and both tables created.
pub(crate) async fn connect_pg(
    pool_size: u32,
    commit_delay_us: u32,
    test_before_acquire: bool,
    store_connections: u32,
) -> Result<PostgresStore, String> {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1/test".to_owned());
    let mut options = PgConnectOptions::from_str(&url)
        .map_err(|e| format!("DATABASE_URL={url} is not a PostgreSQL URL: {e}"))?;
    if commit_delay_us > 0 {
        options = options.options([
            ("commit_delay", commit_delay_us.to_string()),
            ("commit_siblings", "0".to_owned()),
        ]);
    }
    let connect = PgPoolOptions::new()
        .max_connections(pool_size)
        .acquire_timeout(Duration::from_secs(10))
        .test_before_acquire(test_before_acquire)
        .connect_with(options);
    let pool = match tokio::time::timeout(Duration::from_secs(5), connect).await {
        Ok(Ok(pool)) => pool,
        Ok(Err(err)) => {
            return Err(format!(
                "PostgreSQL is not reachable at DATABASE_URL={url}: {err}"
            ))
        }
        Err(_) => {
            return Err(format!(
                "PostgreSQL is not reachable at DATABASE_URL={url}: no answer within 5 s"
            ))
        }
    };
    let store = PostgresStore::new(pool)
        .store_connections(store_connections)
        .with_table(KEYS)
        .map_err(|e| e.to_string())?;
    store.migrate().await.map_err(|e| e.to_string())?;
    sqlx::query(&format!(
        "CREATE TABLE IF NOT EXISTS {PAYMENTS} (id bigserial PRIMARY KEY, key text NOT NULL, \
         body text NOT NULL)"
    ))
    .execute(store.pool())
    .await
    .map_err(|e| format!("creating {PAYMENTS}: {e}"))?;
    Ok(store)
}

/// Empties both tables: every measurement starts from fresh ones.
pub(crate) async fn truncate(store: &PostgresStore) -> Result<(), String> {
    sqlx::query(&format!("TRUNCATE {PAYMENTS}, {KEYS}"))
        .execute(store.pool())
        .await
        .map(|_| ())
        .map_err(|e| format!("truncating the loadgen tables: {e}"))
}
