//! A small curl-like command for any URL, through `RetryMiddleware`.
//!
//! ```text
//! call [OPTIONS] URL
//!   -X, --method METHOD        default GET, or POST when -d or --json is given
//!   -d, --data DATA            request body, sent as a form like curl's
//!                              (application/x-www-form-urlencoded unless -H
//!                              sets a content-type); @FILE a file, @- stdin
//!   --json DATA                a JSON body, like curl's --json: sets
//!                              Content-Type and Accept to application/json
//!   -H, --header 'Name: value' repeatable
//!   -i, --include              the status line and headers before the body
//!   -s, --silent               no `call:` status or error lines on stderr
//!   --max-attempts N           --deadline SECS      --attempt-timeout SECS
//!   --base-ms N                --cap-ms N
//!   --jitter none|full|equal|decorrelated|proportional
//!   --idempotency-key KEY      use this key on every attempt
//!   --no-idempotency-key       attach none
//!   --seed N                   seed the random source
//!   -v, --verbose              one line per attempt on stderr
//!   --report-json              last line of stderr is the report as JSON
//! ```
//!
//! Like curl: a URL without a scheme is `http://`, and when an option is
//! given twice the last one wins (`-H` adds a header each time; curl joins
//! repeated `-d` and `--json` values, here the last one is sent). `-d` and
//! `--json` do not go together.
//!
//! The response body goes to stdout, ending in a newline (one is added when
//! the body lacks it), so what follows on the terminal starts on a line of
//! its own. A final status that is not 2xx is named on stderr
//! (`call: 503 Service Unavailable`). With `--report-json` the last line of
//! stderr is one JSON object: `status`, `attempts`, `delays_ms`,
//! `idempotency_key`, `stop_reason` and `error` — for a usage error too.
//! Exit code 0 when the final status is 2xx, 1 otherwise, 2 for a usage
//! error.

use std::io::{Read, Write};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use reqwest_middleware::ClientBuilder;
use reqwest_safe_retry::{
    IdempotencyKey, Jitter, ReportSlot, RequestOptions, RetryError, RetryMiddleware, RetryPolicy,
    RetryReport,
};

/// The library's defaults, shown in `--help`.
fn defaults() -> RetryPolicy {
    RetryPolicy::default()
}

const EXIT_CODES: &str = "\
Exit codes:
  0  the final response is 2xx
  1  the final response is not 2xx, or no response came (transport error)
  2  usage error (with --report-json the last stderr line is still the JSON report)";

#[derive(Parser, Debug)]
#[command(
    name = "call",
    about = "Send one HTTP request through reqwest-safe-retry",
    after_help = EXIT_CODES,
    args_override_self = true
)]
struct Args {
    /// The URL to call; without a scheme, http:// is meant.
    url: String,
    /// The request method [default: GET, or POST when -d or --json is given].
    #[arg(short = 'X', long)]
    method: Option<String>,
    /// The request body, sent like curl's -d with Content-Type
    /// application/x-www-form-urlencoded unless -H gives one; @FILE sends
    /// the file, @- standard input (as is, like curl's --data-binary).
    #[arg(short = 'd', long, value_name = "DATA", conflicts_with = "json")]
    data: Option<String>,
    /// A JSON request body, like curl's --json: Content-Type and Accept
    /// are application/json unless -H gives them; @FILE and @- as for -d.
    #[arg(long, value_name = "DATA")]
    json: Option<String>,
    /// A request header, 'Name: value'; repeatable.
    #[arg(short = 'H', long = "header")]
    headers: Vec<String>,
    /// Print the response's status line and headers before its body.
    #[arg(short = 'i', long)]
    include: bool,
    /// Print no `call:` status or error lines on stderr (-v lines and the
    /// --report-json line still come).
    #[arg(short = 's', long)]
    silent: bool,
    /// Most attempts, the first included.
    #[arg(long, value_name = "N", default_value_t = defaults().max_attempts())]
    max_attempts: u32,
    /// Total time for the call, in seconds.
    #[arg(long, value_name = "SECS",
          default_value_t = defaults().deadline().map_or(f64::INFINITY, |d| d.as_secs_f64()))]
    deadline: f64,
    /// Time limit for each attempt, in seconds [default: none, the time left].
    #[arg(long, value_name = "SECS")]
    attempt_timeout: Option<f64>,
    /// The first backoff ceiling, in milliseconds.
    #[arg(long, value_name = "N", default_value_t = millis(defaults().backoff().base()))]
    base_ms: u64,
    /// The largest backoff ceiling, in milliseconds.
    #[arg(long, value_name = "N", default_value_t = millis(defaults().backoff().cap()))]
    cap_ms: u64,
    /// The jitter mode.
    #[arg(long, value_enum, default_value_t = JitterArg::Full)]
    jitter: JitterArg,
    /// Use this key on every attempt (1 to 255 visible ASCII characters).
    #[arg(long, value_name = "KEY", conflicts_with = "no_idempotency_key")]
    idempotency_key: Option<String>,
    /// Attach no idempotency key [default: a fresh UUID v4 on POST and PATCH].
    #[arg(long)]
    no_idempotency_key: bool,
    /// Seed the random source [default: from the OS].
    #[arg(long, value_name = "N")]
    seed: Option<u64>,
    /// Print one line per attempt on stderr: its status or error, the delay
    /// before the next one (or why it stopped), and the key.
    #[arg(short = 'v', long)]
    verbose: bool,
    /// Print the report as JSON on the last line of stderr.
    #[arg(long)]
    report_json: bool,
}

