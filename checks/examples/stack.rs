//! The layered experiment: a driver calls a chain of 1–4 tiers in front of
//! a database, every hop using the same client (this crate, reqwest-retry
//! with 3 retries, or no retries), and the database counts what reaches it.
//!
//! ```text
//! cargo run --release --example stack
//! cargo run --release --example stack -- --depths 3 --clients ours --scenarios blip
//! ```
//!
//! Scenarios (each cell starts fresh servers and clients):
//!
//! - `outage`: the database answers 503 to everything; driver deadline 2 s.
//! - `blip`: the database answers 503 for the first 1.5 s, then 200; every
//!   driver call starts inside the blip; driver deadline 10 s.
//! - `slow`: the database takes 3 s per request; driver deadline 2 s.
//! - `slow-detached`: the same, but each tier makes its call on a task of
//!   its own that outlives the handler, as behind a proxy that keeps the
//!   upstream request going when its caller hangs up (this crate's tiers
//!   carry their `InheritedDeadline` into that task).
//!
//! Columns: database arrivals per driver call; driver calls that got a 200
//! before their deadline; database requests that arrived after their
//! driver's deadline; database work done after the driver's deadline (the
//! sum, over requests, of the time a handler still ran past it).
//!
//! Every hop of `ours` is wrapped in `InheritDeadlineLayer` and uses
//! `RetryPolicy::default()`; `reqwest-retry` uses
//! `ExponentialBackoff` with the same 100 ms base and 10 s cap and 3
//! retries; `none` is a plain reqwest client. The driver gives up at its
//! deadline whatever the client.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use clap::{Parser, ValueEnum};
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use reqwest_retry::policies::ExponentialBackoff;
use reqwest_retry::RetryTransientMiddleware;
use reqwest_safe_retry::deadline::{GiveUp, InheritDeadlineLayer, InheritedDeadline};
use reqwest_safe_retry::{ReportSlot, RequestOptions, RetryMiddleware, RetryPolicy};

/// The driver's deadline, as µs since the cell's start: every hop passes
/// it on, so the database can tell work nobody waits for.
const DRIVER_DEADLINE: &str = "x-driver-deadline-us";

#[derive(Parser, Debug)]
#[command(about = "Chains of tiers in front of a failing database: arrivals, success, late work")]
struct Args {
    /// Chain lengths to measure.
    #[arg(long, value_delimiter = ',', default_value = "1,2,3,4")]
    depths: Vec<usize>,
    /// Driver calls per cell.
    #[arg(long, default_value_t = 100)]
    calls: usize,
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "outage,blip,slow,slow-detached"
    )]
    scenarios: Vec<Scenario>,
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "ours,reqwest-retry,none"
    )]
    clients: Vec<Kind>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Scenario {
    Outage,
    Blip,
    Slow,
    SlowDetached,
}

impl Scenario {
    fn driver_deadline(self) -> Duration {
        match self {
            Scenario::Blip => Duration::from_secs(10),
            _ => Duration::from_secs(2),
        }
    }

