//! Success-path overhead, what users pay: requests per second against one
//! local server (axum, `200 ok`) for a GET and for a POST with a body (which
//! `RetryMiddleware` gives an idempotency key, so it pays for key
//! generation and the header) through
//!
//! - a bare `reqwest::Client`,
//! - `ClientWithMiddleware` with no middleware,
//! - `ClientWithMiddleware` with reqwest-retry's `RetryTransientMiddleware`,
//! - a bare client sending what any keyed call with a deadline must (a
//!   fixed key header on the POST and a 30 s timeout): the floor,
//! - `ClientWithMiddleware` with no middleware sending, by hand, what the
//!   contract asks of a first attempt (a fresh key on the POST, a 30 s
//!   timeout, the time left in `Request-Timeout-Ms`): the contract's floor,
//! - a middleware doing only what any retry layer keeping the contract
//!   must on a success (the contract's first attempt, a copy of the
//!   request kept for a retry, a report in the response;
//!   `support/floor.rs`): a retry layer's floor,
//! - the same and what DESIGN asks of every call beside it (admission's
//!   per-host count of first attempts, the inherited deadline read, the
//!   clock read at the start, every answer looked at for quota fields):
//!   the contract floor,
//! - `ClientWithMiddleware` with this crate's `RetryMiddleware` (defaults),
//! - the same without a deadline: what the default deadline's timer costs,
//!
//! sequentially and with some concurrency, in one run. Each variant's
//! throughput is shown as a ratio to the bare client, to reqwest-retry and
//! to the contract written by hand (`/contract`, issue 33's line). Variants are
//! interleaved (the order rotates every round) and each round's numbers are
//! divided by the bare client's in the same round, so drift of the machine
//! cancels out; the table shows medians over the rounds.
//!
//! `cargo bench --bench overhead` (env: `OVERHEAD_ROUNDS`, default 15;
//! `OVERHEAD_REQUESTS`, default 10000; `OVERHEAD_CONCURRENCY`, default 16).
//!
//! The server runs on its own single-threaded runtime and thread; the client
//! on another, so that on a two-core machine each side has one core.

use std::time::{Duration, Instant};

use axum::routing::get;
use axum::Router;
use reqwest::Method;
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use reqwest_retry::policies::ExponentialBackoff;
use reqwest_retry::RetryTransientMiddleware;
use reqwest_safe_retry::keys::KeyGenerator;
use reqwest_safe_retry::{IdempotencyKey, RetryMiddleware, RetryPolicy};

#[path = "support/floor.rs"]
mod floor;

#[derive(Clone)]
enum Variant {
    Bare(reqwest::Client),
    /// A bare client doing by hand what any keyed call with a deadline
    /// must: a key header (a fixed one: no generation) and a 30 s timeout.
    Floor(reqwest::Client),
    /// The empty middleware stack sending by hand what the contract asks
    /// of a first attempt: a fresh key (POST), a 30 s timeout and the time
    /// left in `Request-Timeout-Ms`.
    Contract(ClientWithMiddleware),
    Middleware(ClientWithMiddleware),
}

impl Variant {
    async fn send(&self, method: &Method, url: &str) -> bool {
        let post = *method == Method::POST;
        let response = match self {
            Variant::Bare(c) if post => c.post(url).body("{}").send().await.map_err(|_| ()),
            Variant::Bare(c) => c.get(url).send().await.map_err(|_| ()),
            Variant::Floor(c) if post => c
                .post(url)
                .header("idempotency-key", "3f0e8e9c-5d4a-4d7e-9a53-2c0b7f1e6a11")
                .timeout(Duration::from_secs(30))
                .body("{}")
                .send()
                .await
                .map_err(|_| ()),
            Variant::Floor(c) => c
                .get(url)
                .timeout(Duration::from_secs(30))
                .send()
                .await
                .map_err(|_| ()),
            Variant::Contract(c) => {
                let request = if post {
                    let key = IdempotencyKey::generate(KeyGenerator::UuidV4);
                    c.post(url)
                        .header("idempotency-key", key.as_str())
                        .body("{}")
                } else {
                    c.get(url)
                };
                request
                    .timeout(Duration::from_secs(30))
                    .header("request-timeout-ms", 30_000u64)
                    .send()
                    .await
                    .map_err(|_| ())
            }
            Variant::Middleware(c) if post => c.post(url).body("{}").send().await.map_err(|_| ()),
            Variant::Middleware(c) => c.get(url).send().await.map_err(|_| ()),
        };
        match response {
            Ok(r) if r.status().is_success() => r.bytes().await.is_ok(),
            _ => false,
        }
    }
}

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(64)
        .build()
        .expect("a reqwest client")
}

/// Index of reqwest-retry in [`variants`], the second baseline.
const REQWEST_RETRY: usize = 2;

/// Index of the contract written by hand in [`variants`], the third.
const CONTRACT: usize = 4;