/// How the delay is spread below its ceiling.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum JitterArg {
    /// exactly the ceiling: for comparison only, a fleet retries in lockstep
    None,
    /// U(0, ceiling): the library's default
    Full,
    /// ceiling/2 + U(0, ceiling/2)
    Equal,
    /// U(base, min(cap, previous delay × 3))
    Decorrelated,
    /// ceiling × U(0.8, 1.2): gRPC's reconnect jitter
    Proportional,
}

impl From<JitterArg> for Jitter {
    fn from(j: JitterArg) -> Jitter {
        match j {
            JitterArg::None => Jitter::None,
            JitterArg::Full => Jitter::Full,
            JitterArg::Equal => Jitter::Equal,
            JitterArg::Decorrelated => Jitter::Decorrelated,
            JitterArg::Proportional => Jitter::Proportional(0.2),
        }
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

const USAGE_ERROR: u8 = 2;

/// Reports a usage error: a message, and with `--report-json` the report
/// line.
fn usage_error(json: bool, message: impl std::fmt::Display) -> ExitCode {
    let message = message.to_string();
    eprintln!("call: {message}");
    if json {
        eprintln!("{}", json_report(None, None, Some(&message)));
    }
    ExitCode::from(USAGE_ERROR)
}

fn seconds(name: &str, value: f64) -> Result<Duration, String> {
    Duration::try_from_secs_f64(value)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| format!("--{name} must be a positive number of seconds, got {value}"))
}

fn policy(args: &Args) -> Result<RetryPolicy, String> {
    let mut builder = RetryPolicy::builder()
        .max_attempts(args.max_attempts)
        .backoff(
            Duration::from_millis(args.base_ms),
            Duration::from_millis(args.cap_ms),
        )
        .jitter(args.jitter.into());
    builder = if args.deadline == f64::INFINITY {
        builder.no_deadline()
    } else {
        builder.deadline(seconds("deadline", args.deadline)?)
    };
    if let Some(t) = args.attempt_timeout {
        builder = builder.attempt_timeout(seconds("attempt-timeout", t)?);
    }
    if let Some(seed) = args.seed {
        builder = builder.seed(seed);
    }
    builder.build().map_err(|e| e.to_string())
}

/// The body `-d` names: the text itself, `@-` standard input, `@FILE` a file.
fn body(data: &str) -> Result<Vec<u8>, String> {
    match data.strip_prefix('@') {
        Some("-") => {
            let mut buf = Vec::new();
            std::io::stdin()
                .read_to_end(&mut buf)
                .map_err(|e| format!("reading the body from standard input: {e}"))?;
            Ok(buf)
        }
        Some(path) => std::fs::read(path).map_err(|e| format!("reading the body from {path}: {e}")),
        None => Ok(data.as_bytes().to_vec()),
    }
}

/// curl's rule: a URL without a scheme is http.
fn with_scheme(url: &str) -> String {
    if url.contains("://") {
        url.to_owned()
    } else {
        format!("http://{url}")
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let json = std::env::args_os().any(|a| a == "--report-json");
    let args = match Args::try_parse() {
        Ok(args) => args,
        Err(e) if !e.use_stderr() => {
            // --help and --version: not errors.
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            let _ = e.print();
            if json {
                let rendered = e.render().to_string();
                let first = rendered.lines().next().unwrap_or("usage error");
                let message = first.strip_prefix("error: ").unwrap_or(first);
                eprintln!("{}", json_report(None, None, Some(message)));
            }
            return ExitCode::from(USAGE_ERROR);
        }
    };
    let json = args.report_json;
    let policy = match policy(&args) {
        Ok(p) => p,
        Err(e) => return usage_error(json, e),
    };
    // curl: a body means POST unless -X says otherwise.
    let method = match (&args.method, args.data.is_some() || args.json.is_some()) {
        (Some(m), _) => m.as_str(),
        (None, true) => "POST",
        (None, false) => "GET",
    };
    let Ok(method) = reqwest::Method::from_bytes(method.as_bytes()) else {
        return usage_error(json, format!("not a valid method: {method}"));
    };
    let url = with_scheme(&args.url);
    if reqwest::Url::parse(&url).is_err() {
        return usage_error(json, format!("not a valid URL: {}", args.url));
    }
    let mut headers = reqwest::header::HeaderMap::new();
    for header in &args.headers {
        let Some((name, value)) = header.split_once(':') else {
            return usage_error(json, format!("a header is 'Name: value', got {header:?}"));
        };
        let (Ok(name), Ok(value)) = (
            reqwest::header::HeaderName::from_bytes(name.trim().as_bytes()),
            reqwest::header::HeaderValue::from_str(value.trim()),
        ) else {
            return usage_error(json, format!("not a valid header: {header:?}"));
        };
        headers.append(name, value);
    }
    // curl's defaults for a body's headers, which -H overrides.
    let implied: &[(&str, &str)] = if args.json.is_some() {
        &[
            ("content-type", "application/json"),
            ("accept", "application/json"),
        ]
    } else if args.data.is_some() {
        &[("content-type", "application/x-www-form-urlencoded")]
    } else {
        &[]
    };
    for &(name, value) in implied {
        if !headers.contains_key(name) {
            headers.insert(
                reqwest::header::HeaderName::from_static(name),
                reqwest::header::HeaderValue::from_static(value),
            );
        }
    }
    let mut options = RequestOptions::new();
    let header_key = headers.contains_key("idempotency-key");
    if let Some(key) = &args.idempotency_key {
        if header_key {
            // Two keys on the wire would leave the server to guess.
            return usage_error(
                json,
                "the key is given twice: use --idempotency-key or -H 'Idempotency-Key: …', not both",
            );
        }
        match IdempotencyKey::new(key.as_str()) {
            Ok(key) => options = options.idempotency_key(key),
            Err(e) => return usage_error(json, format!("--idempotency-key: {e}")),
        }
    }
    if args.no_idempotency_key {
        if header_key {
            return usage_error(
                json,
                "--no-idempotency-key contradicts -H 'Idempotency-Key: …': give one",
            );
        }
        options = options.no_idempotency_key();
    }
    let body = match args
        .data
        .as_deref()
        .or(args.json.as_deref())
        .map(body)
        .transpose()
    {
        Ok(body) => body,
        Err(e) => return usage_error(json, e),
    };
    if args.verbose {
        verbose::install();
    }
    let client = ClientBuilder::new(reqwest::Client::new())
        .with(RetryMiddleware::new(policy))
        .build();
    // Transport errors come back as reqwest made them; the report of what
    // the retries did lands in this slot either way.
    let slot = ReportSlot::new();
    let mut request = client
        .request(method, &url)
        .headers(headers)
        .with_extension(options)
        .with_extension(slot.clone());
    if let Some(body) = body {
        request = request.body(body);
    }
    let (status, report, error) = match request.send().await {
        Ok(response) => {
            let status = response.status();
            let report = response.extensions().get::<RetryReport>().cloned();
            let head = args.include.then(|| head(&response));
            match response.bytes().await {
                Ok(body) => {
                    let mut stdout = std::io::stdout().lock();
                    let _ = print(&mut stdout, head.as_deref(), &body);
                    (Some(status), report, None)
                }
                Err(e) => (Some(status), report, Some(format!("reading the body: {e}"))),
            }
        }
        Err(err) => {
            let report = slot
                .take()
                .or_else(|| RetryError::from_middleware(&err).map(|e| e.report().clone()));
            (None, report, Some(chain(&err)))
        }
    };
    if !args.silent {
        if let Some(s) = status.filter(|s| !s.is_success()) {
            eprintln!("call: {}", status_text(s));
        }
        if let Some(e) = &error {
            eprintln!("call: {e}");
        }
    }
    if json {
        eprintln!("{}", json_report(status, report.as_ref(), error.as_deref()));
    }
    match status {
        Some(s) if s.is_success() && error.is_none() => ExitCode::SUCCESS,
        _ => ExitCode::from(1),
    }
}

/// `503 Service Unavailable`, or the bare code when it has no reason.
fn status_text(status: reqwest::StatusCode) -> String {
    match status.canonical_reason() {
        Some(reason) => format!("{} {reason}", status.as_str()),
        None => status.as_str().to_owned(),
    }
}

/// `-i`: the status line and the headers as curl prints them (CRLF line
/// ends, a blank line before the body).
fn head(response: &reqwest::Response) -> Vec<u8> {
    let status = response.status();
    let mut out = format!("{:?} {}\r\n", response.version(), status_text(status)).into_bytes();
    for (name, value) in response.headers() {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out
}

/// Writes the head (with `-i`) and the body, which ends in a newline: one
/// is added when the body lacks it, so the report or the shell prompt
/// starts on a line of its own.
fn print(out: &mut impl Write, head: Option<&[u8]>, body: &[u8]) -> std::io::Result<()> {
    if let Some(head) = head {
        out.write_all(head)?;
    }
    out.write_all(body)?;
    if !body.is_empty() && !body.ends_with(b"\n") {
        out.write_all(b"\n")?;
    }
    out.flush()
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

/// `-v`: one stderr line per attempt, from the middleware's own `tracing`
/// events (an event per attempt inside a span per logical operation).
mod verbose {
    use std::fmt::{self, Write as _};

    use tracing::field::{Field, Visit};
    use tracing::span::{Attributes, Id};
    use tracing::{Event, Subscriber};
    use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
    use tracing_subscriber::registry::LookupSpan;

    pub(super) fn install() {
        let subscriber = tracing_subscriber::registry().with(Attempts);
        let _ = tracing::subscriber::set_global_default(subscriber);
    }

    struct Attempts;

    /// The key of a logical operation, kept on its span.
    struct Key(String);

    #[derive(Default)]
    struct Fields {
        attempt: u64,
        outcome: String,
        delay_ms: u64,
        stop_reason: String,
        key: String,
        message: String,
    }

    impl Visit for Fields {
        fn record_u64(&mut self, field: &Field, value: u64) {
            match field.name() {
                "attempt" => self.attempt = value,
                "delay_ms" => self.delay_ms = value,
                _ => {}
            }
        }

        fn record_str(&mut self, field: &Field, value: &str) {
            match field.name() {
                "stop_reason" => self.stop_reason = value.to_owned(),
                "idempotency_key" => self.key = value.to_owned(),
                _ => {}
            }
        }

        fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
            let target = match field.name() {
                "outcome" => &mut self.outcome,
                "message" => &mut self.message,
                _ => return,
            };
            let _ = write!(target, "{value:?}");
        }
    }

    impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Attempts {
        fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
            let mut fields = Fields::default();
            attrs.record(&mut fields);
            if let (false, Some(span)) = (fields.key.is_empty(), ctx.span(id)) {
                span.extensions_mut().insert(Key(fields.key));
            }
        }

        fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
            let mut fields = Fields::default();
            event.record(&mut fields);
            if fields.message != "attempt finished" {
                return;
            }
            let key = ctx
                .event_scope(event)
                .and_then(|scope| {
                    scope
                        .into_iter()
                        .find_map(|span| span.extensions().get::<Key>().map(|k| k.0.clone()))
                })
                .unwrap_or_else(|| "none".to_owned());
            let outcome = if fields.outcome.bytes().all(|b| b.is_ascii_digit()) {
                fields.outcome
            } else {
                format!("{} error", fields.outcome)
            };
            let next = if fields.stop_reason.is_empty() {
                format!("retry in {} ms", fields.delay_ms)
            } else {
                format!("stop: {}", fields.stop_reason)
            };
            eprintln!(
                "call: attempt {}: {outcome}, {next}, key {key}",
                fields.attempt
            );
        }
    }
}
