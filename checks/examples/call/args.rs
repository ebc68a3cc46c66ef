//! The command line: curl's options and the retries', with their
//! defaults and exit codes as `--help` shows them. The bottom of the
//! example: it imports none of its siblings.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use reqwest_safe_retry::{Jitter, RetryPolicy};

/// The library's defaults, shown in `--help`.
fn defaults() -> RetryPolicy {
    RetryPolicy::default()
}

pub(super) const EXIT_CODES: &str = "\
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
pub(super) struct Args {
    /// The URL to call; without a scheme, http:// is meant.
    pub(super) url: String,
    /// The request method [default: GET, HEAD with -I, POST with a body].
    #[arg(short = 'X', long = "request", visible_alias = "method")]
    pub(super) method: Option<String>,
    /// A request body, sent like curl's -d with Content-Type
    /// application/x-www-form-urlencoded unless -H gives one; @FILE sends
    /// the file, @- standard input (as is, like curl's --data-binary).
    #[arg(short = 'd', long, value_name = "DATA", conflicts_with_all = ["json", "data_raw"])]
    pub(super) data: Option<String>,
    /// Like -d, with no @: the text is sent as it is.
    #[arg(long, value_name = "DATA", conflicts_with = "json")]
    pub(super) data_raw: Option<String>,
    /// A JSON request body, like curl's --json: Content-Type and Accept
    /// are application/json unless -H gives them; @FILE and @- as for -d.
    #[arg(long, value_name = "DATA")]
    pub(super) json: Option<String>,
    /// A request header, 'Name: value'; repeatable.
    #[arg(short = 'H', long = "header", value_name = "HEADER")]
    pub(super) headers: Vec<String>,
    /// The User-Agent header [default: call/VERSION] (-H 'User-Agent: …' wins).
    #[arg(short = 'A', long, value_name = "NAME")]
    pub(super) user_agent: Option<String>,
    /// Basic authentication, USER:PASSWORD (no colon: an empty password).
    #[arg(short = 'u', long, value_name = "USER:PASSWORD")]
    pub(super) user: Option<String>,
    /// Print the response's status line and headers before its body.
    #[arg(short = 'i', long)]
    pub(super) include: bool,
    /// Send HEAD and print the status line and headers only.
    #[arg(short = 'I', long, conflicts_with_all = ["data", "data_raw", "json"])]
    pub(super) head: bool,
    /// Write the body (and the headers with -i) to FILE, byte for byte;
    /// `-` is stdout.
    #[arg(short = 'o', long, value_name = "FILE")]
    pub(super) output: Option<PathBuf>,
    /// Print FORMAT on stdout after the body, its %{variables} filled in
    /// (listed below).
    #[arg(short = 'w', long, value_name = "FORMAT")]
    pub(super) write_out: Option<String>,
    /// Follow redirects (without it a 3xx is the answer, as with curl).
    #[arg(short = 'L', long)]
    pub(super) location: bool,
    /// With -L, the most redirects to follow.
    #[arg(long, value_name = "N", default_value_t = 50)]
    pub(super) max_redirs: usize,
    /// A final status of 400 or more: no body, exit 22.
    #[arg(short = 'f', long)]
    pub(super) fail: bool,
    /// Accept any server certificate.
    #[arg(short = 'k', long)]
    pub(super) insecure: bool,
    /// Trust the certificates of this PEM file, and only them.
    #[arg(long, value_name = "FILE")]
    pub(super) cacert: Option<PathBuf>,
    /// Ask for a body this build can read: `Accept-Encoding: identity`
    /// (it decodes no compression); an encoded answer exits 61.
    #[arg(long)]
    pub(super) compressed: bool,
    /// Print no `call:` lines on stderr (-v lines and the --report-json
    /// line still come).
    #[arg(short = 's', long)]
    pub(super) silent: bool,
    /// With -s, still print the error lines.
    #[arg(short = 'S', long)]
    pub(super) show_error: bool,
    /// Most attempts, the first included.
    #[arg(long, value_name = "N", default_value_t = defaults().max_attempts())]
    pub(super) max_attempts: u32,
    /// Total time for the call, in seconds (fractions allowed).
    #[arg(short = 'm', long, value_name = "SECS", visible_alias = "max-time",
          default_value_t = defaults().deadline().map_or(f64::INFINITY, |d| d.as_secs_f64()))]
    pub(super) deadline: f64,
    /// Time limit for each attempt, in seconds [default: none, the time left].
    #[arg(long, value_name = "SECS")]
    pub(super) attempt_timeout: Option<f64>,
    /// The first backoff ceiling, in milliseconds.
    #[arg(long, value_name = "N", default_value_t = millis(defaults().backoff().base()))]
    pub(super) base_ms: u64,
    /// The largest backoff ceiling, in milliseconds.
    #[arg(long, value_name = "N", default_value_t = millis(defaults().backoff().cap()))]
    pub(super) cap_ms: u64,
    /// The jitter mode.
    #[arg(long, value_enum, default_value_t = JitterArg::Full)]
    pub(super) jitter: JitterArg,
    /// Use this key on every attempt (1 to 255 visible ASCII characters).
    #[arg(long, value_name = "KEY", conflicts_with = "no_idempotency_key")]
    pub(super) idempotency_key: Option<String>,
    /// Attach no idempotency key [default: a fresh UUID v4 on POST and PATCH].
    #[arg(long)]
    pub(super) no_idempotency_key: bool,
    /// Seed the random source [default: from the OS].
    #[arg(long, value_name = "N")]
    pub(super) seed: Option<u64>,
    /// Print the request and response headers of each attempt on stderr,
    /// as curl's -v does, with a `*` line per attempt: its outcome, the
    /// delay before the next one (or why it stopped), and the key.
    #[arg(short = 'v', long)]
    pub(super) verbose: bool,
    /// Print one `call: attempt N: …` line per attempt on stderr (-v's
    /// `*` lines, alone).
    #[arg(long)]
    pub(super) retry_trace: bool,
    /// Print the report as JSON on the last line of stderr.
    #[arg(long)]
    pub(super) report_json: bool,
}

/// How the delay is spread below its ceiling.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(super) enum JitterArg {
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
