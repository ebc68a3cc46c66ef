//! Shared helpers for the integration tests: one harness per store, a test
//! application, and request/response helpers.
#![allow(dead_code)]

pub mod cluster;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, Request, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing;
use axum::Router;
use http_body_util::BodyExt;
use tokio::sync::Notify;
use tower::ServiceExt;
use tower_idempotency::{
    IdempotencyLayer, IdempotencyLayerBuilder, IdempotencyStore, ManualClock, MemoryStore,
    PostgresStore, RedisClusterStore, RedisStore,
};

/// Runs the given async test functions (each `async fn(Harness)`) once per
/// store: `mod NAME { memory, postgres, redis, redis_cluster }`. Each
/// PostgreSQL run gets a private table, each Redis run a private key prefix
/// (so moving its time cannot disturb another test), dropped at the end;
/// the cluster is one per test binary (`cluster::shared`).
#[macro_export]
macro_rules! both_stores {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn memory() {
                super::$name($crate::support::Harness::memory().await).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn postgres() {
                let h = $crate::support::Harness::postgres().await;
                let cleanup = h.cleanup();
                super::$name(h).await;
                cleanup.run().await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn redis() {
                let h = $crate::support::Harness::redis().await;
                let cleanup = h.cleanup();
                super::$name(h).await;
                cleanup.run().await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn redis_cluster() {
                let h = $crate::support::Harness::redis_cluster().await;
                let cleanup = h.cleanup();
                super::$name(h).await;
                cleanup.run().await;
            }
        }
    )*};
}

/// A store under test with a way to move its time and a unique scope prefix.
pub struct Harness {
    pub name: &'static str,
    pub store: Arc<dyn IdempotencyStore>,
    /// The memory store's clock (PostgreSQL uses the database's: see
    /// [`Harness::advance`]).
    pub clock: Arc<ManualClock>,
    /// Unique per test, so tests sharing a store never collide.
    pub scope: String,
    pub pg: Option<PostgresStore>,
    pub redis: Option<RedisStore>,
    /// The cluster store and the URLs of the cluster's nodes.
    pub cluster: Option<(RedisClusterStore, Vec<String>)>,
}

pub fn database_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// Whether PostgreSQL answered the first probe of this test binary; probed
/// once with a short timeout so a stopped server fails every test at once
/// with one message instead of a long wait per test.
async fn probe_postgres() -> &'static Result<(), String> {
    static PROBE: tokio::sync::OnceCell<Result<(), String>> = tokio::sync::OnceCell::const_new();
    PROBE
        .get_or_init(|| async {
            let url = database_url();
            let connect = sqlx::postgres::PgPoolOptions::new()
                .max_connections(1)
                .acquire_timeout(Duration::from_secs(2))
                .connect(&url);
            match tokio::time::timeout(Duration::from_secs(3), connect).await {
                Ok(Ok(pool)) => {
                    pool.close().await;
                    Ok(())
                }
                Ok(Err(err)) => Err(format!("{err}")),
                Err(_) => Err("no answer within 3 s".to_owned()),
            }
        })
        .await
}

/// Connects to the test database or fails the test with one clear message
/// naming the URL used.
pub async fn pg_store(table: &str) -> PostgresStore {
    let url = database_url();
    if let Err(err) = probe_postgres().await {
        panic!(
            "PostgreSQL is not reachable at DATABASE_URL={url} ({err}). Start it with \
             `pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start` \
             (and `createdb -h 127.0.0.1 -U postgres test` once), or point DATABASE_URL at \
             another server."
        );
    }
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(8)
        .acquire_timeout(Duration::from_secs(5))
        .connect(&url)
        .await
        .unwrap_or_else(|err| panic!("PostgreSQL at DATABASE_URL={url}: {err}"));
    let store = PostgresStore::new(pool)
        .with_table(table)
        .expect("valid table name");
    store.migrate().await.expect("migrating the test table");
    store
}

pub fn unique(prefix: &str) -> String {
    format!("{prefix}{}", uuid::Uuid::new_v4().simple())
}

/// The Redis the tests use: `REDIS_URL`, or the local default.
pub fn redis_url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
}

