//! A small curl-like command for any URL, through `RetryMiddleware`.
//!
//! ```text
//! call [OPTIONS] URL
//!   -X, --method METHOD        default GET
//!   -d, --data STRING          request body
//!   -H, --header 'Name: value' repeatable
//!   --max-attempts N           --deadline SECS      --attempt-timeout SECS
//!   --base-ms N                --cap-ms N           --jitter none|full|equal|decorrelated
//!   --idempotency-key KEY      use this key on every attempt
//!   --no-idempotency-key       attach none
//!   --seed N                   seed the random source
//!   --json                     last line of stderr is the report as JSON
//! ```
//!
//! The response body goes to stdout. With `--json` the last line of stderr is
//! one JSON object: `status`, `attempts`, `delays_ms`, `idempotency_key`,
//! `stop_reason` and `error`. Exit code 0 when the final status is 2xx, 1
//! otherwise, 2 for a usage error.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use reqwest_middleware::ClientBuilder;
use reqwest_safe_retry::{
    Jitter, RequestOptions, RetryError, RetryMiddleware, RetryPolicy, RetryReport,
};

#[derive(Parser, Debug)]
#[command(
    name = "call",
    about = "Send one HTTP request through reqwest-safe-retry"
)]
struct Args {
    /// The URL to call.
    url: String,
    /// The request method.
    #[arg(short = 'X', long, default_value = "GET")]
    method: String,
    /// The request body.
    #[arg(short = 'd', long)]
    data: Option<String>,
    /// A request header, 'Name: value'; repeatable.
    #[arg(short = 'H', long = "header")]
    headers: Vec<String>,
    /// Most attempts, the first included.
    #[arg(long)]
    max_attempts: Option<u32>,
    /// Total time for the call, in seconds.
    #[arg(long, value_name = "SECS")]
    deadline: Option<f64>,
    /// Time limit for each attempt, in seconds.
    #[arg(long, value_name = "SECS")]
    attempt_timeout: Option<f64>,
    /// The first backoff ceiling, in milliseconds.
    #[arg(long, value_name = "N")]
    base_ms: Option<u64>,
    /// The largest backoff ceiling, in milliseconds.
    #[arg(long, value_name = "N")]
    cap_ms: Option<u64>,
    /// The jitter mode.
    #[arg(long, value_enum)]
    jitter: Option<JitterArg>,
    /// Use this key on every attempt.
    #[arg(long, value_name = "KEY", conflicts_with = "no_idempotency_key")]
    idempotency_key: Option<String>,
    /// Attach no idempotency key.
    #[arg(long)]
    no_idempotency_key: bool,
    /// Seed the random source.
    #[arg(long, value_name = "N")]
    seed: Option<u64>,
    /// Print the report as JSON on the last line of stderr.
    #[arg(long)]
    json: bool,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum JitterArg {
    None,
    Full,
    Equal,
    Decorrelated,
}

impl From<JitterArg> for Jitter {
    fn from(j: JitterArg) -> Jitter {
        match j {
            JitterArg::None => Jitter::None,
            JitterArg::Full => Jitter::Full,
            JitterArg::Equal => Jitter::Equal,
            JitterArg::Decorrelated => Jitter::Decorrelated,
        }
    }
}

const USAGE_ERROR: u8 = 2;

fn usage_error(message: impl std::fmt::Display) -> ExitCode {
    eprintln!("call: {message}");
    ExitCode::from(USAGE_ERROR)
}

fn seconds(name: &str, value: f64) -> Result<Duration, String> {
    Duration::try_from_secs_f64(value)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| format!("--{name} must be a positive number of seconds, got {value}"))
}

