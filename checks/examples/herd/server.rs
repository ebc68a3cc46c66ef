//! The local HTTP servers of the socket runs and the clients that load
//! them: a server fails for a window, then serves `capacity` requests per
//! 50 ms bucket and answers 503 to the rest (or fails one request in N);
//! logical operations go through the real middleware, and each run comes
//! back as an `Outcome` (one server) or `HostCalls` (one per host).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use reqwest_middleware::ClientBuilder;
use reqwest_safe_retry::observability::MetricsSnapshot;
use reqwest_safe_retry::{ReportSlot, RetryMiddleware, RetryPolicy};

use crate::{table, AnyResult};

pub(crate) const BUCKET: Duration = Duration::from_millis(50);
/// Buckets recorded: 60 s of traffic; later arrivals land in the last.
const BUCKETS: usize = 1200;

pub(crate) struct Server {
    t0: Instant,
    fail_for: Duration,
    capacity: u32,
    /// Fail one request in this many (counting from the first), if set.
    fail_every: Option<u32>,
    served: AtomicU32,
    arrivals: Vec<AtomicU32>,
    admitted: Vec<AtomicU32>,
}

impl Server {
    fn bucket(&self) -> (Duration, usize) {
        let elapsed = self.t0.elapsed();
        let i = (elapsed.as_millis() / BUCKET.as_millis()) as usize;
        (elapsed, i.min(BUCKETS - 1))
    }
}

/// A host of a multi-host run: it fails everything for `fail_for`, then
/// one request in `fail_every`.
pub(crate) fn host(fail_for: Duration, fail_every: Option<u32>) -> Arc<Server> {
    Arc::new(Server {
        t0: Instant::now(),
        fail_for,
        capacity: u32::MAX,
        fail_every,
        served: AtomicU32::new(0),
        arrivals: (0..BUCKETS).map(|_| AtomicU32::new(0)).collect(),
        admitted: (0..BUCKETS).map(|_| AtomicU32::new(0)).collect(),
    })
}

/// One host's calls in a multi-host run.
pub(crate) struct HostCalls {
    /// Calls made.
    pub(crate) calls: usize,
    /// Calls that got a 2xx.
    pub(crate) succeeded: usize,
    /// Every call's latency.
    pub(crate) latencies: Vec<Duration>,
    /// The latencies of the calls the circuit breaker refused.
    pub(crate) refused: Vec<Duration>,
    /// The longest admission wait of a call.
    pub(crate) max_admission_wait: Duration,
    /// Requests the host saw, per 50 ms bucket.
    pub(crate) arrivals: Vec<u32>,
}

/// Runs `hosts` at once through one client and `policy`: each host is
/// its own server on its own port (so its own partition) and gets
/// `calls` calls evenly spread over `spread`.
pub(crate) async fn run_hosts(
    hosts: &[(Arc<Server>, usize)],
    spread: Duration,
    policy: RetryPolicy,
) -> AnyResult<Vec<HostCalls>> {
    let mut urls = Vec::new();
    let mut serving = Vec::new();
    for (server, _) in hosts {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        urls.push(format!("http://{}/row", listener.local_addr()?));
        let app = Router::new()
            .route("/row", get(handle))
            .with_state(server.clone());
        serving.push(tokio::spawn(
            async move { axum::serve(listener, app).await },
        ));
    }
    let client = ClientBuilder::new(reqwest::Client::builder().build()?)
        .with(RetryMiddleware::new(policy))
        .build();
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for (h, (url, &(_, calls))) in urls.iter().zip(hosts).enumerate() {
        let step = spread / u32::try_from(calls.max(1)).unwrap_or(u32::MAX);
        for i in 0..calls {
            let client = client.clone();
            let url = url.clone();
            let start_at = t0 + step * u32::try_from(i).unwrap_or(u32::MAX);
            tasks.push(tokio::spawn(async move {
                tokio::time::sleep_until(start_at.into()).await;
                let started = Instant::now();
                let slot = ReportSlot::new();
                let result = client.get(&url).with_extension(slot.clone()).send().await;
                let latency = started.elapsed();
                let ok = matches!(&result, Ok(r) if r.status().is_success());
                (h, ok, slot.take(), latency)
            }));
        }
    }
    let mut out: Vec<HostCalls> = hosts
        .iter()
        .map(|&(_, calls)| HostCalls {
            calls,
            succeeded: 0,
            latencies: Vec::with_capacity(calls),
            refused: Vec::new(),
            max_admission_wait: Duration::ZERO,
            arrivals: Vec::new(),
        })
        .collect();
    for task in tasks {
        let (h, ok, report, latency) = task.await?;
        let o = &mut out[h];
        o.latencies.push(latency);
        o.succeeded += usize::from(ok);
        if let Some(r) = report {
            o.max_admission_wait = o.max_admission_wait.max(r.admission_wait());
            if r.stop_reason().as_str() == "circuit_open" {
                o.refused.push(latency);
            }
        }
    }
    for (o, (server, _)) in out.iter_mut().zip(hosts) {
        o.arrivals = server
            .arrivals
            .iter()
            .map(|a| a.load(Ordering::Relaxed))
            .collect();
    }
    for s in serving {
        s.abort();
    }
    Ok(out)
}

