//! What `call` prints, where, and the exit code it ends with: curl's.

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use reqwest_safe_retry::{ReportSlot, RetryError, RetryReport};

use super::args::Args;
use super::client::{Call, Sent};
use super::errors::chain;

/// What `-w`'s variables read.
struct Done {
    status: Option<StatusCode>,
    url: String,
    size: usize,
    redirects: usize,
    elapsed: Duration,
}

/// Prints the answer (or the error) as the options ask, and gives curl's
/// exit code.
pub(super) async fn finish(
    args: &Args,
    call: &Call,
    sent: Sent,
    slot: ReportSlot,
    started: Instant,
    write_out: Option<&WriteOut>,
) -> ExitCode {
    let mut done = Done {
        status: None,
        url: call.url().to_owned(),
        size: 0,
        redirects: 0,
        elapsed: Duration::ZERO,
    };
    let (code, report, error) = match sent {
        Ok(response) => {
            let status = response.status();
            done.status = Some(status);
            done.url = response.url().to_string();
            done.redirects = call.redirects.to(response.url());
            let report = response.extensions().get::<RetryReport>().cloned();
            let (code, error) = answer(args, response, &mut done).await;
            (code, report, error)
        }
        Err(err) => {
            let report = slot
                .take()
                .or_else(|| RetryError::from_middleware(&err).map(|e| e.report().clone()));
            (transport_code(&err), report, Some(chain(&err)))
        }
    };
    done.elapsed = started.elapsed();
    if let Some(write_out) = write_out {
        let mut stdout = std::io::stdout().lock();
        let _ = stdout.write_all(write_out.render(&done).as_bytes());
        let _ = stdout.flush();
    }
    let status = done.status;
    if !args.silent && code != 22 {
        if let Some(s) = status.filter(|s| !s.is_success()) {
            eprintln!("call: {}", status_text(s));
        }
    }
    if let Some(e) = &error {
        if !args.silent || args.show_error {
            eprintln!("call: ({code}) {e}");
        }
    }
    if args.report_json {
        eprintln!("{}", json_report(status, report.as_ref(), error.as_deref()));
    }
    ExitCode::from(code)
}

/// A response came: prints it, unless -f refuses it or --compressed cannot
/// read it; the exit code, and the error line's text.
async fn answer(args: &Args, response: reqwest::Response, done: &mut Done) -> (u8, Option<String>) {
    let status = response.status();
    if args.fail && status.as_u16() >= 400 {
        let text = format!("The requested URL returned error: {}", status.as_str());
        return (22, Some(text));
    }
    if args.compressed {
        let encoding = response
            .headers()
            .get(reqwest::header::CONTENT_ENCODING)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .filter(|v| !v.eq_ignore_ascii_case("identity"));
        if let Some(encoding) = encoding {
            let text =
                format!("Unrecognized content encoding type: {encoding} (this build decodes none)");
            return (61, Some(text));
        }
    }
    let head = (args.include || args.head).then(|| head(&response));
    let body = match response.bytes().await {
        Ok(body) => body,
        Err(e) => return (56, Some(format!("reading the body: {}", chain(&e)))),
    };
    done.size = body.len();
    let body = if args.head { &[][..] } else { &body[..] };
    match deliver(args.output.as_deref(), head.as_deref(), body) {
        Ok(()) => (0, None),
        Err(e) => (23, Some(e)),
    }
}

/// The head (with `-i`) and the body: to the `-o` file byte for byte, or
/// to stdout ending in a newline.
fn deliver(output: Option<&Path>, head: Option<&[u8]>, body: &[u8]) -> Result<(), String> {
    match output.filter(|p| *p != Path::new("-")) {
        Some(path) => {
            let mut bytes = head.unwrap_or_default().to_vec();
            bytes.extend_from_slice(body);
            std::fs::write(path, bytes).map_err(|e| format!("writing {}: {e}", path.display()))
        }
        None => print(&mut std::io::stdout().lock(), head, body)
            .map_err(|e| format!("writing to stdout: {e}")),
    }
}

/// curl's exit code for a call that got no response.
fn transport_code(err: &reqwest_middleware::Error) -> u8 {
    let reqwest_middleware::Error::Reqwest(e) = err else {
        return 1;
    };
    let text = chain(e).to_ascii_lowercase();
    if e.is_redirect() {
        47
    } else if e.is_timeout() {
        28
    } else if e.is_connect() && text.contains("certificate") {
        60
    } else if e.is_connect() && text.contains("dns error") {
        6
    } else if e.is_connect() {
        7
    } else if e.is_request() || e.is_body() || e.is_decode() {
        56
    } else {
        1
    }
}

/// `503 Service Unavailable`, or the bare code when it has no reason.
fn status_text(status: StatusCode) -> String {
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

/// `--report-json`'s line.
pub(super) fn json_report(
    status: Option<StatusCode>,
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

/// `-w FORMAT`, read once: text and curl's variables.
pub(super) struct WriteOut(Vec<Piece>);

enum Piece {
    Text(String),
    HttpCode,
    TimeTotal,
    SizeDownload,
    UrlEffective,
    NumRedirects,
}

impl WriteOut {
    /// Reads curl's `%{name}`, `%%` and `\n` `\t` `\r` `\\`; an unknown
    /// variable is an error, before anything is sent.
    pub(super) fn parse(format: &str) -> Result<WriteOut, String> {
        let mut pieces = Vec::new();
        let mut text = String::new();
        let mut chars = format.chars().peekable();
        while let Some(c) = chars.next() {
            match (c, chars.peek().copied()) {
                ('%', Some('%')) => {
                    chars.next();
                    text.push('%');
                }
                ('%', Some('{')) => {
                    chars.next();
                    let name: String = chars.by_ref().take_while(|&c| c != '}').collect();
                    let piece = match name.as_str() {
                        "http_code" | "response_code" => Piece::HttpCode,
                        "time_total" => Piece::TimeTotal,
                        "size_download" => Piece::SizeDownload,
                        "url_effective" => Piece::UrlEffective,
                        "num_redirects" => Piece::NumRedirects,
                        _ => return Err(format!("--write-out: unknown variable %{{{name}}}")),
                    };
                    pieces.push(Piece::Text(std::mem::take(&mut text)));
                    pieces.push(piece);
                }
                ('\\', Some(e @ ('n' | 't' | 'r' | '\\'))) => {
                    chars.next();
                    text.push(match e {
                        'n' => '\n',
                        't' => '\t',
                        'r' => '\r',
                        _ => '\\',
                    });
                }
                _ => text.push(c),
            }
        }
        pieces.push(Piece::Text(text));
        Ok(WriteOut(pieces))
    }

    fn render(&self, done: &Done) -> String {
        let mut out = String::new();
        for piece in &self.0 {
            match piece {
                Piece::Text(t) => out.push_str(t),
                Piece::HttpCode => match done.status {
                    Some(s) => out.push_str(s.as_str()),
                    None => out.push_str("000"),
                },
                Piece::TimeTotal => out.push_str(&format!("{:.6}", done.elapsed.as_secs_f64())),
                Piece::SizeDownload => out.push_str(&done.size.to_string()),
                Piece::UrlEffective => out.push_str(&done.url),
                Piece::NumRedirects => out.push_str(&done.redirects.to_string()),
            }
        }
        out
    }
}
