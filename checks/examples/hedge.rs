//! `hedge`: what hedged requests do to the tail, and what they cost.
//!
//! Real sockets: a local server answers 97 % of requests in 2 ms and 3 % in
//! 300 ms (each arrival drawn from a seeded generator, a hedge's copy too).
//! Each round runs the same three phases without hedging and with the
//! default `HedgeConfig`, side by side in one process:
//!
//! - **tail**: `--calls` GETs, `--concurrency` at a time, through the default
//!   policy: p50, p99 and p99.9 of the calls' latency, and the extra load
//!   (requests the server saw beyond one per call);
//! - **posts**: `--posts` POSTs without an idempotency key, hedging opted in
//!   for everything it may hedge: how many reached the server;
//! - **outage**: 200 healthy GETs arm the hedging, then the server answers
//!   every request `503` after 50 ms while `--outage-calls` GETs start over
//!   3 s: the requests it saw per call.
//!
//! ```text
//! cargo run --release --example hedge
//! cargo run --release --example hedge -- --rounds 3 --calls 2000 --concurrency 20
//! ```

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use clap::Parser;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use reqwest_safe_retry::hedging::HedgeConfig;
use reqwest_safe_retry::{
    ReportSlot, RequestOptions, RetryMiddleware, RetryPolicy, RetryReportExt,
};

type AnyResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

#[derive(Parser, Debug)]
#[command(
    name = "hedge",
    about = "Hedged requests against a server with a slow 3 %: the tail, the extra load, \
             unkeyed POSTs and an outage, with and without hedging"
)]
struct Cli {
    /// Rounds; each runs both sides.
    #[arg(long, default_value_t = 1)]
    rounds: u32,
    /// GETs in the tail phase.
    #[arg(long, default_value_t = 2000)]
    calls: usize,
    /// GETs in flight at once in the tail phase.
    #[arg(long, default_value_t = 20)]
    concurrency: usize,
    /// Unkeyed POSTs in the posts phase.
    #[arg(long, default_value_t = 300)]
    posts: usize,
    /// GETs during the outage.
    #[arg(long, default_value_t = 400)]
    outage_calls: usize,
    /// Seed of the server's slow draws.
    #[arg(long, default_value_t = 17)]
    seed: u64,
}

/// The server: slow 3 % of the time, or in an outage.
struct Server {
    rng: Mutex<StdRng>,
    outage: AtomicBool,
    arrivals: AtomicU32,
}

impl Server {
    fn new(seed: u64) -> Arc<Self> {
        Arc::new(Server {
            rng: Mutex::new(StdRng::seed_from_u64(seed)),
            outage: AtomicBool::new(false),
            arrivals: AtomicU32::new(0),
        })
    }

    fn arrivals(&self) -> u32 {
        self.arrivals.load(Ordering::Relaxed)
    }
}

async fn answer(State(server): State<Arc<Server>>) -> (StatusCode, &'static str) {
    server.arrivals.fetch_add(1, Ordering::Relaxed);
    if server.outage.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(50)).await;
        return (StatusCode::SERVICE_UNAVAILABLE, "down");
    }
    let slow = server
        .rng
        .lock()
        .map(|mut rng| rng.random::<f64>() < 0.03)
        .unwrap_or(false);
    let latency = if slow { 300 } else { 2 };
    tokio::time::sleep(Duration::from_millis(latency)).await;
    (StatusCode::OK, "ok")
}

/// Starts a server; returns its base URL and the task serving it.
async fn serve(server: Arc<Server>) -> AnyResult<(String, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    let app = Router::new()
        .route("/item", get(answer).post(answer))
        .with_state(server);
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok((url, task))
}

fn client(policy: RetryPolicy) -> AnyResult<ClientWithMiddleware> {
    Ok(ClientBuilder::new(
        reqwest::Client::builder()
            .pool_max_idle_per_host(512)
            .build()?,
    )
    .with(RetryMiddleware::new(policy))
    .build())
}

fn policy(hedge: Option<HedgeConfig>) -> AnyResult<RetryPolicy> {
    let builder = RetryPolicy::builder();
    Ok(match hedge {
        Some(config) => builder.hedge(config),
        None => builder,
    }
    .build()?)
}

