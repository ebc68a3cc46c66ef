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
//! The exit codes are curl's; `EXIT_CODES` in args.rs lists them.

use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;
use reqwest_safe_retry::ReportSlot;

use args::Args;

// From the bottom up: `args`, `errors` and `trust` import no sibling,
// `verbose` only `errors`; `client` uses those four, `output` the client,
// `request` the client and `output`. No module imports one that imports it.
mod args;
mod client;
mod errors;
mod output;
mod request;
#[cfg(all(target_os = "linux", feature = "default-tls"))]
mod trust;
mod verbose;

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
