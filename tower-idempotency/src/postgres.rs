//! [`PostgresStore`]: a store shared by every server instance, in PostgreSQL.
//!
//! The schema lives in the crate's `migrations/` folder and is applied by
//! [`PostgresStore::migrate`]. Every timestamp (claim, lease, expiry, sweep)
//! is computed by the database with `now()`, never from a replica's clock, so
//! a replica whose clock runs ahead cannot take over a live claim.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::{PgConnection, Postgres, Row, Transaction};

use crate::layer::IdempotencyContext;
use crate::store::{
    check_ids, ClaimOutcome, ClaimRequest, Fingerprint, IdempotencyStore, LeaseToken, StoreError,
    StoredResponse,
};

/// The SQL of the crate's migration, for the default table `idempotency_keys`.
pub const MIGRATION_SQL: &str = include_str!("../migrations/0001_create_idempotency_keys.sql");

const DEFAULT_TABLE: &str = "idempotency_keys";

/// Connections in the pool that [`PostgresStore::connect`] opens: enough
/// for 32 requests in flight at once, each holding a connection (the whole
/// request long, in the transactional mode), while three replicas still fit
/// in PostgreSQL's default `max_connections` of 100. (sqlx's default of 10
/// left 32 concurrent requests queueing for connections.)
pub const DEFAULT_POOL_SIZE: u32 = 32;

/// Durations are bound as seconds; longer ones mean "never" and are capped
/// here so that `now() + interval` cannot overflow.
const MAX_INTERVAL_SECS: f64 = 100.0 * 365.0 * 24.0 * 3600.0;

fn interval_secs(d: Duration) -> f64 {
    d.as_secs_f64().min(MAX_INTERVAL_SECS)
}

#[derive(Debug)]
struct Queries {
    table: String,
    claim: String,
    select: String,
    complete: String,
    extend: String,
    release: String,
    sweep: String,
}

impl Queries {
    fn new(t: &str) -> Self {
        Self {
            table: t.to_owned(),
            // $4: ttl in seconds, $5: lease, $6: lock timeout in seconds.
            claim: format!(
                "INSERT INTO {t} AS t (scope, key, request_fingerprint, status, created_at, \
                 locked_at, lock_token, expires_at) \
                 VALUES ($1, $2, $3, 'in_progress', now(), now(), $5::uuid, \
                 now() + make_interval(secs => $4::float8)) \
                 ON CONFLICT (scope, key) DO UPDATE SET \
                 request_fingerprint = EXCLUDED.request_fingerprint, status = 'in_progress', \
                 response_code = NULL, headers = NULL, body = NULL, \
                 created_at = EXCLUDED.created_at, locked_at = EXCLUDED.locked_at, \
                 lock_token = EXCLUDED.lock_token, expires_at = EXCLUDED.expires_at \
                 WHERE t.expires_at <= now() \
                 OR (t.status = 'in_progress' \
                     AND t.request_fingerprint = EXCLUDED.request_fingerprint \
                     AND t.locked_at <= now() - make_interval(secs => $6::float8)) \
                 RETURNING lock_token::text"
            ),
            select: format!(
                "SELECT request_fingerprint, status, response_code, headers::text AS headers, body \
                 FROM {t} WHERE scope = $1 AND key = $2 AND expires_at > now()"
            ),
            complete: format!(
                "UPDATE {t} SET status = 'completed', response_code = $4, headers = $5::jsonb, \
                 body = $6, locked_at = NULL, lock_token = NULL \
                 WHERE scope = $1 AND key = $2 AND status = 'in_progress' \
                 AND lock_token = $3::uuid"
            ),
            extend: format!(
                "UPDATE {t} SET locked_at = now() \
                 WHERE scope = $1 AND key = $2 AND status = 'in_progress' \
                 AND lock_token = $3::uuid"
            ),
            release: format!(
                "DELETE FROM {t} WHERE scope = $1 AND key = $2 AND status = 'in_progress' \
                 AND lock_token = $3::uuid"
            ),
            sweep: format!("DELETE FROM {t} WHERE expires_at <= now()"),
        }
    }
}

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
}

