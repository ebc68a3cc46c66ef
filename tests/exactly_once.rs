//! End to end: the client's retries and the server's idempotency layer
//! together charge exactly once.
//!
//! Two replicas of `examples/payments_server` share one PostgreSQL. Between
//! them and the client sits a proxy that injects faults per request: it drops
//! the response after the server processed the request, answers 503 itself,
//! or delays the request past the client's attempt timeout (so the retry
//! meets the original still in progress). Hundreds of logical payments go
//! through `RetryMiddleware`; afterwards every payment the client saw succeed
//! exists exactly once, and none exists twice.
//!
//! Needs PostgreSQL at 127.0.0.1:5432 (database `test`); `.ci/run` starts it.

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use reqwest_middleware::ClientBuilder;
use reqwest_safe_retry::{RetryMiddleware, RetryPolicy, RetryReport};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

const DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/test";
const PAYMENTS: usize = 300;
const CONCURRENCY: usize = 30;

/// A replica of the payments server, killed when dropped.
struct Replica {
    child: Child,
    addr: SocketAddr,
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn example(name: &str) -> std::path::PathBuf {
    // `cargo test` builds the examples next to the test binaries.
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap();
    dir.join("examples")
        .join(format!("{name}{}", std::env::consts::EXE_SUFFIX))
}

fn start_replica() -> Replica {
    let database = std::env::var("DATABASE_URL").unwrap_or_else(|_| DATABASE_URL.to_owned());
    let mut child = Command::new(example("payments_server"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--store",
            &database,
            "--work-ms",
            "20",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .expect("build the example first: cargo build --example payments_server");
    let stdout = child.stdout.take().unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line).unwrap();
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| {
            panic!(
                "payments_server did not start ({line:?}); is PostgreSQL running at {DATABASE_URL}? \
                 pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start"
            )
        })
        .parse()
        .unwrap();
    Replica { child, addr }
}

/// What the proxy did to each request.
#[derive(Debug, Default)]
struct Faults {
    passed: AtomicUsize,
    dropped_after_processing: AtomicUsize,
    answered_503: AtomicUsize,
    delayed: AtomicUsize,
}

/// A fault-injecting HTTP/1.1 proxy: one request per connection, upstream
/// replicas taken in turn.
async fn start_proxy(upstreams: Vec<SocketAddr>, seed: u64) -> (SocketAddr, Arc<Faults>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let faults = Arc::new(Faults::default());
    let rng = Arc::new(Mutex::new(StdRng::seed_from_u64(seed)));
    let counts = faults.clone();
    tokio::spawn(async move {
        let mut turn = 0usize;
        while let Ok((client, _)) = listener.accept().await {
            let upstream = upstreams[turn % upstreams.len()];
            turn += 1;
            let roll: f64 = rng.lock().unwrap().random();
            let delay = Duration::from_millis(rng.lock().unwrap().random_range(200..400));
            tokio::spawn(proxy_one(client, upstream, roll, delay, counts.clone()));
        }
    });
    (addr, faults)
}

async fn proxy_one(
    client: TcpStream,
    upstream: SocketAddr,
    roll: f64,
    delay: Duration,
    faults: Arc<Faults>,
) {
    let mut client = BufReader::new(client);
    let Some(request) = read_request(&mut client).await else {
        return;
    };
    let mut client = client.into_inner();
    if roll < 0.15 {
        faults.answered_503.fetch_add(1, Ordering::SeqCst);
        let _ = client
            .write_all(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
            .await;
        return;
    }
    if roll < 0.30 {
        // Longer than the client's attempt timeout: the server still
        // processes the request while the client retries.
        faults.delayed.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(delay).await;
    }
    let Ok(mut server) = TcpStream::connect(upstream).await else {
        return;
    };
    if server.write_all(&request).await.is_err() {
        return;
    }
    let mut response = Vec::new();
    if server.read_to_end(&mut response).await.is_err() {
        return;
    }
    if (0.30..0.45).contains(&roll) {
        // The server processed the request; the client never hears of it.
        faults
            .dropped_after_processing
            .fetch_add(1, Ordering::SeqCst);
        let _ = client.set_zero_linger();
        return;
    }
    faults.passed.fetch_add(1, Ordering::SeqCst);
    let _ = client.write_all(&response).await;
    let _ = client.shutdown().await;
}

/// Reads one request and rewrites it to close the connection afterwards, so
/// the upstream's response ends at EOF.
async fn read_request(client: &mut BufReader<TcpStream>) -> Option<Vec<u8>> {
    let mut head = Vec::new();
    let mut length = 0usize;
    loop {
        let mut line = String::new();
        if client.read_line(&mut line).await.ok()? == 0 {
            return None;
        }
        if line == "\r\n" {
            break;
        }
        let lower = line.to_ascii_lowercase();
        if lower.starts_with("connection:") {
            continue;
        }
        if let Some(v) = lower.strip_prefix("content-length:") {
            length = v.trim().parse().ok()?;
        }
        head.extend_from_slice(line.as_bytes());
    }
    head.extend_from_slice(b"connection: close\r\n\r\n");
    let mut body = vec![0u8; length];
    client.read_exact(&mut body).await.ok()?;
    head.extend_from_slice(&body);
    Some(head)
}

#[derive(Debug)]
struct Seen {
    account: String,
    succeeded: bool,
    replayed: bool,
    attempts: u32,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_payment_the_client_saw_succeed_exists_exactly_once() {
    let first = start_replica();
    // The second starts after the first has applied the migrations.
    let second = start_replica();
    let (proxy, faults) = start_proxy(vec![first.addr, second.addr], 2026).await;

    let policy = RetryPolicy::builder()
        .max_attempts(10)
        .backoff(Duration::from_millis(10), Duration::from_millis(200))
        .attempt_timeout(Duration::from_millis(150))
        .deadline(Duration::from_secs(20))
        .min_attempt_window(Duration::from_millis(10))
        // The fault rate here is far above any real outage's; the budget
        // would (rightly) stop retrying, which is not what this test is about.
        .no_budget()
        .build()
        .unwrap();
    let metrics = policy.clone();
    let client = ClientBuilder::new(reqwest::Client::new())
        .with(RetryMiddleware::new(policy))
        .build();

    let run = uuid::Uuid::new_v4().simple().to_string();
    let semaphore = Arc::new(tokio::sync::Semaphore::new(CONCURRENCY));
    let mut calls = Vec::new();
    for i in 0..PAYMENTS {
        let client = client.clone();
        let account = format!("e2e-{run}-{i}");
        let url = format!("http://{proxy}/payments");
        let permit = semaphore.clone().acquire_owned().await.unwrap();
        calls.push(tokio::spawn(async move {
            let _permit = permit;
            let body = format!(r#"{{"account":"{account}","amount":{}}}"#, 100 + i);
            let result = client
                .post(url)
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await;
            match result {
                Ok(response) => Seen {
                    succeeded: response.status() == 201,
                    replayed: response.headers().contains_key("idempotent-replayed"),
                    attempts: response
                        .extensions()
                        .get::<RetryReport>()
                        .unwrap()
                        .attempts(),
                    account,
                },
                Err(err) => Seen {
                    succeeded: false,
                    replayed: false,
                    attempts: reqwest_safe_retry::RetryError::from_middleware(&err)
                        .map_or(0, |e| e.report().attempts()),
                    account,
                },
            }
        }));
    }
    let mut seen = Vec::new();
    for call in calls {
        seen.push(call.await.unwrap());
    }

    // Count each account's payments straight from a replica, past the proxy.
    let direct = reqwest::Client::new();
    let mut succeeded = 0;
    for s in &seen {
        let url = format!("http://{}/payments?account={}", first.addr, s.account);
        let rows: Vec<serde_json::Value> =
            direct.get(url).send().await.unwrap().json_compat().await;
        assert!(
            rows.len() <= 1,
            "{} was charged {} times",
            s.account,
            rows.len()
        );
        if s.succeeded {
            succeeded += 1;
            assert_eq!(rows.len(), 1, "{} succeeded but was not stored", s.account);
        }
    }

    let faults = (
        faults.dropped_after_processing.load(Ordering::SeqCst),
        faults.answered_503.load(Ordering::SeqCst),
        faults.delayed.load(Ordering::SeqCst),
    );
    let m = metrics.metrics().snapshot();
    eprintln!(
        "{succeeded}/{PAYMENTS} succeeded; faults (dropped, 503, delayed) = {faults:?}; \
         retries {}; replays seen {}; most attempts {}",
        m.retries,
        seen.iter().filter(|s| s.replayed).count(),
        seen.iter().map(|s| s.attempts).max().unwrap_or(0),
    );
    // The faults really happened, and the retries really went through them.
    assert!(
        faults.0 > 10 && faults.1 > 10 && faults.2 > 10,
        "{faults:?}"
    );
    assert!(
        seen.iter().any(|s| s.replayed),
        "no retry was answered by a replay"
    );
    assert!(
        succeeded >= PAYMENTS * 95 / 100,
        "only {succeeded} of {PAYMENTS} succeeded"
    );
}

/// `reqwest::Response::json` needs reqwest's `json` feature; this reads the
/// body and parses it with serde_json instead.
trait JsonCompat {
    async fn json_compat<T: serde::de::DeserializeOwned>(self) -> T;
}

impl JsonCompat for reqwest::Response {
    async fn json_compat<T: serde::de::DeserializeOwned>(self) -> T {
        let bytes = self.bytes().await.unwrap();
        serde_json::from_slice(&bytes).unwrap()
    }
}
