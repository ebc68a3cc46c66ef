//! Load generator: what the idempotency layer costs a real HTTP server.
//!
//! ```text
//! cargo run --release -p tower-idempotency --example loadgen -- \
//!     --modes none,memory,pg-none,pg-two-phase,pg-transactional \
//!     --clients 1,32 --seconds 5 --warmup 1 --rounds 3
//! ```
//!
//! Each measurement starts an axum server on `127.0.0.1:0` in a server
//! runtime of its own (2 worker threads) and drives it from a separate client
//! runtime with C concurrent clients, each on one keep-alive HTTP/1.1
//! connection, each request a `POST /pay` with a small JSON body and a fresh
//! unique `Idempotency-Key`. Requests started during the warm-up are not
//! recorded; the others are, by latency (send to last body byte). Modes:
//!
//! * `none`: a trivial handler answering `201` with a small JSON body;
//! * `memory`: the same handler behind `IdempotencyLayer` over `MemoryStore`;
//! * `pg-none`: a handler inserting one row (autocommit, pooled), no layer;
//! * `pg-tx-none`: the same insert in a transaction of the handler's own
//!   (`BEGIN`, `INSERT`, `COMMIT`), no layer: what any design that commits
//!   the handler's write together with something else pays before the
//!   layer adds its claim and its stored response;
//! * `pg-two-phase`: that handler behind the layer over `PostgresStore`;
//! * `pg-two-phase-in-tx`: the same layer; the handler inserts its row and
//!   completes its key in one transaction of its own
//!   (`PostgresStore::commit_completed`): two commits a request, the
//!   claim's and the handler's, and no completion call of the layer's;
//! * `pg-transactional`: the handler inserting its row through the request's
//!   `IdempotencyTransaction`, behind `IdempotencyLayer::transactional`;
//! * `redis`: the trivial handler behind `IdempotencyLayer` over
//!   `RedisStore` (`REDIS_URL`, default `redis://127.0.0.1:6379`, keys under
//!   the prefix `loadgen`, kept a minute), compared with `none`;
//! * `redis-floor`: no layer; the trivial handler makes the two round trips
//!   a keyed request needs at the least (a claim, then the response kept:
//!   two `SET … PX 60000` of its own): what any Redis-backed idempotency
//!   pays before doing anything else, compared with `none`.
//!
//! Rounds are interleaved (round r runs every client count × every mode,
//! the mode order reversed on odd rounds), and every server is fresh (a new
//! `MemoryStore`; the PostgreSQL tables truncated), so the ratio of a layer
//! mode to its no-layer mode (`memory`/`none`, `pg-*`/`pg-none`) is paired
//! within one round. The summary gives medians over rounds and each round's
//! ratio. Beside req/s, the CPU time the server runtime's threads used per
//! recorded request (Linux, from `/proc/self/task/*/schedstat`; time the
//! hypervisor stole from the VM is not in it), and its ratio to the
//! baseline's (baseline CPU / mode CPU: 1 means the layer costs nothing): on
//! a shared machine whose speed swings, the paired CPU ratio moves much
//! less than the throughput ratio. For the PostgreSQL modes it leaves out
//! the database's own CPU. Answers other than 2xx are counted and printed: a benchmark that
//! silently measures 409s or 5xx measures the wrong thing.
//!
//! PostgreSQL: `DATABASE_URL` (default `postgres://postgres@127.0.0.1/test`),
//! tables `loadgen_payments` and `loadgen_keys`, a pool of `--pool`
//! connections shared by the handler and the store.

mod support;
use support::median;

use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::routing::post;
use axum::{Extension, Router};
use clap::Parser;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Runtime;
use tokio::sync::oneshot;
use tower_idempotency::{
    IdempotencyContext, IdempotencyLayer, IdempotencyTransaction, MemoryStore, PostgresStore,
    RedisStore, StoredResponse, IDEMPOTENCY_KEY,
};