/// Whether retrying later may help: the connection or the pool failed, or
/// the server is restarting or overloaded. Anything else (a constraint, a
/// value PostgreSQL refuses, a missing table) is permanent.
fn is_transient(err: &sqlx::Error) -> bool {
    match err {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(db) => db.code().is_some_and(|code| {
            // 08: connection exception; 57P01-57P03: admin shutdown, crash
            // shutdown, cannot connect now; 53300: too many connections;
            // 40001/40P01: serialization failure, deadlock; 57014: query
            // cancelled (statement timeout).
            code.starts_with("08")
                || matches!(
                    code.as_ref(),
                    "57P01" | "57P02" | "57P03" | "53300" | "40001" | "40P01" | "57014"
                )
        }),
        _ => false,
    }
}

pub(crate) fn db_err(what: &'static str) -> impl FnOnce(sqlx::Error) -> StoreError {
    move |e| {
        let transient = is_transient(&e);
        let err = StoreError::with_source(what, e);
        if transient {
            err.transient()
        } else {
            err
        }
    }
}

fn headers_json(headers: &[(String, String)]) -> Result<String, StoreError> {
    serde_json::to_string(headers).map_err(|e| StoreError::with_source("encoding headers", e))
}

impl PostgresStore {
    /// A store using `pool` and the default table `idempotency_keys`.
    pub fn new(pool: PgPool) -> Self {
        Self {
            pool,
            queries: Arc::new(Queries::new(DEFAULT_TABLE)),
        }
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
        sqlx::query("SELECT pg_advisory_xact_lock(hashtext('tower_idempotency_migrate'))")
            .execute(&mut *tx)
            .await
            .map_err(db_err("migrate: advisory lock"))?;
        sqlx::raw_sql(&sql)
            .execute(&mut *tx)
            .await
            .map_err(db_err("migrate: create table"))?;
        tx.commit().await.map_err(db_err("migrate: commit"))?;
        Ok(())
    }

    /// Completes the key described by `ctx` inside the caller's transaction.
    ///
    /// Use this from a handler that writes its own effects (say, a payment
    /// row) in `tx`: the effect and the stored response then commit or roll
    /// back together, so a crash can never leave an effect without a
    /// replayable response. After the handler returns, the layer notices that
    /// the key is already completed and does not store the response again.
    /// Returns `Ok(false)` if the lease is no longer current (the claim was
    /// taken over after the lock timeout); the handler should then roll back.
    ///
    /// ```no_run
    /// # async fn demo(store: tower_idempotency::PostgresStore, ctx: tower_idempotency::IdempotencyContext) -> Result<(), Box<dyn std::error::Error>> {
    /// use tower_idempotency::StoredResponse;
    /// let mut tx = store.pool().begin().await?;
    /// sqlx::query("INSERT INTO payments (account, amount) VALUES ('a', 1)").execute(&mut *tx).await?;
    /// let response = StoredResponse::json(201, r#"{"ok":true}"#);
    /// if store.complete_in_tx(&mut tx, &ctx, &response).await? {
    ///     tx.commit().await?;
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn complete_in_tx(
        &self,
        tx: &mut Transaction<'_, Postgres>,
        ctx: &IdempotencyContext,
        response: &StoredResponse,
    ) -> Result<bool, StoreError> {
        self.complete_on(tx, ctx.scope(), ctx.key(), ctx.lease(), response)
            .await
    }

