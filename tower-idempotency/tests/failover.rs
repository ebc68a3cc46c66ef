//! Exactly once through a database failover: two replicas share one
//! PostgreSQL through a TCP proxy that, mid-run, cuts every connection and
//! refuses new ones for a while (2 s and 7 s here, longer than the 5 s lock
//! timeout; `FAILOVER_SECS=30 cargo test --test failover -- --ignored` for
//! longer ones). The handler's effect is outside the database (a counter
//! per key, as a charge at a payment processor would be); clients retry
//! with a 1 s attempt timeout, across the replicas, until they get an
//! answer that is not 409 or 503.
//!
//! Afterwards every payment's effect ran exactly once, every caller that
//! got a success got the one stored answer (the replay is byte for byte the
//! same), and no key is left in progress.
//!
//! The outage's length is the fault injected, not a duration any assertion
//! measures: the test waits for the clients, not for a guessed time.
mod support;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, Request, StatusCode};
use axum::response::IntoResponse;
use axum::routing;
use axum::Router;
use support::{database_url, pg_store, send, unique, Reply};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tower_idempotency::{IdempotencyLayer, PostgresStore};

/// A proxy in front of PostgreSQL that can cut every connection and refuse
/// new ones.
struct Proxy {
    addr: SocketAddr,
    up: Arc<AtomicBool>,
    /// Connections refused while cut: proof that the stores go through it.
    refused: Arc<AtomicUsize>,
    /// The forwarding tasks of the open connections.
    open: Arc<Mutex<JoinSet<()>>>,
}

impl Proxy {
    async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let up = Arc::new(AtomicBool::new(true));
        let refused = Arc::new(AtomicUsize::new(0));
        let open = Arc::new(Mutex::new(JoinSet::new()));
        let (accept_up, accept_open, accept_refused) = (up.clone(), open.clone(), refused.clone());
        tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    return;
                };
                if !accept_up.load(Ordering::SeqCst) {
                    // Refused: closed at once.
                    accept_refused.fetch_add(1, Ordering::SeqCst);
                    drop(client);
                    continue;
                }
                accept_open.lock().unwrap().spawn(forward(client, upstream));
            }
        });
        Self {
            addr,
            up,
            refused,
            open,
        }
    }

    /// Cuts every connection and refuses new ones until `restore`.
    fn cut(&self) {
        self.up.store(false, Ordering::SeqCst);
        // Aborting a forwarding task drops both of its sockets.
        self.open.lock().unwrap().abort_all();
    }

    fn restore(&self) {
        self.up.store(true, Ordering::SeqCst);
    }

    /// The database URL through this proxy: `DATABASE_URL` with its
    /// host and port replaced by the proxy's.
    fn url(&self) -> String {
        let direct = database_url();
        let (scheme_user, rest) = direct
            .split_once('@')
            .expect("DATABASE_URL has the form postgres://user@host:port/db");
        let path = rest.find('/').map_or("", |at| &rest[at..]);
        format!("{scheme_user}@{}{path}", self.addr)
    }
}

async fn forward(mut client: TcpStream, upstream: SocketAddr) {
    let Ok(mut server) = TcpStream::connect(upstream).await else {
        return;
    };
    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
}

/// The PostgreSQL address of `DATABASE_URL` (host:port, 127.0.0.1:5432 by
/// default).
fn upstream_addr() -> SocketAddr {
    let url = database_url();
    let host_port = url
        .split('@')
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .unwrap_or("127.0.0.1:5432");
    let host_port = if host_port.contains(':') {
        host_port.to_owned()
    } else {
        format!("{host_port}:5432")
    };
    host_port
        .replace("localhost", "127.0.0.1")
        .parse()
        .expect("DATABASE_URL names host:port as an IP address")
}

/// The effects that happened, outside the database: key -> runs.
#[derive(Clone, Default)]
struct Effects(Arc<Mutex<HashMap<String, u32>>>);

/// Charges (counts a run of the key) at once, then waits `after-ms` before
/// answering: the outage meets handlers mid-run and mid-completion.
async fn charge(State(effects): State<Effects>, headers: HeaderMap) -> axum::response::Response {
    let key = headers["idempotency-key"].to_str().unwrap().to_owned();
    let run = {
        let mut runs = effects.0.lock().unwrap();
        let run = runs.entry(key.clone()).or_default();
        *run += 1;
        *run
    };
    let after = headers
        .get("x-after-ms")
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .unwrap_or(0);
    tokio::time::sleep(Duration::from_millis(after)).await;
    let body = serde_json::json!({"key": key, "run": run}).to_string();
    (
        StatusCode::CREATED,
        [("content-type", "application/json")],
        body,
    )
        .into_response()
}

fn replica(store: PostgresStore, effects: Effects) -> Router {
    Router::new()
        .route("/payments", routing::post(charge))
        .with_state(effects)
        .layer(IdempotencyLayer::new(store))
}