const RESPONSE: &str = r#"{"id":"pay_1","status":"paid"}"#;
const REQUEST: &str = r#"{"amount":1234,"currency":"eur"}"#;
const PAYMENTS: &str = "loadgen_payments";
const KEYS: &str = "loadgen_keys";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    None,
    /// Diagnostic: the trivial handler, awaiting one empty spawned task (the
    /// hand-over between tasks the layer used to make), no layer.
    NoneSpawn,
    Memory,
    PgNone,
    /// Diagnostic: the insert in a transaction of the handler's own.
    PgTxNone,
    PgTwoPhase,
    /// The two-phase layer; the handler completes its key in its own
    /// transaction (`commit_completed`): two commits a request.
    PgTwoPhaseInTx,
    PgTransactional,
    Redis,
    /// Baseline: two round trips to Redis, no layer.
    RedisFloor,
}

impl Mode {
    const ALL: [Mode; 10] = [
        Mode::None,
        Mode::NoneSpawn,
        Mode::Memory,
        Mode::PgNone,
        Mode::PgTxNone,
        Mode::PgTwoPhase,
        Mode::PgTwoPhaseInTx,
        Mode::PgTransactional,
        Mode::Redis,
        Mode::RedisFloor,
    ];

    fn name(self) -> &'static str {
        match self {
            Mode::None => "none",
            Mode::NoneSpawn => "none-spawn",
            Mode::Memory => "memory",
            Mode::PgNone => "pg-none",
            Mode::PgTxNone => "pg-tx-none",
            Mode::PgTwoPhase => "pg-two-phase",
            Mode::PgTwoPhaseInTx => "pg-two-phase-in-tx",
            Mode::PgTransactional => "pg-transactional",
            Mode::Redis => "redis",
            Mode::RedisFloor => "redis-floor",
        }
    }

    /// The no-layer mode this one is compared with.
    fn baseline(self) -> Option<Mode> {
        match self {
            Mode::None | Mode::PgNone => None,
            Mode::Memory | Mode::NoneSpawn | Mode::Redis | Mode::RedisFloor => Some(Mode::None),
            Mode::PgTxNone | Mode::PgTwoPhase | Mode::PgTwoPhaseInTx | Mode::PgTransactional => {
                Some(Mode::PgNone)
            }
        }
    }

    fn needs_pg(self) -> bool {
        matches!(
            self,
            Mode::PgNone
                | Mode::PgTxNone
                | Mode::PgTwoPhase
                | Mode::PgTwoPhaseInTx
                | Mode::PgTransactional
        )
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Mode::ALL
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| {
                let names: Vec<_> = Mode::ALL.iter().map(|m| m.name()).collect();
                format!("unknown mode {s:?}; expected one of {}", names.join(","))
            })
    }
}

#[derive(Parser, Debug)]
#[command(about = "Req/s and latency of a POST handler with and without the idempotency layer")]
struct Args {
    /// Modes to run, comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "none,memory,pg-none,pg-two-phase,pg-transactional"
    )]
    modes: Vec<Mode>,
    /// Concurrent clients (one keep-alive connection each), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,32")]
    clients: Vec<usize>,
    /// Measured seconds per mode and client count.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Unrecorded warm-up seconds before each measurement.
    #[arg(long, default_value_t = 1.0)]
    warmup: f64,
    /// Interleaved rounds.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// PostgreSQL pool size (shared by the handler and the store).
    #[arg(long, default_value_t = 10)]
    pool: u32,
    /// Make every commit of the benchmark's PostgreSQL connections wait this
    /// many microseconds before its WAL flush (`commit_delay`, with
    /// `commit_siblings = 0`; needs a superuser): emulates a disk, or a
    /// synchronous standby, whose flush costs that much more than this
    /// machine's. 0 (the default) leaves the server's settings alone.
    #[arg(long, default_value_t = 0)]
    commit_delay_us: u32,
    /// Worker threads of the client runtime (the server always has 2).
    #[arg(long, default_value_t = 2)]
    client_threads: usize,
    /// Build the PostgreSQL pool with `test_before_acquire(false)`: no ping
    /// (a round trip) each time a connection is taken from the pool. sqlx
    /// pings by default, and again, in the background, each time one is
    /// given back.
    #[arg(long)]
    no_test_before_acquire: bool,
}