    /// Claims on `conn` (a pooled connection, or the transaction of the
    /// transactional mode, where the claim commits with the handler's
    /// writes). A claim that loses the insert race and then finds the row
    /// gone (it was released in between) tries again; a few rounds suffice.
    pub(crate) async fn claim_on(
        &self,
        conn: &mut PgConnection,
        req: ClaimRequest<'_>,
    ) -> Result<ClaimOutcome, StoreError> {
        check_ids(req.scope, req.key)?;
        for _ in 0..8 {
            let lease = LeaseToken::new_random();
            let claimed = sqlx::query(&self.queries.claim)
                .bind(req.scope)
                .bind(req.key)
                .bind(req.fingerprint.as_bytes().as_slice())
                .bind(interval_secs(req.ttl))
                .bind(lease.0.to_string())
                .bind(interval_secs(req.lock_timeout))
                .fetch_optional(&mut *conn)
                .await
                .map_err(db_err("claiming idempotency key"))?;
            if claimed.is_some() {
                return Ok(ClaimOutcome::Claimed(lease));
            }
            let row = sqlx::query(&self.queries.select)
                .bind(req.scope)
                .bind(req.key)
                .fetch_optional(&mut *conn)
                .await
                .map_err(db_err("reading idempotency key"))?;
            let Some(row) = row else { continue };
            let fp: Vec<u8> = row
                .try_get("request_fingerprint")
                .map_err(db_err("decode"))?;
            let fingerprint_matches = Fingerprint::from_slice(&fp) == Some(req.fingerprint);
            let status: String = row.try_get("status").map_err(db_err("decode"))?;
            if status != "completed" {
                return Ok(ClaimOutcome::InProgress {
                    fingerprint_matches,
                });
            }
            let code: Option<i16> = row.try_get("response_code").map_err(db_err("decode"))?;
            let headers: Option<String> = row.try_get("headers").map_err(db_err("decode"))?;
            let body: Option<Vec<u8>> = row.try_get("body").map_err(db_err("decode"))?;
            let headers: Vec<(String, String)> = match headers {
                Some(text) => serde_json::from_str(&text)
                    .map_err(|e| StoreError::with_source("decoding stored headers", e))?,
                None => Vec::new(),
            };
            let status = code
                .and_then(|c| u16::try_from(c).ok())
                .ok_or_else(|| StoreError::msg("completed key without a valid response code"))?;
            return Ok(ClaimOutcome::Completed {
                response: StoredResponse {
                    status,
                    headers,
                    body: Bytes::from(body.unwrap_or_default()),
                },
                fingerprint_matches,
            });
        }
        Err(StoreError::msg(
            "claiming idempotency key: the row kept changing, giving up",
        ))
    }

    pub(crate) async fn complete_on(
        &self,
        conn: &mut PgConnection,
        scope: &str,
        key: &str,
        lease: LeaseToken,
        response: &StoredResponse,
    ) -> Result<bool, StoreError> {
        let status = i16::try_from(response.status)
            .map_err(|_| StoreError::msg("status code out of range"))?;
        let result = sqlx::query(&self.queries.complete)
            .bind(scope)
            .bind(key)
            .bind(lease.0.to_string())
            .bind(status)
            .bind(headers_json(&response.headers)?)
            .bind(response.body.as_ref())
            .execute(conn)
            .await
            .map_err(db_err("completing idempotency key"))?;
        Ok(result.rows_affected() == 1)
    }
}

#[async_trait]
impl IdempotencyStore for PostgresStore {
    async fn claim(&self, req: ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError> {
        let mut conn = self
            .pool
            .acquire()
            .await
            .map_err(db_err("acquiring a connection"))?;
        self.claim_on(&mut conn, req).await
    }

    async fn complete(
        &self,
        scope: &str,
        key: &str,
        lease: LeaseToken,
        response: &StoredResponse,
    ) -> Result<bool, StoreError> {
        let mut conn = self
            .pool
            .acquire()
            .await
            .map_err(db_err("acquiring a connection"))?;
        self.complete_on(&mut conn, scope, key, lease, response)
            .await
    }

    async fn extend_lease(
        &self,
        scope: &str,
        key: &str,
        lease: LeaseToken,
    ) -> Result<bool, StoreError> {
        let result = sqlx::query(&self.queries.extend)
            .bind(scope)
            .bind(key)
            .bind(lease.0.to_string())
            .execute(&self.pool)
            .await
            .map_err(db_err("extending the lease of an idempotency key"))?;
        Ok(result.rows_affected() == 1)
    }

    async fn release(&self, scope: &str, key: &str, lease: LeaseToken) -> Result<bool, StoreError> {
        let result = sqlx::query(&self.queries.release)
            .bind(scope)
            .bind(key)
            .bind(lease.0.to_string())
            .execute(&self.pool)
            .await
            .map_err(db_err("releasing idempotency key"))?;
        Ok(result.rows_affected() == 1)
    }

    async fn sweep_expired(&self) -> Result<u64, StoreError> {
        let result = sqlx::query(&self.queries.sweep)
            .execute(&self.pool)
            .await
            .map_err(db_err("sweeping expired idempotency keys"))?;
        Ok(result.rows_affected())
    }
}