/// A Redis store under a private prefix, or a panic naming the URL and how
/// to start the server. The local server keeps nothing on disk: the store
/// is connected as volatile (what `connect` would refuse).
pub async fn redis_store(prefix: &str) -> RedisStore {
    let url = redis_url();
    let connect = RedisStore::connect_volatile(&url);
    let store = match tokio::time::timeout(Duration::from_secs(3), connect).await {
        Ok(Ok(store)) => store,
        Ok(Err(err)) => panic!(
            "Redis is not reachable at REDIS_URL={url} ({err}). Start it with              `redis-server --daemonize yes`, or point REDIS_URL at another server."
        ),
        Err(_) => panic!("Redis at REDIS_URL={url} did not answer within 3 s"),
    };
    store.with_prefix(prefix).expect("valid prefix")
}

/// Runs `script` (ARGV[1]: a number, ARGV[2]: the key pattern) over every
/// key of `store`'s prefix.
async fn over_redis_keys(store: &RedisStore, script: &str, n: i64) {
    let pattern = format!("{}:*", store.prefix());
    let _: () = redis::Script::new(script)
        .arg(n)
        .arg(pattern)
        .invoke_async(&mut store.connection())
        .await
        .expect("a script over the test's Redis keys");
}

/// How many records a Redis store holds (Redis deletes expired ones by
/// itself).
pub async fn redis_records(store: &RedisStore) -> usize {
    let mut conn = store.connection();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{}:r:*", store.prefix()))
        .query_async(&mut conn)
        .await
        .expect("listing the test's Redis keys");
    keys.len()
}

/// Moves every timestamp of a Redis store's records, and their expiry,
/// `by` into the past.
const REDIS_ADVANCE: &str = "
local cursor, d = '0', tonumber(ARGV[1])
repeat
  local page = redis.call('SCAN', cursor, 'MATCH', ARGV[2], 'COUNT', 1000)
  cursor = page[1]
  for _, k in ipairs(page[2]) do
    local kind = redis.call('TYPE', k).ok
    if kind == 'zset' then
      local scored = redis.call('ZRANGE', k, 0, -1, 'WITHSCORES')
      for i = 1, #scored, 2 do redis.call('ZADD', k, tonumber(scored[i + 1]) - d, scored[i]) end
    end
    if kind == 'hash' then
      for _, f in ipairs({'locked', 'stale', 'exp'}) do
        local v = tonumber(redis.call('HGET', k, f) or '0')
        if v > 0 then redis.call('HSET', k, f, v - d) end
      end
      local left = redis.call('PTTL', k)
      if left > 0 then
        if left <= d then redis.call('DEL', k) else redis.call('PEXPIRE', k, left - d) end
      end
    end
  end
until cursor == '0'
";

/// Deletes every key of a Redis store's prefix.
const REDIS_DROP: &str = "
local cursor = '0'
repeat
  local page = redis.call('SCAN', cursor, 'MATCH', ARGV[2], 'COUNT', 1000)
  cursor = page[1]
  for _, k in ipairs(page[2]) do redis.call('DEL', k) end
until cursor == '0'
";

/// Deletes every key of a Redis store's prefix.
pub async fn drop_redis_keys(store: &RedisStore) {
    over_redis_keys(store, REDIS_DROP, 0).await;
}

/// Drops a PostgreSQL harness's private table, or a Redis harness's keys.
pub struct Cleanup(
    Option<PostgresStore>,
    Option<RedisStore>,
    Option<(RedisClusterStore, Vec<String>)>,
);

impl Cleanup {
    pub async fn run(self) {
        if let Some(pg) = self.0 {
            sqlx::query(&format!("DROP TABLE IF EXISTS {}", pg.table()))
                .execute(pg.pool())
                .await
                .expect("drop test table");
        }
        if let Some(redis) = self.1 {
            drop_redis_keys(&redis).await;
        }
        if let Some((store, urls)) = self.2 {
            over_cluster_keys(&urls, store.prefix(), REDIS_DROP, 0).await;
        }
    }
}

