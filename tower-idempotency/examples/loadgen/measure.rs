//! One measurement: an axum server in the server runtime, keep-alive
//! clients in the client runtime sending keyed POSTs, their latencies
//! and the server threads' CPU time.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::header;
use axum::Router;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Runtime;
use tokio::sync::oneshot;
use tower_idempotency::IDEMPOTENCY_KEY;

use crate::args::Args;

/// The clients' request body.
const REQUEST: &str = r#"{"amount":1234,"currency":"eur"}"#;

/// One measurement.
#[derive(Clone, Debug)]
pub(crate) struct Sample {
    pub(crate) rps: f64,
    /// CPU time of the server runtime's threads per recorded request
    /// (`None` where the kernel does not tell).
    pub(crate) server_cpu: Option<Duration>,
    pub(crate) p50: Duration,
    pub(crate) p99: Duration,
    pub(crate) ok: u64,
    pub(crate) non_2xx: u64,
    pub(crate) errors: u64,
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

/// Serves `app` and drives it with `clients` clients for the warm-up,
/// then for the measured seconds.
pub(crate) fn measure(
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
