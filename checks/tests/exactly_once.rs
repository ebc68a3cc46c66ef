//! End to end: the client's retries and the server's idempotency layer
//! together charge exactly once.
//!
//! Two replicas of `examples/payments_server` share one PostgreSQL. Between
//! them and the client sits a proxy that injects faults per request: it
//! drops the response after the server processed the request, answers 503
//! itself, delays the request past the client's attempt timeout (so the
//! retry meets the original still in progress), or closes both connections
//! while the server's handler is still running after its effect (so the
//! server sees its client go away mid-request). Hundreds of logical payments
//! go through `RetryMiddleware`; afterwards every payment the client saw
//! succeed exists exactly once, and none exists twice.
//!
//! Needs PostgreSQL (`DATABASE_URL`, default
//! `postgres://postgres@127.0.0.1:5432/test`); the test fails at once,
//! naming the URL, when it cannot connect. `cargo test --test exactly_once`
//! does not build the example: `cargo build --examples` first.
//!
//! `restarting_postgres_loses_and_doubles_nothing` is ignored by default: it
//! restarts the local PostgreSQL cluster (fast and immediate modes) during a
//! run, which other tests sharing the database would notice. Run it alone
//! (`PAYMENTS` and `RESTARTS` override 6000 and 12):
//! `cargo test --test exactly_once -- --ignored --nocapture`.

mod support;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use reqwest_safe_retry::{RetryMiddleware, RetryPolicy, RetryReport};
use sqlx::Connection;
use support::payments::{database_url, PaymentsServer};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

/// The replicas' handler: 20 ms of work, the payment, then 100 ms more
/// before answering (a slow downstream after the charge).
const REPLICA_ARGS: [&str; 4] = ["--work-ms", "20", "--after-effect-ms", "100"];

/// Fails the test at once, naming the URL, when PostgreSQL cannot be
/// reached: better than every replica waiting on its pool.
async fn require_postgres() -> String {
    let url = database_url();
    let probe = tokio::time::timeout(Duration::from_secs(5), sqlx::PgConnection::connect(&url));
    match probe.await {
        Ok(Ok(conn)) => {
            let _ = conn.close().await;
            url
        }
        Ok(Err(e)) => panic!("cannot reach PostgreSQL at {url} (DATABASE_URL): {e}"),
        Err(_) => panic!("cannot reach PostgreSQL at {url} (DATABASE_URL): no answer in 5 s"),
    }
}

/// Two replicas on one database; the second starts after the first has
/// applied the migrations.
async fn replicas() -> [PaymentsServer; 2] {
    let url = require_postgres().await;
    let start = || {
        let mut args = vec!["--store", url.as_str()];
        args.extend(REPLICA_ARGS);
        PaymentsServer::start(&args)
    };
    let first = start();
    [first, start()]
}

/// How often the proxy injects each fault, as fractions of requests.
#[derive(Debug, Clone, Copy)]
struct FaultRates {
    answer_503: f64,
    delay: f64,
    drop_response: f64,
    close_while_working: f64,
}

impl FaultRates {
    const NONE: FaultRates = FaultRates {
        answer_503: 0.0,
        delay: 0.0,
        drop_response: 0.0,
        close_while_working: 0.0,
    };
}

/// What the proxy did to each request.
#[derive(Debug, Default)]
struct Faults {
    passed: AtomicUsize,
    answered_503: AtomicUsize,
    delayed: AtomicUsize,
    dropped_after_processing: AtomicUsize,
    closed_while_working: AtomicUsize,
}

/// One request's fate, drawn by the proxy.
#[derive(Debug, Clone, Copy)]
enum Fate {
    Pass,
    Answer503,
    /// Forward only once the client has hung up (its attempt timed out), so
    /// the server processes a request whose client is already retrying.
    Delay,
    DropResponse,
    /// Forward, then close both connections after this long: the handler
    /// has made its payment and is waiting out its after-effect time.
    CloseWhileWorking(Duration),
}

/// A fault-injecting HTTP/1.1 proxy: one request per connection, upstream
/// replicas taken in turn.
async fn start_proxy(
    upstreams: Vec<SocketAddr>,
    rates: FaultRates,
    seed: u64,
) -> (SocketAddr, Arc<Faults>) {
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
            let fate = {
                let mut rng = rng.lock().unwrap();
                let mut roll: f64 = rng.random();
                let mut pick = |rate: f64| {
                    roll -= rate;
                    roll < 0.0
                };
                if pick(rates.answer_503) {
                    Fate::Answer503
                } else if pick(rates.delay) {
                    Fate::Delay
                } else if pick(rates.drop_response) {
                    Fate::DropResponse
                } else if pick(rates.close_while_working) {
                    Fate::CloseWhileWorking(Duration::from_millis(rng.random_range(60..90)))
                } else {
                    Fate::Pass
                }
            };
            tokio::spawn(proxy_one(client, upstream, fate, counts.clone()));
        }
    });
    (addr, faults)
}