    /// Over how long the driver's calls start.
    fn span(self) -> Duration {
        match self {
            Scenario::Outage => Duration::from_secs(2),
            Scenario::Blip => Duration::from_millis(1500),
            _ => Duration::from_secs(1),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Kind {
    Ours,
    ReqwestRetry,
    None,
}

fn client(kind: Kind) -> ClientWithMiddleware {
    let builder = ClientBuilder::new(reqwest::Client::new());
    match kind {
        Kind::Ours => builder
            .with(RetryMiddleware::new(RetryPolicy::default()))
            .build(),
        Kind::ReqwestRetry => builder
            .with(RetryTransientMiddleware::new_with_policy(
                ExponentialBackoff::builder()
                    .retry_bounds(Duration::from_millis(100), Duration::from_secs(10))
                    .build_with_max_retries(3),
            ))
            .build(),
        Kind::None => builder.build(),
    }
}

/// The database and what reached it.
struct Db {
    start: Instant,
    scenario: Scenario,
    arrivals: AtomicUsize,
    late_arrivals: AtomicUsize,
    late_work_us: AtomicU64,
    in_flight: AtomicUsize,
}

/// A handler at work; on drop (done, or cancelled when its caller hung
/// up) it adds the time it ran past the driver's deadline.
struct Work<'a> {
    db: &'a Db,
    start: Instant,
    deadline: Instant,
}

impl Drop for Work<'_> {
    fn drop(&mut self) {
        let from = self.start.max(self.deadline);
        let late = Instant::now().saturating_duration_since(from);
        let us = u64::try_from(late.as_micros()).unwrap_or(u64::MAX);
        self.db.late_work_us.fetch_add(us, Ordering::SeqCst);
        self.db.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

fn driver_deadline(start: Instant, headers: &HeaderMap) -> Instant {
    let us = headers
        .get(DRIVER_DEADLINE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or(u64::MAX / 2);
    start + Duration::from_micros(us)
}

async fn database(State(db): State<Arc<Db>>, headers: HeaderMap) -> StatusCode {
    let now = Instant::now();
    db.arrivals.fetch_add(1, Ordering::SeqCst);
    let deadline = driver_deadline(db.start, &headers);
    if now > deadline {
        db.late_arrivals.fetch_add(1, Ordering::SeqCst);
    }
    db.in_flight.fetch_add(1, Ordering::SeqCst);
    let _work = Work {
        db: &db,
        start: now,
        deadline,
    };
    match db.scenario {
        Scenario::Outage => StatusCode::SERVICE_UNAVAILABLE,
        Scenario::Blip if now - db.start < Duration::from_millis(1500) => {
            StatusCode::SERVICE_UNAVAILABLE
        }
        Scenario::Blip => StatusCode::OK,
        Scenario::Slow | Scenario::SlowDetached => {
            tokio::time::sleep(Duration::from_secs(3)).await;
            StatusCode::OK
        }
    }
}

/// One tier: calls the next hop with its client.
struct Hop {
    client: ClientWithMiddleware,
    next: String,
    kind: Kind,
    detached: bool,
}

async fn call_next(hop: Arc<Hop>, deadline: Option<String>) -> Response {
    let mut request = hop.client.get(&hop.next);
    if let Some(d) = deadline {
        request = request.header(DRIVER_DEADLINE, d);
    }
    let slot = ReportSlot::new();
    match request.with_extension(slot.clone()).send().await {
        Ok(response) => response.status().into_response(),
        Err(_) => match slot.take().and_then(|r| GiveUp::for_report(&r)) {
            Some(give_up) if hop.kind == Kind::Ours => give_up.into_response(),
            _ => StatusCode::BAD_GATEWAY.into_response(),
        },
    }
}

async fn tier(State(hop): State<Arc<Hop>>, headers: HeaderMap) -> Response {
    let deadline = headers
        .get(DRIVER_DEADLINE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    if !hop.detached {
        return call_next(hop, deadline).await;
    }
    // A task that outlives this handler: the call goes on when the caller
    // hangs up. The inherited deadline goes with it only when carried.
    let scope = InheritedDeadline::current();
    let call = call_next(hop, deadline);
    let task = tokio::spawn(async move {
        match scope {
            Some(scope) => scope.scope(call).await,
            None => call.await,
        }
    });
    task.await
        .unwrap_or_else(|_| StatusCode::BAD_GATEWAY.into_response())
}

async fn serve(router: Router) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a free port");
    let addr = listener.local_addr().expect("a bound address");
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    (addr, task)
}

struct Row {
    arrivals_per_call: f64,
    success: usize,
    late_arrivals: usize,
    late_work: Duration,
}

async fn cell(scenario: Scenario, depth: usize, kind: Kind, calls: usize) -> Row {
    let start = Instant::now();
    let db = Arc::new(Db {
        start,
        scenario,
        arrivals: AtomicUsize::new(0),
        late_arrivals: AtomicUsize::new(0),
        late_work_us: AtomicU64::new(0),
        in_flight: AtomicUsize::new(0),
    });
    let mut servers = Vec::new();
    let (addr, task) = serve(Router::new().fallback(database).with_state(db.clone())).await;
    servers.push(task);
    let mut next = format!("http://{addr}/");
    for _ in 0..depth {
        let hop = Arc::new(Hop {
            client: client(kind),
            next: next.clone(),
            kind,
            detached: scenario == Scenario::SlowDetached,
        });
        let router = Router::new().fallback(tier).with_state(hop);
        let router = if kind == Kind::Ours {
            router.layer(InheritDeadlineLayer::new())
        } else {
            router
        };
        let (addr, task) = serve(router).await;
        servers.push(task);
        next = format!("http://{addr}/");
    }

    let driver = client(kind);
    let deadline = scenario.driver_deadline();
    let gap = scenario.span() / u32::try_from(calls.max(1)).unwrap_or(u32::MAX);
    let mut handles = Vec::with_capacity(calls);
    for i in 0..calls {
        let at = start + gap * u32::try_from(i).unwrap_or(u32::MAX);
        tokio::time::sleep_until(at.into()).await;
        let driver = driver.clone();
        let url = next.clone();
        handles.push(tokio::spawn(async move {
            // The deadline runs from when the call really starts.
            let ends = (Instant::now() + deadline).saturating_duration_since(start);
            let request = driver
                .get(url)
                .header(DRIVER_DEADLINE, ends.as_micros().to_string())
                .with_extension(RequestOptions::new().deadline(deadline));
            matches!(
                tokio::time::timeout(deadline, request.send()).await,
                Ok(Ok(r)) if r.status() == StatusCode::OK
            )
        }));
    }
    let mut success = 0;
    for h in handles {
        success += usize::from(h.await.unwrap_or(false));
    }
    // Let the work nobody waits for finish (or be cancelled) before
    // counting it; bounded, for a tier that never lets go.
    let settle = Instant::now() + Duration::from_secs(20);
    tokio::time::sleep(Duration::from_millis(200)).await;
    while db.in_flight.load(Ordering::SeqCst) > 0 && Instant::now() < settle {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for s in servers {
        s.abort();
    }
    Row {
        arrivals_per_call: db.arrivals.load(Ordering::SeqCst) as f64 / calls as f64,
        success,
        late_arrivals: db.late_arrivals.load(Ordering::SeqCst),
        late_work: Duration::from_micros(db.late_work_us.load(Ordering::SeqCst)),
    }
}

/// The name a value has on the command line.
fn name<T: ValueEnum>(value: &T) -> String {
    value
        .to_possible_value()
        .map_or_else(String::new, |p| p.get_name().to_owned())
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    println!(
        "| scenario | depth | client | DB arrivals / call | driver success | DB arrivals after deadline | DB work after deadline |"
    );
    println!("|---|---|---|---|---|---|---|");
    for &scenario in &args.scenarios {
        for &depth in &args.depths {
            for &kind in &args.clients {
                let row = cell(scenario, depth, kind, args.calls).await;
                println!(
                    "| {} | {depth} | {} | {:.2} | {}/{} | {} | {:.1} s |",
                    name(&scenario),
                    name(&kind),
                    row.arrivals_per_call,
                    row.success,
                    args.calls,
                    row.late_arrivals,
                    row.late_work.as_secs_f64(),
                );
            }
        }
    }
}