/// One measurement.
#[derive(Clone, Debug)]
struct Sample {
    rps: f64,
    /// CPU time of the server runtime's threads per recorded request
    /// (`None` where the kernel does not tell).
    server_cpu: Option<Duration>,
    p50: Duration,
    p99: Duration,
    ok: u64,
    non_2xx: u64,
    errors: u64,
}

/// The trivial handler: reads the body, answers `201` with a small JSON body.
async fn pay_plain(_body: Bytes) -> Answer {
    created()
}

/// The trivial handler after a hand-over to a spawned task and back.
async fn pay_spawn(_body: Bytes) -> Answer {
    let _ = tokio::spawn(async {}).await;
    created()
}

/// The trivial handler after two writes to Redis of its own, one round
/// trip each.
async fn pay_redis_floor(
    State(mut conn): State<redis::aio::ConnectionManager>,
    headers: HeaderMap,
    body: Bytes,
) -> Answer {
    let key = format!("loadgen:floor:{}", key_of(&headers));
    for value in [&body[..], RESPONSE.as_bytes()] {
        let set: redis::RedisResult<()> = redis::cmd("SET")
            .arg(&key)
            .arg(value)
            .arg("PX")
            .arg(60_000)
            .query_async(&mut conn)
            .await;
        if let Err(err) = set {
            eprintln!("redis set: {err}");
            return failed();
        }
    }
    created()
}

fn insert_sql() -> String {
    format!("INSERT INTO {PAYMENTS} (key, body) VALUES ($1, $2)")
}

fn key_of(headers: &HeaderMap) -> String {
    headers
        .get(IDEMPOTENCY_KEY)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned()
}

