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

use crate::context::IdempotencyContext;
use crate::store::{
    check_ids, ClaimOutcome, ClaimRequest, Fingerprint, IdempotencyStore, LeaseToken, StoreError,
    StoredResponse,
};

/// The SQL of the crate's migrations, in order, for the default table
/// `idempotency_keys`.
pub const MIGRATION_SQL: &str = concat!(
    include_str!("../migrations/0001_create_idempotency_keys.sql"),
    include_str!("../migrations/0002_lease_fencing.sql"),
);

const DEFAULT_TABLE: &str = "idempotency_keys";

/// Connections in the pool that [`PostgresStore::connect`] opens: enough
/// for 30 requests in flight at once, each holding a connection (the whole
/// request long, in the transactional mode), while three replicas, each
/// with its lease pool of 2, still fit in the 97 connections PostgreSQL's
/// default `max_connections` of 100 leaves to ordinary roles (3 × 32 = 96).
/// (sqlx's default of 10 left 32 concurrent requests queueing for
/// connections.)
pub const DEFAULT_POOL_SIZE: u32 = 30;

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
    mark_stale: String,
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
                 locked_at, lock_token, expires_at, ttl) \
                 VALUES ($1, $2, $3, 'in_progress', now(), now(), $5::uuid, \
                 now() + make_interval(secs => $4::float8), make_interval(secs => $4::float8)) \
                 ON CONFLICT (scope, key) DO UPDATE SET \
                 request_fingerprint = EXCLUDED.request_fingerprint, status = 'in_progress', \
                 response_code = NULL, headers = NULL, body = NULL, \
                 created_at = EXCLUDED.created_at, locked_at = EXCLUDED.locked_at, \
                 lock_token = EXCLUDED.lock_token, expires_at = EXCLUDED.expires_at, \
                 ttl = EXCLUDED.ttl, stale_seen_at = NULL \
                 WHERE t.expires_at <= now() \
                 OR (t.status = 'in_progress' \
                     AND t.request_fingerprint = EXCLUDED.request_fingerprint \
                     AND t.locked_at <= now() - make_interval(secs => $6::float8) \
                     AND t.stale_seen_at > t.locked_at \
                     AND t.stale_seen_at <= now() - make_interval(secs => $6::float8)) \
                 RETURNING lock_token::text"
            ),
            select: format!(
                "SELECT request_fingerprint, status, response_code, headers::text AS headers, body \
                 FROM {t} WHERE scope = $1 AND key = $2 AND expires_at > now()"
            ),
            // First sight of a stale lease ($3: its fingerprint, $4: the
            // lock timeout in seconds): a takeover waits a lock timeout
            // after it.
            mark_stale: format!(
                "UPDATE {t} SET stale_seen_at = now() \
                 WHERE scope = $1 AND key = $2 AND status = 'in_progress' \
                 AND request_fingerprint = $3 \
                 AND locked_at <= now() - make_interval(secs => $4::float8) \
                 AND (stale_seen_at IS NULL OR stale_seen_at <= locked_at)"
            ),
            complete: format!(
                "UPDATE {t} SET status = 'completed', response_code = $4, headers = $5::jsonb, \
                 body = $6, locked_at = NULL, lock_token = NULL \
                 WHERE scope = $1 AND key = $2 AND status = 'in_progress' \
                 AND lock_token = $3::uuid"
            ),
            extend: format!(
                "UPDATE {t} SET locked_at = now(), \
                 expires_at = GREATEST(expires_at, now() + ttl) \
                 WHERE scope = $1 AND key = $2 AND status = 'in_progress' \
                 AND lock_token = $3::uuid"
            ),
            release: format!(
                "DELETE FROM {t} WHERE scope = $1 AND key = $2 AND status = 'in_progress' \
                 AND lock_token = $3::uuid"
            ),
            // One bounded batch ($1 rows); replicas sweeping at once skip
            // each other's rows instead of waiting on them.
            sweep: format!(
                "DELETE FROM {t} WHERE ctid IN (SELECT ctid FROM {t} WHERE expires_at <= now() \
                 LIMIT $1 FOR UPDATE SKIP LOCKED)"
            ),
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
    /// The lease pool and the sweeping schedule, shared by clones.
    shared: Arc<Shared>,
}

/// Connections of the pool that extends leases (see
/// [`PostgresStore::new`]).
const LEASE_POOL_SIZE: u32 = 2;

/// How long one lease extension may take on one pool, connecting
/// included, before it counts as failed. Short: after an outage the
/// heartbeat must be back well within a lock timeout of a retry marking
/// the lease stale (two tries, then the next tick a third of a lock
/// timeout later: under 4 s with the defaults, against 5 s).
const LEASE_CALL_TIMEOUT: Duration = Duration::from_secs(1);

/// Rows deleted per sweeping statement.
const SWEEP_BATCH: i64 = 5_000;

