//! What the client does, call by call, against a flaky payments endpoint.
//!
//! ```text
//! cargo run --example demo
//! cargo run --example demo -- --help
//! ```
//!
//! The demo starts a small payments server on 127.0.0.1 (in-process, plain
//! tokio sockets so it can misbehave in ways a framework would not let it),
//! sends a handful of calls through `RetryMiddleware` with the default policy
//! (only the backoff base is lowered, to keep the demo short), and prints a
//! table of what happened to each: attempts, delays, the Idempotency-Key and
//! why the loop stopped. Delays are real: the 503 asks for `Retry-After: 1`.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::Parser;
use reqwest_middleware::ClientBuilder;
use reqwest_safe_retry::admission::{AdaptiveAdmission, AdaptiveConfig, Partition};
use reqwest_safe_retry::{ReportSlot, RequestOptions, RetryMiddleware, RetryPolicy};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// How many times the server has seen each (path, key).
type Seen = Arc<Mutex<HashMap<(String, String), u32>>>;

/// The demo takes no options; `--help` says what it does instead of
/// doing it.
#[derive(Parser, Debug)]
#[command(
    name = "demo",
    about = "What the client does, call by call, against a flaky payments endpoint",
    long_about = "What the client does, call by call, against a flaky payments endpoint.\n\n\
        Starts a small payments server on 127.0.0.1 that misbehaves on purpose \
        (503 with Retry-After: 1, 409 while in progress, a connection reset, \
        400), sends a handful of calls through RetryMiddleware with the default \
        policy (a lower backoff base, to keep it short) and prints a table: \
        status, attempts, delays, the Idempotency-Key and why each call stopped. \
        The delays are real: it takes a few seconds."
)]
struct Args {}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    Args::parse();
    let addr = start_server().await?;
    let base = format!("http://{addr}");

    // The default admission, kept at hand to show its tokens at the end.
    let admission = Arc::new(AdaptiveAdmission::new(AdaptiveConfig::default())?);
    let policy = RetryPolicy::builder()
        .backoff(Duration::from_millis(50), Duration::from_secs(2))
        .shared_admission(admission.clone())
        .build()?;
    let client = ClientBuilder::new(reqwest::Client::new())
        .with(RetryMiddleware::new(policy.clone()))
        .build();

    let calls: Vec<(&str, reqwest_middleware::RequestBuilder)> = vec![
        (
            "POST /payments: 503 + Retry-After: 1, then 201",
            client.post(format!("{base}/payments/busy")).body(PAYMENT),
        ),
        (
            "POST /payments: 409 while the original is in progress",
            client
                .post(format!("{base}/payments/in-progress"))
                .body(PAYMENT),
        ),
        (
            "POST /payments: connection reset, then 201",
            client.post(format!("{base}/payments/reset")).body(PAYMENT),
        ),
        (
            "POST /payments: 400, a bad request",
            client.post(format!("{base}/payments/invalid")).body("{}"),
        ),
        (
            "POST /payments without a key: 503",
            client
                .post(format!("{base}/payments/busy"))
                .with_extension(RequestOptions::new().no_idempotency_key())
                .body(PAYMENT),
        ),
        (
            "GET /payments: 503 every time",
            client.get(format!("{base}/payments/down")),
        ),
    ];

    println!(
        "{:<55} {:>6} {:>8} {:<17} {:<38} stopped",
        "call", "status", "attempts", "delays (ms)", "idempotency key"
    );
    for (name, request) in calls {
        // The slot holds the report whatever the result, errors included.
        let slot = ReportSlot::new();
        let status = match request.with_extension(slot.clone()).send().await {
            Ok(response) => response.status().as_u16().to_string(),
            Err(_) => "error".to_owned(),
        };
        let report = slot.take();
        let Some(report) = report else {
            println!("{name:<55} {status:>6} (no report)");
            continue;
        };
        let delays: Vec<String> = report
            .delays()
            .iter()
            .map(|d| d.as_millis().to_string())
            .collect();
        println!(
            "{:<55} {:>6} {:>8} {:<17} {:<38} {}",
            name,
            status,
            report.attempts(),
            if delays.is_empty() {
                "-".to_owned()
            } else {
                delays.join(", ")
            },
            report.idempotency_key().unwrap_or("-"),
            report.stop_reason(),
        );
    }

    let m = policy.metrics().snapshot();
    println!();
    println!(
        "counters: {} calls, {} first-attempt failures, {} retries, {} final failures, \
         {} Retry-After honoured, budget left {:.1} tokens",
        m.calls,
        m.first_attempt_failures,
        m.retries,
        m.final_failures,
        m.retry_after_honoured,
        admission.tokens(Partition::of_url(&base.parse()?)),
    );
    Ok(())
}

const PAYMENT: &str = r#"{"account":"acme","amount":1200}"#;

async fn start_server() -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let seen: Seen = Arc::default();
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            tokio::spawn(serve(socket, seen.clone()));
        }
    });
    Ok(addr)
}

/// Answers one request on one connection, by path and by how many times this
/// Idempotency-Key was seen on it.
async fn serve(mut socket: TcpStream, seen: Seen) {
    let Some((path, key)) = read_request(&mut socket).await else {
        return;
    };
    let n = {
        let mut seen = seen.lock().unwrap_or_else(|p| p.into_inner());
        let n = seen.entry((path.clone(), key.clone())).or_insert(0);
        *n += 1;
        *n
    };
    let response = match (path.as_str(), n) {
        ("/payments/busy", _) if key.is_empty() => status(503, "Retry-After: 1\r\n"),
        ("/payments/busy", 1) => status(503, "Retry-After: 1\r\n"),
        ("/payments/in-progress", 1) => status(409, "Retry-After: 0\r\n"),
        ("/payments/reset", 1) => {
            // Drop the connection with a reset after reading the request.
            let _ = socket.set_zero_linger();
            return;
        }
        ("/payments/invalid", _) => status(400, ""),
        ("/payments/down", _) => status(503, ""),
        _ => created(),
    };
    let _ = socket.write_all(response.as_bytes()).await;
    let _ = socket.shutdown().await;
}

fn status(code: u16, headers: &str) -> String {
    let reason = match code {
        400 => "Bad Request",
        409 => "Conflict",
        _ => "Service Unavailable",
    };
    format!("HTTP/1.1 {code} {reason}\r\n{headers}Content-Length: 0\r\nConnection: close\r\n\r\n")
}

fn created() -> String {
    let body = r#"{"id":"pay_1","account":"acme","amount":1200}"#;
    format!(
        "HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    )
}

/// Reads a request's head and body; returns its path and Idempotency-Key.
async fn read_request(socket: &mut TcpStream) -> Option<(String, String)> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = socket.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let path = head.split_whitespace().nth(1)?.to_owned();
    let header = |name: &str| {
        head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_owned())
        })
    };
    let length: usize = header("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    while buf.len() < head_end + length {
        let n = socket.read(&mut chunk).await.ok()?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    Some((path, header("idempotency-key").unwrap_or_default()))
}