type Answer = (
    StatusCode,
    [(header::HeaderName, &'static str); 1],
    &'static str,
);

fn created() -> Answer {
    (
        StatusCode::CREATED,
        [(header::CONTENT_TYPE, "application/json")],
        RESPONSE,
    )
}

fn failed() -> Answer {
    (
        StatusCode::INTERNAL_SERVER_ERROR,
        [(header::CONTENT_TYPE, "text/plain")],
        "insert failed",
    )
}

async fn pay_pg(State(pool): State<PgPool>, headers: HeaderMap, body: Bytes) -> Answer {
    let body = String::from_utf8_lossy(&body).into_owned();
    match sqlx::query(&insert_sql())
        .bind(key_of(&headers))
        .bind(body)
        .execute(&pool)
        .await
    {
        Ok(_) => created(),
        Err(err) => {
            eprintln!("pg insert: {err}");
            failed()
        }
    }
}

async fn pay_pg_own_tx(State(pool): State<PgPool>, headers: HeaderMap, body: Bytes) -> Answer {
    let body = String::from_utf8_lossy(&body).into_owned();
    let insert = async {
        let mut tx = pool.begin().await?;
        sqlx::query(&insert_sql())
            .bind(key_of(&headers))
            .bind(body)
            .execute(&mut *tx)
            .await?;
        tx.commit().await
    };
    match insert.await {
        Ok(()) => created(),
        Err(err) => {
            eprintln!("pg insert in the handler's transaction: {err}");
            failed()
        }
    }
}

/// Inserts the row and completes the key in one transaction of the
/// handler's own: the row and the stored response commit together.
async fn pay_pg_complete_in_tx(
    State(store): State<PostgresStore>,
    Extension(ctx): Extension<IdempotencyContext>,
    headers: HeaderMap,
    body: Bytes,
) -> Answer {
    let body = String::from_utf8_lossy(&body).into_owned();
    let response = StoredResponse {
        status: 201,
        headers: vec![("content-type".to_owned(), "application/json".to_owned())],
        body: Bytes::from_static(RESPONSE.as_bytes()),
    };
    let insert = async {
        let mut tx = store.pool().begin().await?;
        sqlx::query(&insert_sql())
            .bind(key_of(&headers))
            .bind(body)
            .execute(&mut *tx)
            .await?;
        let completed = store.commit_completed(tx, &ctx, &response).await?;
        Ok::<_, Box<dyn std::error::Error>>(completed)
    };
    match insert.await {
        Ok(true) => created(),
        Ok(false) => {
            eprintln!("commit_completed: the lease was taken over");
            failed()
        }
        Err(err) => {
            eprintln!("pg insert and completion in the handler's transaction: {err}");
            failed()
        }
    }
}

async fn pay_pg_tx(
    Extension(tx): Extension<IdempotencyTransaction>,
    headers: HeaderMap,
    body: Bytes,
) -> Answer {
    let body = String::from_utf8_lossy(&body).into_owned();
    let mut conn = match tx.lock().await {
        Ok(conn) => conn,
        Err(err) => {
            eprintln!("transaction: {err}");
            return failed();
        }
    };
    match sqlx::query(&insert_sql())
        .bind(key_of(&headers))
        .bind(body)
        .execute(&mut **conn)
        .await
    {
        Ok(_) => created(),
        Err(err) => {
            eprintln!("pg insert in transaction: {err}");
            failed()
        }
    }
}

fn router(
    mode: Mode,
    pg: Option<&PostgresStore>,
    redis: Option<&RedisStore>,
) -> Result<Router, String> {
    let need = || {
        pg.cloned()
            .ok_or_else(|| "PostgreSQL not connected".to_owned())
    };
    Ok(match mode {
        Mode::Redis => {
            let store = redis
                .cloned()
                .ok_or_else(|| "Redis not connected".to_owned())?;
            let layer = IdempotencyLayer::builder(store)
                .expiry(Duration::from_secs(60))
                .build()
                .map_err(|e| e.to_string())?;
            Router::new().route("/pay", post(pay_plain)).layer(layer)
        }
        Mode::RedisFloor => {
            let store = redis
                .cloned()
                .ok_or_else(|| "Redis not connected".to_owned())?;
            Router::new()
                .route("/pay", post(pay_redis_floor))
                .with_state(store.connection())
        }
        Mode::None => Router::new().route("/pay", post(pay_plain)),
        Mode::NoneSpawn => Router::new().route("/pay", post(pay_spawn)),
        Mode::Memory => Router::new()
            .route("/pay", post(pay_plain))
            .layer(IdempotencyLayer::new(MemoryStore::new())),
        Mode::PgNone => {
            let store = need()?;
            Router::new()
                .route("/pay", post(pay_pg))
                .with_state(store.pool().clone())
        }
        Mode::PgTxNone => {
            let store = need()?;
            Router::new()
                .route("/pay", post(pay_pg_own_tx))
                .with_state(store.pool().clone())
        }
        Mode::PgTwoPhase => {
            let store = need()?;
            Router::new()
                .route("/pay", post(pay_pg))
                .with_state(store.pool().clone())
                .layer(IdempotencyLayer::new(store))
        }
        Mode::PgTwoPhaseInTx => {
            let store = need()?;
            Router::new()
                .route("/pay", post(pay_pg_complete_in_tx))
                .with_state(store.clone())
                .layer(IdempotencyLayer::new(store))
        }
        Mode::PgTransactional => {
            let store = need()?;
            let layer = IdempotencyLayer::transactional(store)
                .build()
                .map_err(|e| e.to_string())?;
            Router::new().route("/pay", post(pay_pg_tx)).layer(layer)
        }
    })
}

async fn connect_pg(
    pool_size: u32,
    commit_delay_us: u32,
    test_before_acquire: bool,
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

async fn truncate(store: &PostgresStore) -> Result<(), String> {
    sqlx::query(&format!("TRUNCATE {PAYMENTS}, {KEYS}"))
        .execute(store.pool())
        .await
        .map(|_| ())
        .map_err(|e| format!("truncating the loadgen tables: {e}"))
}

/// What one client saw.
#[derive(Default)]
struct ClientLog {
    latencies: Vec<Duration>,
    non_2xx: u64,
    errors: u64,
}

/// One client: a keep-alive connection sending keyed POSTs until `stop`;
/// records requests started after `record_from`.
async fn client(
    addr: SocketAddr,
    id: usize,
    run: String,
    record_from: Instant,
    stop: Arc<AtomicBool>,
) -> ClientLog {
    let mut log = ClientLog::default();
    let stream = match TcpStream::connect(addr).await {
        Ok(s) => s,
        Err(err) => {
            eprintln!("client {id}: connect: {err}");
            log.errors += 1;
            return log;
        }
    };
    let _ = stream.set_nodelay(true);
    let (mut sender, conn) = match hyper::client::conn::http1::handshake(TokioIo::new(stream)).await
    {
        Ok(pair) => pair,
        Err(err) => {
            eprintln!("client {id}: handshake: {err}");
            log.errors += 1;
            return log;
        }
    };
    tokio::spawn(conn);
    let body = Bytes::from_static(REQUEST.as_bytes());
    let mut n: u64 = 0;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let request = hyper::Request::post("/pay")
            .header(header::HOST, "127.0.0.1")
            .header(header::CONTENT_TYPE, "application/json")
            .header(IDEMPOTENCY_KEY, format!("{run}-{id}-{n}"))
            .body(Full::new(body.clone()));
        let Ok(request) = request else {
            log.errors += 1;
            break;
        };
        if sender.ready().await.is_err() {
            log.errors += 1;
            break;
        }
        let start = Instant::now();
        let status = match sender.send_request(request).await {
            Ok(response) => {
                let status = response.status();
                if response.into_body().collect().await.is_err() {
                    log.errors += 1;
                    break;
                }
                status
            }
            Err(err) => {
                eprintln!("client {id}: request: {err}");
                log.errors += 1;
                break;
            }
        };
        if start >= record_from {
            log.latencies.push(start.elapsed());
            if !status.is_success() {
                log.non_2xx += 1;
            }
        }
    }
    log
}

/// CPU time used so far by this process's threads named `name` (Linux:
/// `/proc/self/task/*/schedstat`, in nanoseconds; time the hypervisor
/// stole is not in it, so it moves less with a noisy neighbour than
/// throughput does); `None` where that is not available.
fn threads_cpu(name: &str) -> Option<Duration> {
    let mut total = 0u64;
    for entry in std::fs::read_dir("/proc/self/task").ok()? {
        let dir = entry.ok()?.path();
        let Ok(comm) = std::fs::read_to_string(dir.join("comm")) else {
            continue; // the thread ended meanwhile
        };
        if comm.trim_end() != name {
            continue;
        }
        let Ok(stat) = std::fs::read_to_string(dir.join("schedstat")) else {
            continue;
        };
        total += stat.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(Duration::from_nanos(total))
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

fn measure(
    server_rt: &Runtime,
    client_rt: &Runtime,
    app: Router,
    clients: usize,
    args: &Args,
) -> Result<Sample, String> {
    let listener = server_rt
        .block_on(TcpListener::bind("127.0.0.1:0"))
        .map_err(|e| format!("bind: {e}"))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let (stop_server, stopped) = oneshot::channel::<()>();
    let server = server_rt.spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                let _ = stopped.await;
            })
            .await
    });

    let warmup = Duration::from_secs_f64(args.warmup);
    let seconds = Duration::from_secs_f64(args.seconds);
    let run = uuid::Uuid::new_v4().simple().to_string();
    let (logs, server_cpu): (Vec<ClientLog>, _) = client_rt.block_on(async {
        let start = Instant::now();
        let record_from = start + warmup;
        let stop = Arc::new(AtomicBool::new(false));
        let tasks: Vec<_> = (0..clients)
            .map(|id| tokio::spawn(client(addr, id, run.clone(), record_from, stop.clone())))
            .collect();
        tokio::time::sleep_until(record_from.into()).await;
        let cpu_from = threads_cpu("server");
        tokio::time::sleep(seconds).await;
        let cpu = cpu_from
            .zip(threads_cpu("server"))
            .map(|(a, b)| b.saturating_sub(a));
        stop.store(true, Ordering::Relaxed);
        let mut logs = Vec::new();
        for t in tasks {
            logs.push(t.await.unwrap_or_default());
        }
        (logs, cpu)
    });
    let _ = stop_server.send(());
    let _ =
        server_rt.block_on(async { tokio::time::timeout(Duration::from_secs(5), server).await });

    let mut all: Vec<Duration> = logs
        .iter()
        .flat_map(|l| l.latencies.iter().copied())
        .collect();
    all.sort_unstable();
    let non_2xx: u64 = logs.iter().map(|l| l.non_2xx).sum();
    let errors: u64 = logs.iter().map(|l| l.errors).sum();
    let count = all.len() as u64;
    Ok(Sample {
        rps: count as f64 / seconds.as_secs_f64(),
        server_cpu: server_cpu
            .filter(|_| count > 0)
            .map(|cpu| cpu / u32::try_from(count).unwrap_or(u32::MAX)),
        p50: percentile(&all, 0.50),
        p99: percentile(&all, 0.99),
        ok: count - non_2xx,
        non_2xx,
        errors,
    })
}