/// Runs `script` (as [`over_redis_keys`]) on every master of the cluster at
/// `urls`, each over its own keys (a script may touch several slots of its
/// node when it says so: `allow-cross-slot-keys`).
pub async fn over_cluster_keys(urls: &[String], prefix: &str, script: &str, n: i64) {
    let script = redis::Script::new(&format!("#!lua flags=allow-cross-slot-keys\n{script}"));
    for mut conn in masters(urls).await {
        let _: () = script
            .arg(n)
            .arg(format!("{prefix}:*"))
            .invoke_async(&mut conn)
            .await
            .expect("a script over the test's keys on one master");
    }
}

/// A connection to each master among the cluster nodes at `urls`; a node
/// a test killed, and every replica, is skipped.
async fn masters(urls: &[String]) -> Vec<redis::aio::MultiplexedConnection> {
    let mut masters = Vec::new();
    for url in urls {
        let client = redis::Client::open(url.as_str()).expect("a node's URL");
        let Ok(mut conn) = client.get_multiplexed_async_connection().await else {
            continue;
        };
        let role: String = redis::cmd("INFO")
            .arg("replication")
            .query_async(&mut conn)
            .await
            .expect("a node's role");
        if role.contains("role:master") {
            masters.push(conn);
        }
    }
    masters
}

/// How many records a cluster store holds over every master.
pub async fn cluster_records(urls: &[String], prefix: &str) -> usize {
    let mut n = 0;
    for mut conn in masters(urls).await {
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{prefix}:{{b*}}:r:*"))
            .query_async(&mut conn)
            .await
            .expect("listing the test's keys");
        n += keys.len();
    }
    n
}

/// A cluster store on the shared cluster under a private prefix, with the
/// cluster's node URLs.
pub async fn cluster_store(prefix: &str) -> (RedisClusterStore, Vec<String>) {
    let urls = cluster::shared().await.urls();
    let nodes: Vec<&str> = urls.iter().map(String::as_str).collect();
    let store = RedisClusterStore::connect_volatile(&nodes)
        .await
        .expect("connecting to the test cluster")
        .with_prefix(prefix)
        .expect("valid prefix");
    (store, urls)
}

impl Harness {
    pub async fn memory() -> Self {
        let clock = Arc::new(ManualClock::new());
        Self {
            name: "memory",
            store: Arc::new(MemoryStore::with_clock(clock.clone())),
            clock,
            scope: unique("t"),
            pg: None,
            redis: None,
            cluster: None,
        }
    }

    /// Redis Cluster harness (the binary's shared cluster) under a private
    /// key prefix; drop its keys with [`Harness::cleanup`].
    pub async fn redis_cluster() -> Self {
        let (store, urls) = cluster_store(&unique("tc")).await;
        Self {
            name: "redis_cluster",
            store: Arc::new(store.clone()),
            clock: Arc::new(ManualClock::new()),
            scope: unique("t"),
            pg: None,
            redis: None,
            cluster: Some((store, urls)),
        }
    }

    /// How many records a Redis store (one node or a cluster) holds;
    /// `None` for the other stores.
    pub async fn redis_records(&self) -> Option<usize> {
        if let Some(redis) = &self.redis {
            return Some(redis_records(redis).await);
        }
        let (store, urls) = self.cluster.as_ref()?;
        Some(cluster_records(urls, store.prefix()).await)
    }

    /// Redis harness under a private key prefix; drop its keys with
    /// [`Harness::cleanup`].
    pub async fn redis() -> Self {
        let store = redis_store(&unique("tr")).await;
        Self {
            name: "redis",
            store: Arc::new(store.clone()),
            clock: Arc::new(ManualClock::new()),
            scope: unique("t"),
            pg: None,
            redis: Some(store),
            cluster: None,
        }
    }

    /// PostgreSQL harness on a private table; drop it with
    /// [`Harness::cleanup`].
    pub async fn postgres() -> Self {
        let store = pg_store(&unique("tower_idem_t_")).await;
        Self {
            name: "postgres",
            store: Arc::new(store.clone()),
            clock: Arc::new(ManualClock::new()),
            scope: unique("t"),
            pg: Some(store),
            redis: None,
            cluster: None,
        }
    }