async fn handle(State(server): State<Arc<Server>>) -> (StatusCode, &'static str) {
    let (elapsed, i) = server.bucket();
    server.arrivals[i].fetch_add(1, Ordering::Relaxed);
    if elapsed < server.fail_for {
        return (StatusCode::SERVICE_UNAVAILABLE, "blip");
    }
    let n = server.served.fetch_add(1, Ordering::Relaxed);
    if server.fail_every.is_some_and(|every| n % every == 0) {
        return (StatusCode::SERVICE_UNAVAILABLE, "flaky");
    }
    if server.admitted[i].fetch_add(1, Ordering::Relaxed) >= server.capacity {
        return (StatusCode::SERVICE_UNAVAILABLE, "over capacity");
    }
    (StatusCode::OK, "ok")
}

/// One scenario's setup.
#[derive(Clone)]
pub(crate) struct Scenario {
    pub(crate) ops: usize,
    pub(crate) fail_for: Duration,
    pub(crate) capacity: u32,
    /// Operations start evenly spread over this (zero: all together).
    pub(crate) spread: Duration,
    /// Fail one request in this many, after the failing window.
    pub(crate) fail_every: Option<u32>,
}

/// What one strategy did.
pub(crate) struct Outcome {
    pub(crate) label: String,
    pub(crate) ops: usize,
    pub(crate) attempts: u64,
    pub(crate) arrivals: Vec<u32>,
    pub(crate) succeeded: usize,
    /// Time from the start until the last successful operation ended.
    pub(crate) last_success: Option<Duration>,
    pub(crate) latencies: Vec<Duration>,
    pub(crate) stop_reasons: BTreeMap<String, usize>,
    /// The policy's counters after the run (warming calls included).
    pub(crate) metrics: MetricsSnapshot,
    /// The longest time a call waited for admission.
    pub(crate) max_admission_wait: Duration,
}

impl Outcome {
    pub(crate) fn amplification(&self) -> f64 {
        self.attempts as f64 / self.ops.max(1) as f64
    }

    pub(crate) fn peak(&self) -> u32 {
        self.arrivals.iter().copied().max().unwrap_or(0)
    }

    pub(crate) fn percentile(&self, p: f64) -> Duration {
        table::percentile(&self.latencies, p)
    }
}

/// Runs `scenario` against a fresh server with a fresh client and policy.
pub(crate) async fn run(
    label: &str,
    scenario: &Scenario,
    policy: RetryPolicy,
) -> AnyResult<Outcome> {
    let server = Arc::new(Server {
        t0: Instant::now(),
        fail_for: scenario.fail_for,
        capacity: scenario.capacity,
        fail_every: scenario.fail_every,
        served: AtomicU32::new(0),
        arrivals: (0..BUCKETS).map(|_| AtomicU32::new(0)).collect(),
        admitted: (0..BUCKETS).map(|_| AtomicU32::new(0)).collect(),
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/row", listener.local_addr()?);
    let app = Router::new()
        .route("/row", get(handle))
        .with_state(server.clone());
    let serving = tokio::spawn(async move { axum::serve(listener, app).await });

    let middleware = RetryMiddleware::new(policy);
    let client = ClientBuilder::new(
        reqwest::Client::builder()
            .pool_max_idle_per_host(scenario.ops)
            .build()?,
    )
    .with(middleware.clone())
    .build();

    let t0 = server.t0;
    let step = scenario.spread / u32::try_from(scenario.ops.max(1)).unwrap_or(u32::MAX);
    let mut tasks = Vec::with_capacity(scenario.ops);
    for i in 0..scenario.ops {
        let client = client.clone();
        let url = url.clone();
        let start_at = t0 + step * u32::try_from(i).unwrap_or(u32::MAX);
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep_until(start_at.into()).await;
            let started = Instant::now();
            let slot = ReportSlot::new();
            let result = client.get(&url).with_extension(slot.clone()).send().await;
            let ended = Instant::now();
            let report = slot.take();
            let ok = matches!(&result, Ok(r) if r.status().is_success());
            (ok, report, ended - started, ended - t0)
        }));
    }
    let mut out = Outcome {
        label: label.to_owned(),
        ops: scenario.ops,
        attempts: 0,
        arrivals: Vec::new(),
        succeeded: 0,
        last_success: None,
        latencies: Vec::with_capacity(scenario.ops),
        stop_reasons: BTreeMap::new(),
        metrics: MetricsSnapshot::default(),
        max_admission_wait: Duration::ZERO,
    };
    for task in tasks {
        let (ok, report, latency, end) = task.await?;
        out.latencies.push(latency);
        if ok {
            out.succeeded += 1;
            out.last_success = Some(out.last_success.map_or(end, |t| t.max(end)));
        }
        let reason = match &report {
            Some(r) => {
                out.attempts += u64::from(r.attempts());
                out.max_admission_wait = out.max_admission_wait.max(r.admission_wait());
                r.stop_reason().as_str().to_owned()
            }
            None => "no report".to_owned(),
        };
        *out.stop_reasons.entry(reason).or_default() += 1;
    }
    out.metrics = middleware.policy().metrics().snapshot();
    serving.abort();
    let arrivals: Vec<u32> = server
        .arrivals
        .iter()
        .map(|a| a.load(Ordering::Relaxed))
        .collect();
    let last = arrivals.iter().rposition(|&a| a > 0).map_or(0, |i| i + 1);
    out.arrivals = arrivals[..last].to_vec();
    let seen: u64 = out.arrivals.iter().map(|&a| u64::from(a)).sum();
    if seen != out.attempts {
        eprintln!(
            "note: {label}: the server saw {seen} requests, the reports count {} attempts",
            out.attempts
        );
    }
    Ok(out)
}