fn micros(d: Duration) -> String {
    format!("{:.0} µs", d.as_secs_f64() * 1e6)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    if args.modes.is_empty() || args.clients.is_empty() || args.rounds == 0 {
        return Err("nothing to run: give at least one mode, client count and round".into());
    }
    let server_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("server")
        .enable_all()
        .build()?;
    let client_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.client_threads.max(1))
        .thread_name("client")
        .enable_all()
        .build()?;

    let pg = if args.modes.iter().any(|m| m.needs_pg()) {
        Some(server_rt.block_on(connect_pg(
            args.pool,
            args.commit_delay_us,
            !args.no_test_before_acquire,
        ))?)
    } else {
        None
    };
    let redis = if args.modes.contains(&Mode::Redis) || args.modes.contains(&Mode::RedisFloor) {
        let url =
            std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
        let store = server_rt
            .block_on(RedisStore::connect_volatile(&url))
            .map_err(|e| format!("Redis is not reachable at REDIS_URL={url}: {e}"))?
            .with_prefix("loadgen")
            .map_err(|e| e.to_string())?;
        Some(store)
    } else {
        None
    };

    println!(
        "loadgen: modes {}, clients {:?}, {} s measured after {} s warm-up, {} rounds, \
         server runtime 2 workers, client runtime {} workers{}",
        args.modes
            .iter()
            .map(|m| m.name())
            .collect::<Vec<_>>()
            .join(","),
        args.clients,
        args.seconds,
        args.warmup,
        args.rounds,
        args.client_threads,
        if pg.is_some() {
            let delay = if args.commit_delay_us > 0 {
                format!(", commit_delay {} µs", args.commit_delay_us)
            } else {
                String::new()
            };
            let ping = if args.no_test_before_acquire {
                ", no ping before acquire"
            } else {
                ""
            };
            format!(", PostgreSQL pool {}{delay}{ping}", args.pool)
        } else {
            String::new()
        }
    );

    // results[round][(mode, clients)]
    let mut results: Vec<Vec<(Mode, usize, Sample)>> = Vec::new();
    for round in 0..args.rounds {
        let mut modes = args.modes.clone();
        if round % 2 == 1 {
            modes.reverse();
        }
        let mut this_round = Vec::new();
        for &clients in &args.clients {
            for &mode in &modes {
                if let Some(store) = &pg {
                    server_rt.block_on(truncate(store))?;
                }
                let app = router(mode, pg.as_ref(), redis.as_ref())?;
                let sample = measure(&server_rt, &client_rt, app, clients, &args)?;
                this_round.push((mode, clients, sample));
            }
        }
        println!("\n### Round {}\n", round + 1);
        print_round(&this_round, &args);
        results.push(this_round);
    }

    println!("\n### Summary: medians over {} rounds\n", args.rounds);
    println!(
        "| mode | clients | req/s | p50 | p99 | non-2xx | ratio (median) | ratio per round | \
         server CPU µs/req | CPU ratio (median) |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---|---:|---:|");
    for &clients in &args.clients {
        for &mode in &args.modes {
            let samples: Vec<&Sample> = results
                .iter()
                .filter_map(|r| {
                    r.iter()
                        .find(|(m, c, _)| *m == mode && *c == clients)
                        .map(|(_, _, s)| s)
                })
                .collect();
            let rps = median(samples.iter().map(|s| s.rps).collect());
            let p50 = median(samples.iter().map(|s| s.p50.as_secs_f64()).collect());
            let p99 = median(samples.iter().map(|s| s.p99.as_secs_f64()).collect());
            let non_2xx: u64 = samples.iter().map(|s| s.non_2xx + s.errors).sum();
            let ratios: Vec<f64> = results
                .iter()
                .filter_map(|r| ratio(r, mode, clients))
                .collect();
            let (ratio_median, per_round) = if ratios.is_empty() {
                ("—".to_owned(), "—".to_owned())
            } else {
                (
                    format!("{:.3}", median(ratios.clone())),
                    ratios
                        .iter()
                        .map(|r| format!("{r:.3}"))
                        .collect::<Vec<_>>()
                        .join(", "),
                )
            };
            let cpus: Vec<f64> = samples
                .iter()
                .filter_map(|s| s.server_cpu.map(|c| c.as_secs_f64() * 1e6))
                .collect();
            let cpu = if cpus.is_empty() {
                "—".to_owned()
            } else {
                format!("{:.1}", median(cpus))
            };
            let cpu_ratios: Vec<f64> = results
                .iter()
                .filter_map(|r| cpu_ratio(r, mode, clients))
                .collect();
            let cpu_ratio = if cpu_ratios.is_empty() {
                "—".to_owned()
            } else {
                format!("{:.3}", median(cpu_ratios))
            };
            println!(
                "| {mode} | {clients} | {rps:.0} | {} | {} | {non_2xx} | {ratio_median} | {per_round} | {cpu} | {cpu_ratio} |",
                micros(Duration::from_secs_f64(p50)),
                micros(Duration::from_secs_f64(p99)),
            );
        }
    }
    let bad: u64 = results
        .iter()
        .flatten()
        .map(|(_, _, s)| s.non_2xx + s.errors)
        .sum();
    if bad > 0 {
        println!(
            "\nWARNING: {bad} requests were answered non-2xx or failed; see the rounds above."
        );
    }
    Ok(())
}