/// The tail phase's figures.
struct Tail {
    p50: Duration,
    p99: Duration,
    p999: Duration,
    arrivals: u32,
    hedges: u64,
    hedge_wins: u64,
    ok: usize,
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    // Casts: a rank within the slice.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let rank = ((sorted.len() as f64) * p).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

async fn tail(cli: &Cli, seed: u64, hedge: Option<HedgeConfig>) -> AnyResult<Tail> {
    let server = Server::new(seed);
    let (url, serving) = serve(server.clone()).await?;
    let policy = policy(hedge)?;
    let client = client(policy.clone())?;
    let url = format!("{url}/item");
    let next = Arc::new(AtomicU32::new(0));
    let calls = u32::try_from(cli.calls)?;
    let mut workers = Vec::new();
    for _ in 0..cli.concurrency {
        let (client, url, next) = (client.clone(), url.clone(), next.clone());
        workers.push(tokio::spawn(async move {
            let mut seen = Vec::new();
            while next.fetch_add(1, Ordering::Relaxed) < calls {
                let started = Instant::now();
                let ok = matches!(client.get(&url).send().await, Ok(r) if r.status().is_success());
                seen.push((started.elapsed(), ok));
            }
            seen
        }));
    }
    let mut latencies = Vec::with_capacity(cli.calls);
    let mut ok = 0;
    for w in workers {
        for (latency, success) in w.await? {
            latencies.push(latency);
            ok += usize::from(success);
        }
    }
    latencies.sort();
    serving.abort();
    let m = policy.metrics().snapshot();
    Ok(Tail {
        p50: percentile(&latencies, 0.50),
        p99: percentile(&latencies, 0.99),
        p999: percentile(&latencies, 0.999),
        arrivals: server.arrivals(),
        hedges: m.hedges,
        hedge_wins: m.hedge_wins,
        ok,
    })
}

/// Unkeyed POSTs, with hedging opted in for all it may hedge: the requests
/// the server saw, and the hedges the reports name.
async fn posts(cli: &Cli, seed: u64, hedge: Option<HedgeConfig>) -> AnyResult<(u32, u32)> {
    let server = Server::new(seed);
    let (url, serving) = serve(server.clone()).await?;
    let everything = hedge.map(|c| HedgeConfig {
        idempotent_methods: true,
        keyed: true,
        ..c
    });
    let client = client(policy(everything)?)?;
    let url = format!("{url}/item");
    let mut hedges = 0;
    let mut tasks = Vec::new();
    for chunk in 0..cli.concurrency {
        let (client, url) = (client.clone(), url.clone());
        let share = cli.posts / cli.concurrency + usize::from(chunk < cli.posts % cli.concurrency);
        tasks.push(tokio::spawn(async move {
            let mut hedges = 0;
            for _ in 0..share {
                let r = client
                    .post(&url)
                    .body("{}")
                    .with_extension(RequestOptions::new().no_idempotency_key())
                    .send()
                    .await;
                if let Ok(r) = r {
                    hedges += r.retry_report().map_or(0, |rep| rep.hedges());
                }
            }
            hedges
        }));
    }
    for t in tasks {
        hedges += t.await?;
    }
    serving.abort();
    Ok((server.arrivals(), hedges))
}

/// The outage phase: requests the server saw per call, the longest call,
/// and the hedges sent during the outage.
async fn outage(
    cli: &Cli,
    seed: u64,
    hedge: Option<HedgeConfig>,
) -> AnyResult<(f64, Duration, u64)> {
    let server = Server::new(seed);
    let (url, serving) = serve(server.clone()).await?;
    let policy = policy(hedge)?;
    let client = client(policy.clone())?;
    let url = format!("{url}/item");
    for _ in 0..200 {
        client.get(&url).send().await?;
    }
    let before = server.arrivals();
    let hedges_before = policy.metrics().snapshot().hedges;
    server.outage.store(true, Ordering::Relaxed);
    let t0 = Instant::now();
    let step = Duration::from_secs(3) / u32::try_from(cli.outage_calls.max(1))?;
    let mut tasks = Vec::new();
    for i in 0..cli.outage_calls {
        let (client, url) = (client.clone(), url.clone());
        let start_at = t0 + step * u32::try_from(i)?;
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep_until(start_at.into()).await;
            let started = Instant::now();
            let slot = ReportSlot::new();
            let _ = client.get(&url).with_extension(slot).send().await;
            started.elapsed()
        }));
    }
    let mut longest = Duration::ZERO;
    for t in tasks {
        longest = longest.max(t.await?);
    }
    serving.abort();
    let seen = f64::from(server.arrivals() - before);
    // Casts: a count of calls.
    #[allow(clippy::cast_precision_loss)]
    let per_call = seen / cli.outage_calls as f64;
    let hedges = policy.metrics().snapshot().hedges - hedges_before;
    Ok((per_call, longest, hedges))
}

fn ms(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e3)
}

#[tokio::main]
async fn main() -> AnyResult<()> {
    let cli = Cli::parse();
    println!(
        "| round | hedging | ok | p50 (ms) | p99 (ms) | p99.9 (ms) | requests / call | hedges (won) \
         | unkeyed POSTs: requests / sent (hedges) | outage: requests / call | outage: longest call (ms) | outage: hedges |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut ratios = Vec::new();
    for round in 1..=cli.rounds {
        let seed = cli.seed + u64::from(round);
        let mut p99 = Vec::new();
        for (label, hedge) in [("off", None), ("on", Some(HedgeConfig::default()))] {
            let t = tail(&cli, seed, hedge).await?;
            let (post_requests, post_hedges) = posts(&cli, seed, hedge).await?;
            let (per_call, longest, outage_hedges) = outage(&cli, seed, hedge).await?;
            // Casts: counts of requests.
            #[allow(clippy::cast_precision_loss)]
            let load = f64::from(t.arrivals) / cli.calls as f64;
            println!(
                "| {round} | {label} | {}/{} | {} | {} | {} | {load:.3} | {} ({}) | {post_requests} / {} ({post_hedges}) | {per_call:.3} | {} | {outage_hedges} |",
                t.ok,
                cli.calls,
                ms(t.p50),
                ms(t.p99),
                ms(t.p999),
                t.hedges,
                t.hedge_wins,
                cli.posts,
                ms(longest),
            );
            p99.push(t.p99);
        }
        ratios.push(p99[1].as_secs_f64() / p99[0].as_secs_f64());
    }
    println!();
    for (round, ratio) in ratios.iter().enumerate() {
        println!(
            "round {}: p99 with hedging / without = {ratio:.3}",
            round + 1
        );
    }
    Ok(())
}