/// Default interval of the sweeps a store starts by itself.
const DEFAULT_SWEEP_EVERY: Duration = Duration::from_secs(300);

#[derive(Debug)]
struct Shared {
    /// A small pool of its own for lease extensions, opened on first use
    /// with the main pool's options and hooks.
    lease_pool: std::sync::OnceLock<LeasePool>,
    /// When the next sweep is due (`None`: sweeping is off).
    next_sweep: std::sync::Mutex<Option<std::time::Instant>>,
    sweep_every: Option<Duration>,
}

/// The lease pool, with the main pool's connect options it was made with
/// (a newer set, from `Pool::set_connect_options`, is passed on).
#[derive(Debug)]
struct LeasePool {
    pool: PgPool,
    options: std::sync::Mutex<Arc<sqlx::postgres::PgConnectOptions>>,
}

impl Shared {
    fn new(sweep_every: Option<Duration>) -> Self {
        Self {
            lease_pool: std::sync::OnceLock::new(),
            next_sweep: std::sync::Mutex::new(sweep_every.and_then(|every| {
                std::time::Instant::now().checked_add(every.min(Duration::from_secs(60)))
            })),
            sweep_every,
        }
    }
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
    /// [`IdempotencyStore::sweep_expired`] or
    /// [`spawn_sweeper`](crate::spawn_sweeper)). Each sweep deletes in
    /// batches of 5 000 rows, each its own short statement, skipping rows
    /// that another replica's sweep holds.
    pub fn sweep_every(mut self, every: Option<Duration>) -> Self {
        self.shared = Arc::new(Shared::new(every.filter(|e| !e.is_zero())));
        self
    }

    /// The pool for lease extensions (see [`PostgresStore::new`]), with the
    /// main pool's current connect options.
    fn lease_pool(&self) -> &PgPool {
        let current = self.pool.connect_options();
        let lease = self.shared.lease_pool.get_or_init(|| LeasePool {
            pool: self
                .pool
                .options()
                .clone()
                .max_connections(LEASE_POOL_SIZE)
                .min_connections(0)
                .acquire_timeout(LEASE_CALL_TIMEOUT)
                .connect_lazy_with((*current).clone()),
            options: std::sync::Mutex::new(current.clone()),
        });
        let mut options = lease.options.lock().unwrap_or_else(|p| p.into_inner());
        if !Arc::ptr_eq(&options, &current) {
            lease.pool.set_connect_options((*current).clone());
            *options = current;
        }
        &lease.pool
    }

    /// One extension on `pool`, bounded to [`LEASE_CALL_TIMEOUT`].
    async fn extend_on(
        &self,
        pool: &PgPool,
        scope: &str,
        key: &str,
        lease: LeaseToken,
    ) -> Result<bool, StoreError> {
        let extend = sqlx::query(&self.queries.extend)
            .bind(scope)
            .bind(key)
            .bind(lease.0.to_string())
            .execute(pool);
        let Ok(result) = tokio::time::timeout(LEASE_CALL_TIMEOUT, extend).await else {
            let err = StoreError::msg(format!(
                "extending the lease of an idempotency key: no answer within {LEASE_CALL_TIMEOUT:?}"
            ));
            return Err(err.transient());
        };
        let done = result.map_err(db_err("extending the lease of an idempotency key"))?;
        Ok(done.rows_affected() == 1)
    }

    /// Starts a sweep in a task of its own if one is due.
    fn maybe_sweep(&self) {
        let Some(every) = self.shared.sweep_every else {
            return;
        };
        let now = std::time::Instant::now();
        {
            let mut next = self
                .shared
                .next_sweep
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            match *next {
                // Not due; or never again (the interval overflowed).
                Some(at) if at > now => return,
                None => return,
                // An interval past what an `Instant` holds means never again.
                Some(_) => *next = now.checked_add(every),
            }
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let store = self.clone();
        drop(runtime.spawn(async move {
            match store.sweep_expired().await {
                Ok(n) if n > 0 => tracing::debug!(swept = n, "swept expired idempotency keys"),
                Ok(_) => {}
                Err(err) => {
                    tracing::warn!(error = %err, "sweeping expired idempotency keys failed")
                }
            }
        }));
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
        let completed = self
            .complete_on(tx, ctx.scope(), ctx.key(), ctx.lease(), response)
            .await?;
        if completed {
            ctx.note_completed();
        }
        Ok(completed)
    }

    /// Claims on `conn` (a pooled connection, or the transaction of the
    /// transactional mode, where the claim commits with the handler's
    /// writes). A claim that loses the insert race and then finds the row
    /// gone (it was released in between) tries again; a few rounds suffice.
    ///
    /// Does not mark a stale lease: `true` beside the outcome says the
    /// caller must, with [`PostgresStore::mark_stale`], on a connection
    /// whose work commits (never inside a transaction about to be rolled
    /// back, where the mark would vanish with it).
    pub(crate) async fn claim_on(
        &self,
        conn: &mut PgConnection,
        req: ClaimRequest<'_>,
    ) -> Result<(ClaimOutcome, bool), StoreError> {
        check_ids(req.scope, req.key)?;
        self.maybe_sweep();
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
                .await;
            let claimed = match claimed {
                // The transactional mode waits on a row an open transaction
                // holds for at most its `lock_timeout`: that request is in
                // progress.
                Err(sqlx::Error::Database(db)) if db.code().as_deref() == Some("55P03") => {
                    let busy = ClaimOutcome::InProgress {
                        fingerprint_matches: true,
                    };
                    return Ok((busy, false));
                }
                other => other.map_err(db_err("claiming idempotency key"))?,
            };
            if claimed.is_some() {
                return Ok((ClaimOutcome::Claimed(lease), false));
            }
            let Some(outcome) = self
                .read_on(conn, req.scope, req.key, req.fingerprint)
                .await?
            else {
                continue;
            };
            let mark = matches!(
                outcome,
                ClaimOutcome::InProgress {
                    fingerprint_matches: true
                }
            );
            return Ok((outcome, mark));
        }
        Err(StoreError::msg(
            "claiming idempotency key: the row kept changing, giving up",
        ))
    }