/// `value` of `mode` and of its baseline in the same round.
fn paired(
    round: &[(Mode, usize, Sample)],
    mode: Mode,
    clients: usize,
    value: impl Fn(&Sample) -> Option<f64>,
) -> Option<(f64, f64)> {
    let base = mode.baseline()?;
    let get = |m: Mode| {
        round
            .iter()
            .find(|(x, c, _)| *x == m && *c == clients)
            .and_then(|(_, _, s)| value(s))
    };
    Some((get(mode)?, get(base)?))
}

/// Throughput of `mode` over its baseline's in the same round.
fn ratio(round: &[(Mode, usize, Sample)], mode: Mode, clients: usize) -> Option<f64> {
    paired(round, mode, clients, |s| Some(s.rps)).map(|(m, base)| m / base)
}

/// The server's CPU per request of `mode`'s baseline over `mode`'s in the
/// same round: like the throughput ratio, 1 means the layer is free.
fn cpu_ratio(round: &[(Mode, usize, Sample)], mode: Mode, clients: usize) -> Option<f64> {
    paired(round, mode, clients, |s| {
        s.server_cpu.map(|c| c.as_secs_f64())
    })
    .map(|(m, base)| base / m)
}

fn print_round(round: &[(Mode, usize, Sample)], _args: &Args) {
    println!(
        "| mode | clients | req/s | p50 | p99 | 2xx | non-2xx | errors | ratio | server CPU \
         µs/req | CPU ratio |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (mode, clients, s) in round {
        let r = ratio(round, *mode, *clients)
            .map(|r| format!("{r:.3}"))
            .unwrap_or_else(|| "—".to_owned());
        let cpu = s
            .server_cpu
            .map(|c| format!("{:.1}", c.as_secs_f64() * 1e6))
            .unwrap_or_else(|| "—".to_owned());
        let cpu_r = cpu_ratio(round, *mode, *clients)
            .map(|r| format!("{r:.3}"))
            .unwrap_or_else(|| "—".to_owned());
        println!(
            "| {mode} | {clients} | {:.0} | {} | {} | {} | {} | {} | {r} | {cpu} | {cpu_r} |",
            s.rps,
            micros(s.p50),
            micros(s.p99),
            s.ok,
            s.non_2xx,
            s.errors
        );
    }
}
