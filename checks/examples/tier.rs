//! One tier of a stack of services: forwards every request to its upstream
//! with this crate's client, behind the inbound deadline layer.
//!
//! ```text
//! cargo run --example tier -- --listen 127.0.0.1:3001 --upstream http://127.0.0.1:3000
//! cargo run --example tier -- --listen 127.0.0.1:3002 --upstream http://127.0.0.1:3001
//! curl -i localhost:3002/payments -H 'Request-Timeout-Ms: 2000'
//! ```
//!
//! Prints `listening on ADDR` on stdout once it accepts connections. Each
//! request is sent on with its method, path and query, body and headers
//! (but the hop-by-hop ones and `Host`), and the upstream's answer comes
//! back the same way. What the stack gains, hop by hop:
//!
//! - the call to the upstream ends when the caller stops waiting: its
//!   deadline is `min(its own, the caller's Request-Timeout-Ms)`, and the
//!   time left goes on upstream in the same header, shrinking at each hop;
//! - a request whose time is already spent is answered `504` with
//!   `Stripe-Should-Retry: false`, and not forwarded;
//! - when the call gives up, the answer carries `Stripe-Should-Retry:
//!   false`: the upstream's last answer passed on, or, with none (a
//!   connect error), `GiveUp`'s status (`504` for the deadline, `503`
//!   otherwise). The caller, if it uses this crate too, does not retry, so
//!   only the innermost tier retries.
//!
//! Start-up failures print one line and exit with status 1.

use std::io::Write;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Router;
use clap::Parser;
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use reqwest_safe_retry::deadline::{GiveUp, InheritDeadlineLayer, DEFAULT_DEADLINE_HEADER};
use reqwest_safe_retry::{ReportSlot, RetryMiddleware, RetryPolicy, StopReason};

#[derive(Parser, Debug)]
#[command(about = "Forwards every request to an upstream, propagating the caller's deadline")]
struct Args {
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// The upstream's base URL; the request's path and query are appended.
    #[arg(long)]
    upstream: reqwest::Url,
    /// This tier's own deadline per call, in ms (the caller's time left
    /// still bounds it).
    #[arg(long, default_value_t = 30_000)]
    deadline_ms: u64,
}

struct Tier {
    client: ClientWithMiddleware,
    upstream: String,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    match serve(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("tier: {message}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(args: Args) -> Result<(), String> {
    if args.deadline_ms == 0 {
        return Err("--deadline-ms must be greater than zero".to_owned());
    }
    let policy = RetryPolicy::builder()
        .deadline(Duration::from_millis(args.deadline_ms))
        .build()
        .map_err(|e| e.to_string())?;
    let client = ClientBuilder::new(reqwest::Client::new())
        .with(RetryMiddleware::new(policy))
        .build();
    let tier = Arc::new(Tier {
        client,
        upstream: args.upstream.as_str().trim_end_matches('/').to_owned(),
    });
    let app = Router::new()
        .fallback(forward)
        .with_state(tier)
        .layer(InheritDeadlineLayer::new());

    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", args.listen))?;
    let addr = listener
        .local_addr()
        .map_err(|e| format!("cannot listen on {}: {e}", args.listen))?;
    let mut stdout = std::io::stdout();
    writeln!(stdout, "listening on {addr}")
        .and_then(|()| stdout.flush())
        .map_err(|e| format!("cannot write to stdout: {e}"))?;
    axum::serve(listener, app)
        .await
        .map_err(|e| format!("serving on {addr} failed: {e}"))
}

/// Headers that belong to one connection (RFC 9110 §7.6.1), or that the
/// client sets itself: not passed on.
fn passed_on(name: &header::HeaderName) -> bool {
    !matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
            | "host"
            | "content-length"
            | DEFAULT_DEADLINE_HEADER
    )
}

/// Sends the request upstream and passes the answer back. The layer around
/// it bounds the call by the caller's deadline and, when the call gave up,
/// marks an answer the caller would retry with the "do not retry" verdict.
async fn forward(
    State(tier): State<Arc<Tier>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    let mut request = tier
        .client
        .request(method, format!("{}{path}", tier.upstream))
        .body(body);
    for (name, value) in &headers {
        if passed_on(name) {
            request = request.header(name, value);
        }
    }
    let slot = ReportSlot::new();
    let response = match request.with_extension(slot.clone()).send().await {
        Ok(response) => response,
        Err(_) => {
            // No answer to pass on: say why the call gave up.
            let reason = slot
                .take()
                .map_or(StopReason::Permanent, |r| r.stop_reason());
            return match GiveUp::for_reason(reason) {
                Some(give_up) => give_up.into_response(),
                None => StatusCode::BAD_GATEWAY.into_response(),
            };
        }
    };
    let status = response.status();
    let mut out = HeaderMap::new();
    for (name, value) in response.headers() {
        if passed_on(name) {
            out.append(name, value.clone());
        }
    }
    match response.bytes().await {
        Ok(body) => (status, out, Body::from(body)).into_response(),
        Err(_) => GiveUp::for_reason(StopReason::Permanent).map_or_else(
            || StatusCode::BAD_GATEWAY.into_response(),
            GiveUp::into_response,
        ),
    }
}