fn variants() -> Vec<(&'static str, Variant)> {
    vec![
        ("bare reqwest::Client", Variant::Bare(client())),
        (
            "ClientWithMiddleware, no middleware",
            Variant::Middleware(ClientBuilder::new(client()).build()),
        ),
        (
            "RetryTransientMiddleware (reqwest-retry 0.9)",
            Variant::Middleware(
                ClientBuilder::new(client())
                    .with(RetryTransientMiddleware::new_with_policy(
                        ExponentialBackoff::builder().build_with_max_retries(2),
                    ))
                    .build(),
            ),
        ),
        (
            "floor: bare + fixed key header (POST) + 30 s timeout",
            Variant::Floor(client()),
        ),
        (
            "contract by hand: empty stack + fresh key (POST) + timeout + Request-Timeout-Ms",
            Variant::Contract(ClientBuilder::new(client()).build()),
        ),
        (
            "retry floor: a middleware sending the contract + a request copy kept + a report",
            Variant::Middleware(
                ClientBuilder::new(client())
                    .with(floor::RetryFloor::new())
                    .build(),
            ),
        ),
        (
            "contract floor: the retry floor + per-host count, inherited deadline, clock, quota scan",
            Variant::Middleware(
                ClientBuilder::new(client())
                    .with(floor::ContractFloor::new())
                    .build(),
            ),
        ),
        (
            "RetryMiddleware (reqwest-safe-retry, defaults)",
            Variant::Middleware(
                ClientBuilder::new(client())
                    .with(RetryMiddleware::new(RetryPolicy::default()))
                    .build(),
            ),
        ),
        (
            "RetryMiddleware, no deadline (no timer armed)",
            Variant::Middleware(
                ClientBuilder::new(client())
                    .with(RetryMiddleware::new(
                        RetryPolicy::builder()
                            .no_deadline()
                            .build()
                            .expect("a valid policy"),
                    ))
                    .build(),
            ),
        ),
    ]
}

/// CPU time used so far by every thread of this process (client and
/// server), in nanoseconds, from `/proc/self/task/*/schedstat` (Linux);
/// `None` elsewhere. Less sensitive to other processes than wall time.
fn process_cpu_ns() -> Option<u64> {
    let mut total = 0u64;
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let stat = std::fs::read_to_string(task.ok()?.path().join("schedstat")).ok()?;
        total += stat.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(total)
}

/// Requests per second and CPU microseconds per request.
struct Measure {
    rps: f64,
    /// Requests that failed (counted, not retried; a run reports them).
    failed: usize,
    cpu_us: Option<f64>,
}

async fn sequential(v: &Variant, method: &Method, url: &str, n: usize) -> Measure {
    let cpu = process_cpu_ns();
    let start = Instant::now();
    let mut failed = 0;
    for _ in 0..n {
        if !v.send(method, url).await {
            failed += 1;
        }
    }
    let rps = n as f64 / start.elapsed().as_secs_f64();
    Measure {
        rps,
        failed,
        cpu_us: cpu_per_request(cpu, n),
    }
}

fn cpu_per_request(before: Option<u64>, n: usize) -> Option<f64> {
    let after = process_cpu_ns()?;
    Some(after.saturating_sub(before?) as f64 / 1e3 / n as f64)
}