    pub fn cleanup(&self) -> Cleanup {
        Cleanup(self.pg.clone(), self.redis.clone(), self.cluster.clone())
    }

    /// Moves this store's time forward by `by`: the manual clock of the
    /// memory store; for PostgreSQL and Redis, whose leases use the
    /// server's clock, every timestamp of the private table or prefix moves
    /// back instead.
    pub async fn advance(&self, by: Duration) {
        if let Some(redis) = &self.redis {
            let ms = i64::try_from(by.as_millis()).expect("a test's duration");
            return over_redis_keys(redis, REDIS_ADVANCE, ms).await;
        }
        if let Some((store, urls)) = &self.cluster {
            let ms = i64::try_from(by.as_millis()).expect("a test's duration");
            return over_cluster_keys(urls, store.prefix(), REDIS_ADVANCE, ms).await;
        }
        match &self.pg {
            None => self.clock.advance(by),
            Some(pg) => {
                sqlx::query(&format!(
                    "UPDATE {} SET created_at = created_at - make_interval(secs => $1), \
                     locked_at = locked_at - make_interval(secs => $1), \
                     stale_seen_at = stale_seen_at - make_interval(secs => $1), \
                     expires_at = expires_at - make_interval(secs => $1)",
                    pg.table()
                ))
                .bind(by.as_secs_f64())
                .execute(pg.pool())
                .await
                .expect("moving the test table's time");
            }
        }
    }

    /// A builder for a layer on this store whose scope is this test's unique
    /// scope plus the `x-tenant` request header.
    pub fn builder(&self) -> IdempotencyLayerBuilder {
        self.builder_over(self.store.clone())
    }

    /// [`Harness::builder`] over another store (a wrapper of this one).
    pub fn builder_over(&self, store: Arc<dyn IdempotencyStore>) -> IdempotencyLayerBuilder {
        let scope = self.scope.clone();
        IdempotencyLayer::builder_from_arc(store).scope_with(move |parts| {
            let tenant = parts
                .headers
                .get("x-tenant")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            format!("{scope}/{tenant}")
        })
    }

    /// The layer of [`Harness::builder`] with default settings.
    pub fn layer(&self) -> IdempotencyLayer {
        self.builder().build().expect("valid settings")
    }

    /// The default layer over a [`Faulty`] wrapper of this store, to wait
    /// for the store's events.
    pub fn watched_layer(&self) -> (IdempotencyLayer, Arc<Faulty>) {
        let store = Arc::new(Faulty::new(self.store.clone()));
        let layer = self
            .builder_over(store.clone())
            .build()
            .expect("valid settings");
        (layer, store)
    }

    /// A layer over `store` whose locks time out after 3 s and whose leases
    /// are extended every 5 ms: a test moves the store's clock past the lock
    /// timeout and waits for the extensions (see [`assert_lease_kept`]).
    pub fn heartbeat_layer(&self, store: Arc<Faulty>) -> IdempotencyLayer {
        self.builder_over(store)
            .lock_timeout(Duration::from_secs(3))
            .heartbeat_every(Duration::from_millis(5))
            .build()
            .expect("valid settings")
    }

    /// The scope the layer stores a request of `tenant` under.
    pub fn stored_scope(&self, tenant: &str) -> String {
        let parts = Request::post("/payments")
            .header("x-tenant", tenant)
            .body(())
            .expect("valid request")
            .into_parts()
            .0;
        self.layer().stored_scope(&parts)
    }
}

/// Shared state of the test application.
#[derive(Clone, Default)]
pub struct AppState {
    /// Number of times the POST handler ran.
    pub runs: Arc<AtomicUsize>,
    /// Signalled when a handler with `x-wait` has started.
    pub started: Arc<Notify>,
    /// Handlers with `x-wait` wait for this.
    pub proceed: Arc<Notify>,
}

impl AppState {
    pub fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }
}