fn payment(key: &str, after_ms: u64) -> Request<Body> {
    Request::post("/payments")
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .header("x-after-ms", after_ms.to_string())
        .body(Body::from(format!(r#"{{"amount":1,"key":"{key}"}}"#)))
        .unwrap()
}

/// A client with a 1 s attempt timeout that retries 409, 503 and timeouts
/// every 300 ms, alternating replicas, for up to 90 s; the answer it ended
/// with.
async fn pay(replicas: [Router; 2], key: String, after_ms: u64, first: usize) -> Option<Reply> {
    for attempt in 0..300 {
        let router = &replicas[(first + attempt) % 2];
        let reply = tokio::time::timeout(
            Duration::from_secs(1),
            send(router, payment(&key, after_ms)),
        )
        .await;
        match reply {
            Ok(reply)
                if reply.status != StatusCode::CONFLICT
                    && reply.status != StatusCode::SERVICE_UNAVAILABLE =>
            {
                return Some(reply)
            }
            _ => tokio::time::sleep(Duration::from_millis(300)).await,
        }
    }
    None
}

/// Counts the keys of `table` still in progress.
async fn in_progress(store: &PostgresStore) -> i64 {
    sqlx::query_scalar(&format!(
        "SELECT count(*) FROM {} WHERE status = 'in_progress'",
        store.table()
    ))
    .fetch_one(store.pool())
    .await
    .unwrap()
}

async fn through_an_outage(outage: Duration) {
    let table = unique("tif_");
    // Created directly, not through the proxy.
    let direct = pg_store(&table).await;
    let proxy = Proxy::start(upstream_addr()).await;
    let mut replicas = Vec::new();
    let effects = Effects::default();
    for _ in 0..2 {
        let store = PostgresStore::connect_with_pool_size(&proxy.url(), 8)
            .await
            .unwrap()
            .with_table(&table)
            .unwrap();
        replicas.push(replica(store, effects.clone()));
    }
    let replicas: [Router; 2] = [replicas[0].clone(), replicas[1].clone()];

    // 40 payments over about 2 s, each charging and then answering 0 to
    // 900 ms later; the outage starts 1 s in, when some handlers are
    // running and some are completing.
    let started = std::time::Instant::now();
    let mut payments = JoinSet::new();
    let mut keys = Vec::new();
    for i in 0..40u64 {
        let key = format!("pay-{i}-{}", uuid::Uuid::new_v4().simple());
        keys.push(key.clone());
        let replicas = replicas.clone();
        let after_ms = (i * 97) % 900;
        payments.spawn(async move {
            tokio::time::sleep(Duration::from_millis(i * 50)).await;
            let reply = pay(replicas, key.clone(), after_ms, i as usize % 2).await;
            (key, reply)
        });
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    proxy.cut();
    tokio::time::sleep(outage).await;
    proxy.restore();

    let mut answers = HashMap::new();
    while let Some(done) = payments.join_next().await {
        let (key, reply) = done.unwrap();
        answers.insert(key, reply);
    }

    assert!(
        proxy.refused.load(Ordering::SeqCst) > 0,
        "no store connected through the proxy during the outage"
    );
    let runs = effects.0.lock().unwrap().clone();
    let doubled: Vec<_> = runs.iter().filter(|(_, n)| **n > 1).collect();
    let succeeded = answers
        .values()
        .flatten()
        .filter(|r| r.status == StatusCode::CREATED)
        .count();
    eprintln!(
        "outage {outage:?}: {} payments, {succeeded} succeeded, {} doubled, all answered {:.1} s \
         after the start",
        keys.len(),
        doubled.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(
        doubled.is_empty(),
        "effects ran twice through a {outage:?} outage: {doubled:?}"
    );
    for key in &keys {
        let reply = answers[key]
            .as_ref()
            .unwrap_or_else(|| panic!("{key}: no answer within 90 s of retries"));
        assert_eq!(reply.status, StatusCode::CREATED, "{key}: {:?}", reply.body);
        assert_eq!(runs.get(key), Some(&1), "{key}");
        // The replay is the answer the caller got.
        let replay = send(&replicas[0], payment(key, 0)).await;
        assert!(replay.replayed(), "{key}: {:?}", replay.body);
        assert_eq!(replay.body, reply.body, "{key}");
    }
    assert_eq!(in_progress(&direct).await, 0, "keys stuck in progress");
    sqlx::query(&format!("DROP TABLE IF EXISTS {table}"))
        .execute(direct.pool())
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_two_second_outage_runs_nothing_twice() {
    through_an_outage(Duration::from_secs(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_seven_second_outage_runs_nothing_twice() {
    through_an_outage(Duration::from_secs(7)).await;
}

/// Longer outages (`FAILOVER_SECS`, default 30): run on purpose, it takes
/// that long.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "takes FAILOVER_SECS (30) seconds; run with --ignored"]
async fn a_long_outage_runs_nothing_twice() {
    let secs = std::env::var("FAILOVER_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(30);
    through_an_outage(Duration::from_secs(secs)).await;
}
