//! A small curl-like command for any URL, through `RetryMiddleware`.
//!
//! ```text
//! call [OPTIONS] URL
//! curl's everyday options, with curl's meanings:
//!   -X, --request METHOD       default GET; HEAD with -I; POST with a body
//!   -d, --data DATA            a form body (@FILE a file, @- stdin)
//!   --data-raw DATA            the same, with no @ reading
//!   --json DATA                a JSON body; Content-Type and Accept JSON
//!   -H, --header 'Name: value' repeatable; wins over -A, -u, --compressed
//!   -A, --user-agent NAME      -u, --user USER[:PASSWORD] (basic auth)
//!   -i, --include              -I, --head      -o, --output FILE
//!   -w, --write-out FORMAT     %{http_code} %{time_total} … (see --help)
//!   -L, --location             follow redirects (none are followed without)
//!   --max-redirs N             -f, --fail      -k, --insecure
//!   --cacert FILE              -m, --max-time SECS (the call's deadline)
//!   --compressed               asks for an encoding this build can read
//!   -s, --silent               -S, --show-error
//!   -v, --verbose              request and response headers on stderr
//! the retries':
//!   --max-attempts N           --attempt-timeout SECS
//!   --base-ms N                --cap-ms N
//!   --jitter none|full|equal|decorrelated|proportional
//!   --idempotency-key KEY      --no-idempotency-key      --seed N
//!   --retry-trace              one line per attempt on stderr
//!   --report-json              last line of stderr is the report as JSON
//! ```
//!
//! Like curl: a URL without a scheme is `http://`, and when an option is
//! given twice the last one wins (`-H` adds a header each time; curl joins
//! repeated `-d` and `--json` values, here the last one is sent). Two
//! bodies (`-d`, `--data-raw`, `--json`) do not go together, nor a body
//! and `-I`.
//!
//! The response body goes to stdout (or the `-o` file, byte for byte),
//! ending in a newline on stdout (one is added when the body lacks it), so
//! what follows on the terminal starts on a line of its own. A final
//! status that is not 2xx is named on stderr (`call: 503 Service
//! Unavailable`), or with `-f` and a status from 400 up replaces the body
//! as curl's `call: (22) The requested URL returned error: 503`. Errors
//! carry curl's exit code in brackets. With `--report-json` the last line
//! of stderr is one JSON object: `status`, `attempts`, `delays_ms`,
//! `idempotency_key`, `stop_reason` and `error` — for a usage error too.
//! The exit codes are curl's; `EXIT_CODES` below lists them.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use reqwest_safe_retry::{Jitter, ReportSlot, RetryPolicy};

mod client;
mod output;
mod request;
mod verbose;

/// The library's defaults, shown in `--help`.
fn defaults() -> RetryPolicy {
    RetryPolicy::default()
}

const EXIT_CODES: &str = "\
Exit codes (curl's):
   0  a response came, whatever its status (with -f: a status below 400)
   1  another error (no response)
   2  usage error (with --report-json the last stderr line is still the JSON report)
   6  could not resolve the host
   7  could not connect
  22  -f and the final status is 400 or more
  23  could not write the output (-o)
  28  timed out (-m, --attempt-timeout)
  47  more redirects than --max-redirs (with -L)
  56  the connection failed while receiving the response
  60  the server's certificate is not trusted (-k, --cacert)
  61  --compressed and the response is encoded anyway