/// `POST /payments` (also `PUT`, `PATCH`, `GET`): counts its runs and answers
/// `x-status` (default 201) with a JSON body `{"run": n, "body": "..."}`.
/// Behaviour switches (request headers, not part of the fingerprint):
/// `x-status: N`, `x-size: N` (body of N bytes), `x-wait` (wait for
/// `proceed`), `x-panic`.
async fn handler(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    let run = state.runs.fetch_add(1, Ordering::SeqCst) + 1;
    let get = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if get("x-panic").is_some() {
        panic!("handler panicked on purpose");
    }
    if get("x-wait").is_some() {
        let proceed = state.proceed.notified();
        state.started.notify_one();
        proceed.await;
    }
    let status = get("x-status")
        .and_then(|v| v.parse().ok())
        .and_then(|v| StatusCode::from_u16(v).ok())
        .unwrap_or(StatusCode::CREATED);
    if let Some(size) = get("x-size").and_then(|v| v.parse::<usize>().ok()) {
        return (status, "x".repeat(size)).into_response();
    }
    let json = serde_json::json!({"run": run, "body": String::from_utf8_lossy(&body)});
    (
        status,
        [
            ("content-type", "application/json"),
            ("x-extra", "not-stored"),
        ],
        json.to_string(),
    )
        .into_response()
}

pub fn app(layer: IdempotencyLayer) -> (Router, AppState) {
    let state = AppState::default();
    let router = Router::new()
        .route(
            "/payments",
            routing::post(handler)
                .put(handler)
                .patch(handler)
                .get(handler)
                .delete(handler),
        )
        .with_state(state.clone())
        .layer(layer);
    (router, state)
}

/// Builds a request: `method uri`, optional key, body, extra headers.
pub fn req(
    method: &str,
    uri: &str,
    key: Option<&str>,
    body: &str,
    headers: &[(&str, &str)],
) -> Request<Body> {
    let mut builder = Request::builder().method(method).uri(uri);
    if let Some(key) = key {
        builder = builder.header("idempotency-key", key);
    }
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    builder
        .body(Body::from(body.to_owned()))
        .expect("valid request")
}

pub fn post(key: &str, body: &str) -> Request<Body> {
    req("POST", "/payments", Some(key), body, &[])
}

/// Sends `POST /payments` with `key` and `body` from a task of its own; its
/// handler (`x-wait`) signals `started` and waits for `proceed`.
pub fn spawn_waiting(router: &Router, key: &str, body: &str) -> tokio::task::JoinHandle<Reply> {
    let router = router.clone();
    let request = req("POST", "/payments", Some(key), body, &[("x-wait", "1")]);
    tokio::spawn(async move { send(&router, request).await })
}

/// A response with its body collected.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).expect("JSON body")
    }

    pub fn replayed(&self) -> bool {
        self.headers
            .get("idempotent-replayed")
            .map(|v| v == "true")
            .unwrap_or(false)
    }

    /// Asserts an RFC 9457 problem document with the given status.
    pub fn assert_problem(&self, status: u16) -> serde_json::Value {
        assert_eq!(self.status.as_u16(), status, "body: {:?}", self.body);
        assert_eq!(self.headers["content-type"], "application/problem+json");
        let doc = self.json();
        assert_eq!(doc["status"], status);
        for field in ["type", "title", "detail"] {
            assert!(doc[field].is_string(), "problem without {field}: {doc}");
        }
        doc
    }
}

pub async fn send(router: &Router, request: Request<Body>) -> Reply {
    let response = router.clone().oneshot(request).await.expect("infallible");
    let (parts, body) = response.into_parts();
    let body = body.collect().await.expect("body").to_bytes();
    Reply {
        status: parts.status,
        headers: parts.headers,
        body,
    }
}

/// A store clock that follows tokio's (paused, in tests): the store's
/// lease times and the layer's move together.
#[derive(Debug)]
pub struct TokioClock {
    start: (std::time::SystemTime, tokio::time::Instant),
}

impl TokioClock {
    pub fn new() -> Self {
        Self {
            start: (std::time::SystemTime::now(), tokio::time::Instant::now()),
        }
    }
}

impl tower_idempotency::Clock for TokioClock {
    fn now(&self) -> std::time::SystemTime {
        self.start.0 + self.start.1.elapsed()
    }
}