    /// Marks the lease of `req`'s key as seen stale if it is stale and not
    /// marked since its last extension: its owner gets a lock timeout to
    /// come back before a takeover. On `conn`, or on the pool.
    pub(crate) async fn mark_stale(
        &self,
        conn: Option<&mut PgConnection>,
        req: ClaimRequest<'_>,
    ) -> Result<(), StoreError> {
        let mark = sqlx::query(&self.queries.mark_stale)
            .bind(req.scope)
            .bind(req.key)
            .bind(req.fingerprint.as_bytes().as_slice())
            .bind(interval_secs(req.lock_timeout));
        match conn {
            Some(conn) => mark.execute(conn).await,
            None => mark.execute(&self.pool).await,
        }
        .map_err(db_err("marking a stale idempotency lease"))?;
        Ok(())
    }

    /// The live record of `(scope, key)` on `conn`, as a claim that did not
    /// win sees it.
    async fn read_on(
        &self,
        conn: &mut PgConnection,
        scope: &str,
        key: &str,
        fingerprint: Fingerprint,
    ) -> Result<Option<ClaimOutcome>, StoreError> {
        let row = sqlx::query(&self.queries.select)
            .bind(scope)
            .bind(key)
            .fetch_optional(&mut *conn)
            .await
            .map_err(db_err("reading idempotency key"))?;
        let Some(row) = row else { return Ok(None) };
        let fp: Vec<u8> = row
            .try_get("request_fingerprint")
            .map_err(db_err("decode"))?;
        let fingerprint_matches = Fingerprint::from_slice(&fp) == Some(fingerprint);
        let status: String = row.try_get("status").map_err(db_err("decode"))?;
        if status != "completed" {
            return Ok(Some(ClaimOutcome::InProgress {
                fingerprint_matches,
            }));
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
        Ok(Some(ClaimOutcome::Completed {
            response: StoredResponse {
                status,
                headers,
                body: Bytes::from(body.unwrap_or_default()),
            },
            fingerprint_matches,
        }))
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
        let (outcome, mark) = self.claim_on(&mut conn, req).await?;
        if mark {
            self.mark_stale(Some(&mut conn), req).await?;
        }
        Ok(outcome)
    }

    async fn lookup(
        &self,
        scope: &str,
        key: &str,
        fingerprint: Fingerprint,
    ) -> Result<Option<ClaimOutcome>, StoreError> {
        let mut conn = self
            .pool
            .acquire()
            .await
            .map_err(db_err("acquiring a connection"))?;
        self.read_on(&mut conn, scope, key, fingerprint).await
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
        // On the lease pool, then on the main pool if the lease pool could
        // not: see `PostgresStore::new`.
        // (sqlx reports a connection the server refused, for want of a
        // slot say, as a pool timeout, like an unreachable server: either
        // way the main pool gets one bounded try.)
        match self.extend_on(self.lease_pool(), scope, key, lease).await {
            Ok(extended) => Ok(extended),
            Err(err) => {
                tracing::debug!(error = %err, "the lease pool failed; extending on the main pool");
                self.extend_on(&self.pool, scope, key, lease).await
            }
        }
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
        // In batches, each a short statement of its own: a table with a
        // million expired rows shrinks batch by batch, within any
        // `statement_timeout`, and never holds one long lock.
        let mut swept = 0;
        loop {
            let batch = sqlx::query(&self.queries.sweep)
                .bind(SWEEP_BATCH)
                .execute(&self.pool)
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