async fn proxy_one(client: TcpStream, upstream: SocketAddr, fate: Fate, faults: Arc<Faults>) {
    let mut client = BufReader::new(client);
    let Some(request) = read_request(&mut client).await else {
        return;
    };
    let mut client = client.into_inner();
    if let Fate::Answer503 = fate {
        faults.answered_503.fetch_add(1, Ordering::SeqCst);
        let _ = client
            .write_all(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
            .await;
        return;
    }
    if let Fate::Delay = fate {
        // Held until the client gives up on this attempt and closes its
        // connection (an event, not a guess at how long that takes); then
        // the server still processes the request while the client retries.
        // The bound only keeps a client that never hangs up from stalling
        // the test.
        faults.delayed.fetch_add(1, Ordering::SeqCst);
        let mut byte = [0u8; 1];
        let _ = tokio::time::timeout(Duration::from_secs(10), client.read(&mut byte)).await;
    }
    let Ok(mut server) = TcpStream::connect(upstream).await else {
        return;
    };
    if server.write_all(&request).await.is_err() {
        return;
    }
    if let Fate::CloseWhileWorking(after) = fate {
        // The request reached the handler; while it waits after its effect,
        // the client side goes away: both sockets reset, so the server sees
        // its connection close mid-request.
        tokio::time::sleep(after).await;
        faults.closed_while_working.fetch_add(1, Ordering::SeqCst);
        let _ = client.set_zero_linger();
        let _ = server.set_zero_linger();
        return;
    }
    let mut response = Vec::new();
    if server.read_to_end(&mut response).await.is_err() {
        return;
    }
    if let Fate::DropResponse = fate {
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

/// What the client saw of one logical payment.
#[derive(Debug)]
struct Seen {
    account: String,
    succeeded: bool,
    replayed: bool,
    attempts: u32,
}

/// A client through `RetryMiddleware` with `policy`.
fn client(policy: RetryPolicy) -> ClientWithMiddleware {
    ClientBuilder::new(reqwest::Client::new())
        .with(RetryMiddleware::new(policy))
        .build()
}

/// Sends `payments` logical payments to `url`, `concurrency` at a time,
/// each on its own account.
async fn pay(
    client: &ClientWithMiddleware,
    url: &str,
    payments: usize,
    concurrency: usize,
) -> Vec<Seen> {
    let run = uuid::Uuid::new_v4().simple().to_string();
    let semaphore = Arc::new(tokio::sync::Semaphore::new(concurrency));
    let mut calls = Vec::new();
    for i in 0..payments {
        let client = client.clone();
        let account = format!("e2e-{run}-{i}");
        let url = url.to_owned();
        let permit = semaphore.clone().acquire_owned().await.unwrap();
        calls.push(tokio::spawn(async move {
            let _permit = permit;
            let body = format!(r#"{{"account":"{account}","amount":{}}}"#, 100 + i);
            // Filled with the report whatever the result: a transport error
            // comes back as reqwest made it.
            let slot = reqwest_safe_retry::ReportSlot::new();
            let result = client
                .post(url)
                .header("content-type", "application/json")
                .body(body)
                .with_extension(slot.clone())
                .send()
                .await;
            match result {
                Ok(response) => Seen {
                    succeeded: response.status() == 201,
                    replayed: response.headers().contains_key("idempotent-replayed"),
                    attempts: response
                        .extensions()
                        .get::<RetryReport>()
                        .map_or(0, RetryReport::attempts),
                    account,
                },
                Err(_) => Seen {
                    succeeded: false,
                    replayed: false,
                    attempts: slot.get().map_or(0, |r| r.attempts()),
                    account,
                },
            }
        }));
    }
    let mut seen = Vec::new();
    for call in calls {
        seen.push(call.await.unwrap());
    }
    seen
}

/// The outcome of a run, counted from the database.
#[derive(Debug, Default, PartialEq, Eq)]
struct Tally {
    succeeded: usize,
    /// Payments stored more than once.
    doubled: usize,
    /// Payments the client saw succeed that were not stored.
    lost: usize,
    /// Payments stored once that the client did not see succeed (it gave
    /// up first); not an error, but worth knowing.
    unconfirmed: usize,
    replays: usize,
    most_attempts: u32,
}

/// Counts each account's payments straight from a replica, past the proxy.
async fn tally(replica: &PaymentsServer, seen: &[Seen]) -> Tally {
    let mut t = Tally::default();
    for s in seen {
        let rows = replica.payments_of(&s.account).await;
        t.doubled += usize::from(rows > 1);
        t.lost += usize::from(s.succeeded && rows == 0);
        t.unconfirmed += usize::from(!s.succeeded && rows == 1);
        t.succeeded += usize::from(s.succeeded);
        t.replays += usize::from(s.replayed);
        t.most_attempts = t.most_attempts.max(s.attempts);
    }
    t
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_payment_the_client_saw_succeed_exists_exactly_once() {
    const PAYMENTS: usize = 300;
    let [first, second] = replicas().await;
    let rates = FaultRates {
        answer_503: 0.12,
        delay: 0.12,
        drop_response: 0.12,
        close_while_working: 0.12,
    };
    let (proxy, faults) = start_proxy(vec![first.addr, second.addr], rates, 2026).await;

    let policy = RetryPolicy::builder()
        .max_attempts(10)
        .backoff(Duration::from_millis(10), Duration::from_millis(200))
        // Longer than a handler's 120 ms; a delayed request is held until it
        // fires and the client hangs up.
        .attempt_timeout(Duration::from_millis(400))
        .deadline(Duration::from_secs(30))
        .min_attempt_window(Duration::from_millis(10))
        // The fault rate here is far above any real outage's; the budget
        // would (rightly) stop retrying, which is not what this test is about.
        .no_budget()
        .build()
        .unwrap();
    let metrics = policy.clone();
    let seen = pay(
        &client(policy),
        &format!("http://{proxy}/payments"),
        PAYMENTS,
        30,
    )
    .await;
    let t = tally(&first, &seen).await;

    let counts = [
        ("503", faults.answered_503.load(Ordering::SeqCst)),
        ("delayed", faults.delayed.load(Ordering::SeqCst)),
        (
            "dropped",
            faults.dropped_after_processing.load(Ordering::SeqCst),
        ),
        ("closed", faults.closed_while_working.load(Ordering::SeqCst)),
    ];
    eprintln!(
        "{PAYMENTS} payments: {} succeeded; faults {counts:?}, passed {}; retries {}; \
         replays seen {}; most attempts {}; doubled {}; lost {}; unconfirmed {}",
        t.succeeded,
        faults.passed.load(Ordering::SeqCst),
        metrics.metrics().snapshot().retries,
        t.replays,
        t.most_attempts,
        t.doubled,
        t.lost,
        t.unconfirmed,
    );
    assert_eq!((t.doubled, t.lost), (0, 0), "{t:?}");
    // The faults really happened, and the retries really went through them.
    for (name, n) in counts {
        assert!(n > 10, "only {n} {name} faults: {counts:?}");
    }
    assert!(t.replays > 0, "no retry was answered by a replay");
    assert!(
        t.succeeded >= PAYMENTS * 95 / 100,
        "only {} of {PAYMENTS} succeeded",
        t.succeeded
    );
}

/// Restarts the local cluster with `pg_ctlcluster` in `mode`.
fn restart_postgres(mode: &str) {
    let version = std::fs::read_dir("/etc/postgresql")
        .expect("a Debian-style PostgreSQL cluster in /etc/postgresql")
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .next()
        .expect("a cluster version in /etc/postgresql");
    let status = std::process::Command::new("pg_ctlcluster")
        .args([
            "--skip-systemctl-redirect",
            &version,
            "main",
            "restart",
            "-m",
            mode,
        ])
        .status()
        .expect("pg_ctlcluster");
    assert!(
        status.success(),
        "pg_ctlcluster restart -m {mode}: {status}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "restarts the local PostgreSQL; run alone by hand"]
async fn restarting_postgres_loses_and_doubles_nothing() {
    let env = |name: &str, default: usize| {
        std::env::var(name).map_or(default, |v| v.parse().expect("a number"))
    };
    let payments = env("PAYMENTS", 6000);
    let restarts_wanted = env("RESTARTS", 12);
    let [first, second] = replicas().await;
    let (proxy, _) = start_proxy(vec![first.addr, second.addr], FaultRates::NONE, 7).await;
    let policy = RetryPolicy::builder()
        .max_attempts(20)
        .backoff(Duration::from_millis(50), Duration::from_secs(1))
        .attempt_timeout(Duration::from_secs(2))
        .deadline(Duration::from_secs(60))
        .no_budget()
        .build()
        .unwrap();
    let metrics = policy.clone();
    let done = Arc::new(AtomicUsize::new(0));
    let counter = done.clone();
    let restarts = tokio::spawn(async move {
        for i in 0..restarts_wanted {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let mode = if i % 2 == 0 { "fast" } else { "immediate" };
            tokio::task::spawn_blocking(move || restart_postgres(mode))
                .await
                .unwrap();
            counter.fetch_add(1, Ordering::SeqCst);
        }
    });
    let started = std::time::Instant::now();
    let url = format!("http://{proxy}/payments");
    let seen = pay(&client(policy), &url, payments, 20).await;
    let paid = started.elapsed();
    let during = done.load(Ordering::SeqCst);
    restarts.await.unwrap();
    require_postgres().await;
    let t = tally(&first, &seen).await;
    eprintln!(
        "paid in {paid:?}, counted in {:?}; the replicas logged {} warning lines",
        started.elapsed() - paid,
        first.stderr_lines() + second.stderr_lines(),
    );
    let m = metrics.metrics().snapshot();
    eprintln!(
        "{payments} payments through {during} restarts (fast, immediate alternately): \
         {} succeeded; retries {}; replays seen {}; most attempts {}; \
         doubled {}; lost {}; unconfirmed {}",
        t.succeeded, m.retries, t.replays, t.most_attempts, t.doubled, t.lost, t.unconfirmed,
    );
    assert_eq!((t.doubled, t.lost), (0, 0), "{t:?}");
    assert!(m.retries > 0, "no restart was felt by the client");
    assert_eq!(
        during, restarts_wanted,
        "the payments ended before the restarts: raise PAYMENTS"
    );
}