--write-out variables: %{http_code} (000 without a response), %{response_code},
%{time_total} (seconds), %{size_download} (bytes), %{url_effective},
%{num_redirects}; \\n \\t \\r and %% as curl reads them; @FILE reads FORMAT from a file.";

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
    /// The request method [default: GET, HEAD with -I, POST with a body].
    #[arg(short = 'X', long = "request", visible_alias = "method")]
    method: Option<String>,
    /// A request body, sent like curl's -d with Content-Type
    /// application/x-www-form-urlencoded unless -H gives one; @FILE sends
    /// the file, @- standard input (as is, like curl's --data-binary).
    #[arg(short = 'd', long, value_name = "DATA", conflicts_with_all = ["json", "data_raw"])]
    data: Option<String>,
    /// Like -d, with no @: the text is sent as it is.
    #[arg(long, value_name = "DATA", conflicts_with = "json")]
    data_raw: Option<String>,
    /// A JSON request body, like curl's --json: Content-Type and Accept
    /// are application/json unless -H gives them; @FILE and @- as for -d.
    #[arg(long, value_name = "DATA")]
    json: Option<String>,
    /// A request header, 'Name: value'; repeatable.
    #[arg(short = 'H', long = "header", value_name = "HEADER")]
    headers: Vec<String>,
    /// The User-Agent header (-H 'User-Agent: …' wins).
    #[arg(short = 'A', long, value_name = "NAME")]
    user_agent: Option<String>,
    /// Basic authentication, USER:PASSWORD (no colon: an empty password).
    #[arg(short = 'u', long, value_name = "USER:PASSWORD")]
    user: Option<String>,
    /// Print the response's status line and headers before its body.
    #[arg(short = 'i', long)]
    include: bool,
    /// Send HEAD and print the status line and headers only.
    #[arg(short = 'I', long, conflicts_with_all = ["data", "data_raw", "json"])]
    head: bool,
    /// Write the body (and the headers with -i) to FILE, byte for byte;
    /// `-` is stdout.
    #[arg(short = 'o', long, value_name = "FILE")]
    output: Option<PathBuf>,
    /// Print FORMAT on stdout after the body, its %{variables} filled in
    /// (listed below).
    #[arg(short = 'w', long, value_name = "FORMAT")]
    write_out: Option<String>,
    /// Follow redirects (without it a 3xx is the answer, as with curl).
    #[arg(short = 'L', long)]
    location: bool,
    /// With -L, the most redirects to follow.
    #[arg(long, value_name = "N", default_value_t = 50)]
    max_redirs: usize,
    /// A final status of 400 or more: no body, exit 22.
    #[arg(short = 'f', long)]
    fail: bool,
    /// Accept any server certificate.
    #[arg(short = 'k', long)]
    insecure: bool,
    /// Trust the certificates of this PEM file, and only them.
    #[arg(long, value_name = "FILE")]
    cacert: Option<PathBuf>,
    /// Ask for a body this build can read: `Accept-Encoding: identity`
    /// (it decodes no compression); an encoded answer exits 61.
    #[arg(long)]
    compressed: bool,
    /// Print no `call:` lines on stderr (-v lines and the --report-json
    /// line still come).
    #[arg(short = 's', long)]
    silent: bool,
    /// With -s, still print the error lines.
    #[arg(short = 'S', long)]
    show_error: bool,
    /// Most attempts, the first included.
    #[arg(long, value_name = "N", default_value_t = defaults().max_attempts())]
    max_attempts: u32,
    /// Total time for the call, in seconds (fractions allowed).
    #[arg(short = 'm', long, value_name = "SECS", visible_alias = "max-time",
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
    /// Print the request and response headers of each attempt on stderr,
    /// as curl's -v does, with a `*` line per attempt: its outcome, the
    /// delay before the next one (or why it stopped), and the key.
    #[arg(short = 'v', long)]
    verbose: bool,
    /// Print one `call: attempt N: …` line per attempt on stderr (-v's
    /// `*` lines, alone).
    #[arg(long)]
    retry_trace: bool,
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
        eprintln!("{}", output::json_report(None, None, Some(&message)));
    }
    ExitCode::from(USAGE_ERROR)
}

/// Parses the command line; on an error, prints clap's message (and the
/// report line) and gives the exit code.
fn parse() -> Result<Args, ExitCode> {
    let json = std::env::args_os().any(|a| a == "--report-json");
    match Args::try_parse() {
        Ok(args) => Ok(args),
        Err(e) if !e.use_stderr() => {
            // --help and --version: not errors.
            let _ = e.print();
            Err(ExitCode::SUCCESS)
        }
        Err(e) => {
            let e = plain(e);
            let _ = e.print();
            if json {
                let rendered = e.render().to_string();
                let first = rendered.lines().next().unwrap_or("usage error");
                let message = first.strip_prefix("error: ").unwrap_or(first);
                eprintln!("{}", output::json_report(None, None, Some(message)));
            }
            Err(ExitCode::from(USAGE_ERROR))
        }
    }
}

/// clap's error without its tip to pass an unknown option as the URL
/// (`to pass '-L' as a value, use '-- -L'`): whoever types an option
/// means an option. (With no subcommands, that tip is all an unknown
/// argument's `Suggested` holds; "a similar argument exists" stays.)
fn plain(e: clap::Error) -> clap::Error {
    use clap::error::{ContextKind, ErrorKind};
    use clap::CommandFactory;
    if e.kind() != ErrorKind::UnknownArgument {
        return e;
    }
    let mut plain = clap::Error::new(ErrorKind::UnknownArgument).with_cmd(&Args::command());
    for (kind, value) in e.context() {
        if kind != ContextKind::Suggested {
            plain.insert(kind, value.clone());
        }
    }
    plain
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = match parse() {
        Ok(args) => args,
        Err(code) => return code,
    };
    let (call, write_out) = match request::prepare(&args) {
        Ok(prepared) => prepared,
        Err(e) => return usage_error(args.report_json, e),
    };
    if args.verbose || args.retry_trace {
        verbose::install(if args.verbose { "* " } else { "call: " });
    }
    // Transport errors come back as reqwest made them; the report of what
    // the retries did lands in this slot either way.
    let slot = ReportSlot::new();
    let started = Instant::now();
    let sent = call.send(slot.clone()).await;
    output::finish(&args, &call, sent, slot, started, write_out.as_ref()).await
}