/// A store wrapper that counts lease extensions and can simulate faults.
pub struct Faulty {
    pub inner: Arc<dyn IdempotencyStore>,
    /// Number of `extend_lease` calls that reached the inner store.
    pub extends: AtomicUsize,
    /// Number of `extend_lease` calls that failed for being cut off.
    pub extends_failed: AtomicUsize,
    /// Extensions of this key never return (a store call that stalls).
    pub stalled_key: Option<&'static str>,
    /// Number of extensions of `stalled_key` that began (and never ended).
    pub stalled: AtomicUsize,
    /// The next extension of this key panics (taken when it does).
    pub panic_next_extend: std::sync::Mutex<Option<&'static str>>,
    /// When set, `extend_lease` does nothing (a replica that is dead or cut
    /// off: its lease is never extended).
    pub no_heartbeat: bool,
    /// The next this-many `complete` calls fail.
    pub failing_completes: AtomicUsize,
    /// Number of `complete` calls.
    pub completes: AtomicUsize,
    /// Number of `complete` calls that returned (stored, or failed).
    pub settled: AtomicUsize,
    /// The next this-many `release` calls fail (transient).
    pub failing_releases: AtomicUsize,
    /// Number of `release` calls.
    pub releases: AtomicUsize,
    /// How long an extension's answer takes to come back after the store
    /// made it (a slow network).
    pub extend_reply_delay: Duration,
    /// While set, every call fails with a transient error: this replica
    /// is cut off from the store (the others, through other wrappers, are
    /// not).
    pub cut_off: std::sync::atomic::AtomicBool,
    /// Woken whenever `extends` or `settled` moves, so tests wait for an
    /// event instead of sleeping and polling.
    changed: tokio::sync::Notify,
}

impl Faulty {
    pub fn new(inner: Arc<dyn IdempotencyStore>) -> Self {
        Self {
            inner,
            extends: AtomicUsize::new(0),
            extends_failed: AtomicUsize::new(0),
            stalled_key: None,
            stalled: AtomicUsize::new(0),
            panic_next_extend: std::sync::Mutex::new(None),
            no_heartbeat: false,
            failing_completes: AtomicUsize::new(0),
            completes: AtomicUsize::new(0),
            settled: AtomicUsize::new(0),
            failing_releases: AtomicUsize::new(0),
            releases: AtomicUsize::new(0),
            cut_off: std::sync::atomic::AtomicBool::new(false),
            extend_reply_delay: Duration::ZERO,
            changed: tokio::sync::Notify::new(),
        }
    }

    /// `Err` (transient) while this replica is cut off from the store.
    fn reachable(&self) -> Result<(), tower_idempotency::StoreError> {
        if self.cut_off.load(Ordering::SeqCst) {
            return Err(tower_idempotency::StoreError::msg("cut off from the store").transient());
        }
        Ok(())
    }

    /// Waits (bounded) until `n` more leases were extended than `since`.
    pub async fn wait_extends(&self, since: usize, n: usize) {
        self.wait_for(&self.extends, since + n, "the lease was never extended")
            .await;
    }

    /// Waits (bounded) until `n` extensions of `stalled_key` have begun.
    pub async fn wait_stalled(&self, n: usize) {
        self.wait_for(&self.stalled, n, "the stalled lease was never extended")
            .await;
    }

    /// Waits (bounded) until `n` `complete` calls have returned: the
    /// handler's response (or its marker) is in the store.
    pub async fn wait_settled(&self, n: usize) {
        self.wait_for(&self.settled, n, "the response was never stored")
            .await;
    }

    /// Waits for `counter` to reach `target`, woken by the store itself; the
    /// timeout only bounds a test that would otherwise hang.
    async fn wait_for(&self, counter: &AtomicUsize, target: usize, never: &str) {
        let reached = async {
            loop {
                let changed = self.changed.notified();
                tokio::pin!(changed);
                // Registered before the check, so no wake-up is missed.
                changed.as_mut().enable();
                if counter.load(Ordering::SeqCst) >= target {
                    return;
                }
                changed.await;
            }
        };
        if tokio::time::timeout(Duration::from_secs(10), reached)
            .await
            .is_err()
        {
            panic!("{never}");
        }
    }
}