fn policy(args: &Args) -> Result<RetryPolicy, String> {
    let defaults = RetryPolicy::default();
    let mut builder = RetryPolicy::builder();
    if let Some(n) = args.max_attempts {
        builder = builder.max_attempts(n);
    }
    if let Some(d) = args.deadline {
        builder = builder.deadline(seconds("deadline", d)?);
    }
    if let Some(t) = args.attempt_timeout {
        builder = builder.attempt_timeout(seconds("attempt-timeout", t)?);
    }
    let base = args
        .base_ms
        .map_or(defaults.backoff().base(), Duration::from_millis);
    let cap = args
        .cap_ms
        .map_or(defaults.backoff().cap(), Duration::from_millis);
    builder = builder.backoff(base, cap);
    if let Some(j) = args.jitter {
        builder = builder.jitter(j.into());
    }
    if let Some(seed) = args.seed {
        builder = builder.seed(seed);
    }
    builder.build().map_err(|e| e.to_string())
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let policy = match policy(&args) {
        Ok(p) => p,
        Err(e) => return usage_error(e),
    };
    let Ok(method) = reqwest::Method::from_bytes(args.method.as_bytes()) else {
        return usage_error(format!("not a valid method: {}", args.method));
    };
    if reqwest::Url::parse(&args.url).is_err() {
        return usage_error(format!("not a valid URL: {}", args.url));
    }
    let client = ClientBuilder::new(reqwest::Client::new())
        .with(RetryMiddleware::new(policy))
        .build();
    let mut request = client.request(method, &args.url);
    for header in &args.headers {
        let Some((name, value)) = header.split_once(':') else {
            return usage_error(format!("a header is 'Name: value', got {header:?}"));
        };
        let (Ok(name), Ok(value)) = (
            reqwest::header::HeaderName::from_bytes(name.trim().as_bytes()),
            reqwest::header::HeaderValue::from_str(value.trim()),
        ) else {
            return usage_error(format!("not a valid header: {header:?}"));
        };
        request = request.header(name, value);
    }
    if let Some(key) = &args.idempotency_key {
        // Sent as the caller's own header: the middleware keeps it on every
        // attempt, and refuses it before sending when it is not a valid key.
        request = request.header("idempotency-key", key.as_str());
    }
    if args.no_idempotency_key {
        request = request.with_extension(RequestOptions::new().no_idempotency_key());
    }
    if let Some(data) = &args.data {
        request = request.body(data.clone());
    }
    let (status, report, error) = match request.send().await {
        Ok(response) => {
            let status = response.status();
            let report = response.extensions().get::<RetryReport>().cloned();
            match response.bytes().await {
                Ok(body) => {
                    let mut stdout = std::io::stdout().lock();
                    let _ = stdout.write_all(&body).and_then(|()| stdout.flush());
                    (Some(status), report, None)
                }
                Err(e) => (Some(status), report, Some(format!("reading the body: {e}"))),
            }
        }
        Err(err) => {
            let report = RetryError::from_middleware(&err).map(|e| e.report().clone());
            let message = match RetryError::from_middleware(&err) {
                Some(e) => format!("{e}: {}", chain(e.last_error())),
                None => chain(&err),
            };
            (None, report, Some(message))
        }
    };
    if let Some(e) = &error {
        eprintln!("call: {e}");
    }
    if args.json {
        eprintln!("{}", json_report(status, report.as_ref(), error.as_deref()));
    }
    match status {
        Some(s) if s.is_success() && error.is_none() => ExitCode::SUCCESS,
        _ => ExitCode::from(1),
    }
}

/// An error and its sources, joined with ": ".
fn chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut out = err.to_string();
    let mut source = err.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.ends_with(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

fn json_report(
    status: Option<reqwest::StatusCode>,
    report: Option<&RetryReport>,
    error: Option<&str>,
) -> serde_json::Value {
    serde_json::json!({
        "status": status.map(|s| s.as_u16()),
        "attempts": report.map_or(0, RetryReport::attempts),
        "delays_ms": report.map_or(Vec::new(), |r| {
            r.delays().iter().map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)).collect()
        }),
        "idempotency_key": report.and_then(RetryReport::idempotency_key),
        "stop_reason": report.map(|r| r.stop_reason().as_str()),
        "error": error,
    })
}