async fn concurrent(
    v: &Variant,
    method: &Method,
    url: &str,
    n: usize,
    concurrency: usize,
) -> Measure {
    let cpu = process_cpu_ns();
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    let per_task = n / concurrency;
    for _ in 0..concurrency {
        let v = v.clone();
        let url = url.to_owned();
        let method = method.clone();
        tasks.spawn(async move {
            let mut failed = 0;
            for _ in 0..per_task {
                if !v.send(&method, &url).await {
                    failed += 1;
                }
            }
            failed
        });
    }
    let mut failed = 0;
    while let Some(done) = tasks.join_next().await {
        failed += done.expect("a client task");
    }
    let done = per_task * concurrency;
    let rps = done as f64 / start.elapsed().as_secs_f64();
    Measure {
        rps,
        failed,
        cpu_us: cpu_per_request(cpu, done),
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

/// The smallest and the largest value, if any.
fn range(v: &[f64]) -> Option<(f64, f64)> {
    let lo = v.iter().copied().min_by(f64::total_cmp)?;
    let hi = v.iter().copied().max_by(f64::total_cmp)?;
    Some((lo, hi))
}

fn main() {
    // `cargo bench` passes `--bench`; nothing else to parse.
    let rounds = env_or("OVERHEAD_ROUNDS", 15).max(1);
    let n = env_or("OVERHEAD_REQUESTS", 10000).max(1);
    let concurrency = env_or("OVERHEAD_CONCURRENCY", 16).max(1);

    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("server runtime");
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind 127.0.0.1");
            addr_tx
                .send(listener.local_addr().expect("local address"))
                .expect("send address");
            let app = Router::new().route("/", get(|| async { "ok" }).post(|| async { "ok" }));
            axum::serve(listener, app).await.expect("serve");
        });
    });
    let addr = addr_rx
        .recv_timeout(Duration::from_secs(10))
        .expect("server started");
    let url = format!("http://{addr}/");

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("client runtime");
    rt.block_on(async {
        let mut variants = variants();
        // For profiling one variant at a time: OVERHEAD_ONLY=2 (0 is bare).
        if let Some(only) = std::env::var("OVERHEAD_ONLY")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
        {
            variants = vec![variants.swap_remove(only.min(variants.len() - 1))];
        }
        // Warm up: connections, allocator, caches.
        let methods = [Method::GET, Method::POST];
        for (_, v) in &variants {
            for method in &methods {
                sequential(v, method, &url, 500).await;
                concurrent(v, method, &url, 1000, concurrency).await;
            }
        }
        let k = variants.len();
        // [variant][mode] -> per-round values; mode = 2 × method (0 GET,
        // 1 POST) + (0 sequential, 1 concurrent).
        let mut rps = vec![[const { Vec::new() }; 4]; k];
        let mut rps_ratio = vec![[const { Vec::new() }; 4]; k];
        let mut rr_ratio = vec![[const { Vec::new() }; 4]; k];
        let mut contract_ratio = vec![[const { Vec::new() }; 4]; k];
        let mut cpu = vec![[const { Vec::new() }; 4]; k];
        let mut cpu_ratio = vec![[const { Vec::new() }; 4]; k];
        let mut failed = vec![0usize; k];
        for round in 0..rounds {
            // Rotate the order every round so no variant always runs first.
            let mut results: Vec<Option<[Measure; 4]>> = (0..k).map(|_| None).collect();
            for j in 0..k {
                let i = (round + j) % k;
                let v = &variants[i].1;
                let (get, post) = (&methods[0], &methods[1]);
                results[i] = Some([
                    sequential(v, get, &url, n).await,
                    concurrent(v, get, &url, n, concurrency).await,
                    sequential(v, post, &url, n).await,
                    concurrent(v, post, &url, n, concurrency).await,
                ]);
            }
            let m: Vec<[Measure; 4]> = results
                .into_iter()
                .map(|r| r.expect("every variant measured"))
                .collect();
            for i in 0..k {
                for mode in 0..4 {
                    rps[i][mode].push(m[i][mode].rps);
                    failed[i] += m[i][mode].failed;
                    rps_ratio[i][mode].push(m[i][mode].rps / m[0][mode].rps);
                    rr_ratio[i][mode].push(m[i][mode].rps / m[REQWEST_RETRY][mode].rps);
                    if let Some(c) = m.get(CONTRACT) {
                        contract_ratio[i][mode].push(m[i][mode].rps / c[mode].rps);
                    }
                    if let (Some(a), Some(b)) = (m[i][mode].cpu_us, m[0][mode].cpu_us) {
                        cpu[i][mode].push(a);
                        cpu_ratio[i][mode].push(a / b);
                    }
                }
            }
            eprintln!("round {}/{rounds} done", round + 1);
        }
        println!(
            "\nSuccess path, {rounds} rounds × {n} requests per variant, method and mode \
             (sequential; {concurrency} concurrent), medians over rounds. Ratios are \
             per-round paired ratios (same round) to the bare client (/bare), to \
             reqwest-retry (/rr) and to the contract written by hand (/contract), then \
             the median, with the range over rounds in brackets for /contract. CPU is the whole process (client and \
             server threads) per request. Failed counts both methods and modes.\n"
        );
        for (method, name) in [(0, "GET"), (1, "POST (keyed by RetryMiddleware)")] {
            println!("\n{name}\n");
            println!(
                "| client | seq req/s | /bare | /rr | /contract | seq CPU µs/req | /bare | \
                 {concurrency}× req/s | /bare | /rr | /contract | {concurrency}× CPU µs/req | /bare |"
            );
            println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
            for (i, (label, _)) in variants.iter().enumerate() {
                let mut line = format!("| {label} |");
                for mode in [2 * method, 2 * method + 1] {
                    let cpu_cell = if cpu[i][mode].is_empty() {
                        "n/a | n/a |".to_owned()
                    } else {
                        format!(
                            " {:.1} | {:.3} |",
                            median(&mut cpu[i][mode]),
                            median(&mut cpu_ratio[i][mode])
                        )
                    };
                    let contract_cell = match range(&contract_ratio[i][mode]) {
                        Some((lo, hi)) => format!(
                            " {:.3} [{lo:.3}–{hi:.3}] |",
                            median(&mut contract_ratio[i][mode])
                        ),
                        None => " n/a |".to_owned(),
                    };
                    line.push_str(&format!(
                        " {:.0} | {:.3} | {:.3} |{contract_cell}{cpu_cell}",
                        median(&mut rps[i][mode]),
                        median(&mut rps_ratio[i][mode]),
                        median(&mut rr_ratio[i][mode]),
                    ));
                }
                println!("{line}");
            }
        }
        println!("\nfailed requests per variant: {failed:?}");
    });
}