#[async_trait::async_trait]
impl IdempotencyStore for Faulty {
    async fn claim(
        &self,
        request: tower_idempotency::ClaimRequest<'_>,
    ) -> Result<tower_idempotency::ClaimOutcome, tower_idempotency::StoreError> {
        self.reachable()?;
        self.inner.claim(request).await
    }
    async fn lookup(
        &self,
        scope: &str,
        key: &str,
        fingerprint: tower_idempotency::Fingerprint,
    ) -> Result<Option<tower_idempotency::ClaimOutcome>, tower_idempotency::StoreError> {
        self.reachable()?;
        self.inner.lookup(scope, key, fingerprint).await
    }
    async fn complete(
        &self,
        scope: &str,
        key: &str,
        lease: tower_idempotency::LeaseToken,
        response: &tower_idempotency::StoredResponse,
    ) -> Result<bool, tower_idempotency::StoreError> {
        self.completes.fetch_add(1, Ordering::SeqCst);
        let fail = self
            .failing_completes
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        let result = if fail {
            Err(tower_idempotency::StoreError::msg("injected failure").transient())
        } else if let Err(err) = self.reachable() {
            Err(err)
        } else {
            self.inner.complete(scope, key, lease, response).await
        };
        self.settled.fetch_add(1, Ordering::SeqCst);
        self.changed.notify_waiters();
        result
    }
    async fn extend_lease(
        &self,
        scope: &str,
        key: &str,
        lease: tower_idempotency::LeaseToken,
    ) -> Result<bool, tower_idempotency::StoreError> {
        if self.no_heartbeat {
            return Ok(true);
        }
        if let Err(err) = self.reachable() {
            self.extends_failed.fetch_add(1, Ordering::SeqCst);
            self.changed.notify_waiters();
            return Err(err);
        }
        if self.stalled_key == Some(key) {
            self.stalled.fetch_add(1, Ordering::SeqCst);
            self.changed.notify_waiters();
            return std::future::pending().await;
        }
        let panic_now = {
            let mut next = self
                .panic_next_extend
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            next.take_if(|k| *k == key).is_some()
        };
        if panic_now {
            panic!("extending the lease panicked on purpose");
        }
        let extended = self.inner.extend_lease(scope, key, lease).await;
        tokio::time::sleep(self.extend_reply_delay).await;
        self.extends.fetch_add(1, Ordering::SeqCst);
        self.changed.notify_waiters();
        extended
    }
    async fn release(
        &self,
        scope: &str,
        key: &str,
        lease: tower_idempotency::LeaseToken,
    ) -> Result<bool, tower_idempotency::StoreError> {
        self.releases.fetch_add(1, Ordering::SeqCst);
        let fail = self
            .failing_releases
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if fail {
            return Err(tower_idempotency::StoreError::msg("injected failure").transient());
        }
        self.reachable()?;
        self.inner.release(scope, key, lease).await
    }
    async fn sweep_expired(&self) -> Result<u64, tower_idempotency::StoreError> {
        self.inner.sweep_expired().await
    }
}

/// Moves the store's clock far past the lock timeout `times` times while the
/// handler of `key` runs: each time its lease is extended all the same (two
/// extensions, so at least one began after the clock moved), and a
/// duplicate is told to wait (409), never run.
pub async fn assert_lease_kept(
    h: &Harness,
    store: &Faulty,
    router: &Router,
    key: &str,
    times: usize,
) {
    for _ in 0..times {
        h.advance(Duration::from_secs(10)).await;
        store
            .wait_extends(store.extends.load(Ordering::SeqCst), 2)
            .await;
        send(router, post(key, "a")).await.assert_problem(409);
    }
}

/// A response body whose stream panics when read; with `on_drop`, its
/// destructor panics too (two panics at once would abort the process).
pub struct PanickingBody {
    pub on_drop: bool,
}

impl http_body::Body for PanickingBody {
    type Data = Bytes;
    type Error = std::io::Error;
    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, std::io::Error>>> {
        panic!("response body panicked on purpose")
    }
}

impl Drop for PanickingBody {
    fn drop(&mut self) {
        if self.on_drop {
            panic!("response body panicked on drop on purpose")
        }
    }
}
