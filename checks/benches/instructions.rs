//! Instructions per call through a middleware chain, a count that does not
//! move with the machine's load, for paired comparisons on a shared
//! machine; and allocations per call, counted by the bench's allocator.
//!
//! ```sh
//! cargo bench --bench instructions --no-run
//! # per call = (count at 20 001 calls − count at 1 call) / 20 000
//! valgrind --tool=callgrind --callgrind-out-file=/dev/null \
//!     target/release/deps/instructions-* <chain> <get|post> 20001
//! # over real sockets (an axum server on loopback, same thread):
//! valgrind --tool=callgrind --callgrind-out-file=/dev/null \
//!     target/release/deps/instructions-* http <chain> <get|post> 2001
//!
//! # the server in a process of its own, the client alone counted; every
//! # variant side by side, twice, 200 and 1 200 calls (issue 56):
//! checks/benches/side_by_side.sh
//! ```
//!
//! Chains: `canned` (no middleware), `reqwest-retry`, `safe-retry`
//! (`RetryMiddleware` with the default policy), `safe-retry-no-deadline`
//! (the same without a deadline: no per-request timeout),
//! `safe-retry-no-deadline-header` (the deadline kept, not sent on),
//! `safe-retry-replicas` (the default policy with its replica resolver
//! installed in the client), `keygen` (no chain: one
//! `IdempotencyKey::generate` per call). Every chain but `keygen` ends in a
//! canned `200 ok` without a socket; with `http` first it ends in a real
//! request to a local server instead, and `bare` (a plain
//! `reqwest::Client`), `floor` (a plain client sending a fixed key
//! header on a POST and a 30 s timeout: what any keyed call with a
//! deadline must) and `contract` (the empty middleware stack sending, by
//! hand, what the contract asks of a first attempt: a fresh key on the
//! POST, a 30 s timeout and the time left in `Request-Timeout-Ms`) and
//! `contract-lean` (the same, its header names known in advance and the
//! time left's value made once and shared) and
//! `contract-own-timer` (the same with the deadline kept by a timer of its
//! own, raced against the send and moved into the response body, instead
//! of reqwest's per-request timeout: what issue 19's first step would cost)
//! and `retry-floor` (a middleware doing only what any retry layer keeping
//! the contract must on a success: the contract's first attempt, a copy of
//! the request kept for a retry and a report in the response,
//! `support/floor.rs`) and `contract-floor` (the retry floor and what
//! DESIGN asks of every call beside it: admission's per-host count of
//! first attempts, the inherited deadline read, the clock read at the
//! start, every answer looked at for quota fields) join the chains. Each run prints the allocations it
//! made; per call is the same difference as for instructions. A chain
//! named `<chain>+auth` (`bare`, `empty`, `reqwest-retry`, the
//! `safe-retry` ones) sends every request with an `Authorization` header,
//! a bearer token: what a caller's credential costs each layer (issue 56).

#[path = "support/floor.rs"]
mod floor;
mod support;

use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use reqwest_retry::policies::ExponentialBackoff;
use reqwest_retry::RetryTransientMiddleware;
use reqwest_safe_retry::keys::KeyGenerator;
use reqwest_safe_retry::{IdempotencyKey, RetryMiddleware, RetryPolicy};
use support::{block_on, without_deadline, Canned};

use std::alloc::{GlobalAlloc, Layout, System};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The system allocator, counting allocations.
struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: every call is passed on to the system allocator unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract is the system allocator's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// A chain's middlewares, ending in a canned answer (`canned`) or in the
/// network.
fn chain(name: &str, canned: bool) -> Option<ClientWithMiddleware> {
    let builder = ClientBuilder::new(reqwest::Client::new());
    let builder = match name {
        "canned" | "empty" => builder,
        "reqwest-retry" => builder.with(RetryTransientMiddleware::new_with_policy(
            ExponentialBackoff::builder().build_with_max_retries(2),
        )),
        "safe-retry" => builder.with(RetryMiddleware::new(RetryPolicy::default())),
        "safe-retry-replicas" => {
            let policy = RetryPolicy::default();
            let http = reqwest::Client::builder()
                .dns_resolver(policy.replica_resolver())
                .build()
                .expect("a client");
            ClientBuilder::new(http).with(RetryMiddleware::new(policy))
        }
        "safe-retry-no-deadline" => builder.with(without_deadline()),
        "safe-retry-no-deadline-header" => builder.with(RetryMiddleware::new(
            RetryPolicy::builder()
                .no_deadline_header()
                .build()
                .expect("a valid policy"),
        )),
        _ => return None,
    };
    Some(if canned {
        builder.with(Canned).build()
    } else {
        builder.build()
    })
}

fn usage() {
    eprintln!(
        "usage: instructions <canned|reqwest-retry|safe-retry|safe-retry-no-deadline|\
         safe-retry-no-deadline-header|safe-retry-replicas|keygen> \
         <get|post> <calls>\n       instructions http \
         <bare|floor|contract|contract-lean|contract-own-timer|retry-floor|contract-floor|empty|reqwest-retry|safe-retry|\
         safe-retry-no-deadline|safe-retry-no-deadline-header|safe-retry-replicas> \
         <get|post> <calls> (any but the hand-written ones with +auth: a bearer token)\n       \
         instructions serve [address]\n       \
         instructions remote <url> <chain, as for http> <get|post> <calls>"
    );
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().is_some_and(|a| a == "serve") {
        serve(args.get(1).map_or("127.0.0.1:0", String::as_str));
        return;
    }
    if args.iter().any(|a| a == "--bench") || args.len() < 3 {
        // `cargo bench` runs every bench target: this one is run by hand.
        usage();
        return;
    }
    if args[0] == "http" && args.len() >= 4 {
        let calls: u64 = args[3].parse().expect("a number of calls");
        http(None, &args[1], args[2] == "post", calls);
        println!("allocations: {}", ALLOCATIONS.load(Ordering::Relaxed));
        return;
    }
    if args[0] == "remote" && args.len() >= 5 {
        let calls: u64 = args[4].parse().expect("a number of calls");
        http(Some(&args[1]), &args[2], args[3] == "post", calls);
        println!("allocations: {}", ALLOCATIONS.load(Ordering::Relaxed));
        return;
    }
    let calls: u64 = args[2].parse().expect("a number of calls");
    let post = args[1] == "post";
    // reqwest's timeout needs a runtime's timer; no task is spawned.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let _guard = rt.enter();
    if args[0] == "keygen" {
        for _ in 0..calls {
            std::hint::black_box(IdempotencyKey::generate(KeyGenerator::UuidV4));
        }
        println!("allocations: {}", ALLOCATIONS.load(Ordering::Relaxed));
        return;
    }
    let client = chain(&args[0], true).expect("a known chain");
    for _ in 0..calls {
        let request = if post {
            client.post("http://127.0.0.1:9/x").body("{}")
        } else {
            client.get("http://127.0.0.1:9/x")
        };
        let response = block_on(request.send()).expect("the canned response");
        std::hint::black_box(response.status());
    }
    println!("allocations: {}", ALLOCATIONS.load(Ordering::Relaxed));
}

/// What the contract asks of every first attempt, written by hand: a fresh
/// key on the POST and the time left (30 s) in a header; the deadline
/// itself is the caller's to keep.
fn contract_request(
    c: &ClientWithMiddleware,
    url: &str,
    post: bool,
) -> reqwest_middleware::RequestBuilder {
    let request = if post {
        let key = IdempotencyKey::generate(KeyGenerator::UuidV4);
        c.post(url)
            .header("idempotency-key", key.as_str())
            .body("{}")
    } else {
        c.get(url)
    };
    request.header("request-timeout-ms", 30_000u64)
}

/// [`contract_request`] written as cheaply as it can be (the
/// `contract-lean` chain): the header names known in advance and the
/// time left's value made once and shared, as `RetryMiddleware` sends a
/// whole deadline's.
fn contract_lean_request(
    c: &ClientWithMiddleware,
    url: &str,
    post: bool,
    time_left: &http::HeaderValue,
) -> reqwest_middleware::RequestBuilder {
    const KEY: http::HeaderName = http::HeaderName::from_static("idempotency-key");
    const TIME_LEFT: http::HeaderName = http::HeaderName::from_static("request-timeout-ms");
    let request = if post {
        let key = IdempotencyKey::generate(KeyGenerator::UuidV4);
        let value = http::HeaderValue::from_str(key.as_str()).expect("a key is a header value");
        c.post(url).header(KEY, value).body("{}")
    } else {
        c.get(url)
    };
    request.header(TIME_LEFT, time_left.clone())
}

/// A response body read under the call's own deadline (the
/// `contract-own-timer` chain): past it, a read fails with `TimedOut`.
struct OwnDeadline {
    body: reqwest::Body,
    sleep: std::pin::Pin<Box<tokio::time::Sleep>>,
}

impl hyper::body::Body for OwnDeadline {
    type Data = bytes::Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        if this.sleep.as_mut().poll(cx).is_ready() {
            let e = std::io::Error::new(std::io::ErrorKind::TimedOut, "deadline");
            return std::task::Poll::Ready(Some(Err(e.into())));
        }
        std::pin::Pin::new(&mut this.body)
            .poll_frame(cx)
            .map(|f| f.map(|r| r.map_err(Into::into)))
    }
}

/// The server every chain calls: `ok` to a GET or a POST of `/x`.
fn app() -> axum::Router {
    axum::Router::new().route(
        "/x",
        axum::routing::get(|| async { "ok" }).post(|| async { "ok" }),
    )
}

/// The server alone, in a process of its own (`serve [address]`): prints
/// its URL on a line, then serves until it is killed, so that a client
/// counted under callgrind (`remote <url> …`) is counted alone.
fn serve(address: &str) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind(address)
            .await
            .expect("a port");
        let url = format!("http://{}/x", listener.local_addr().expect("an address"));
        {
            use std::io::Write;
            let mut out = std::io::stdout().lock();
            writeln!(out, "{url}").expect("stdout");
            out.flush().expect("stdout");
        }
        axum::serve(listener, app()).await.expect("the server");
    });
}

/// The credential of the `+auth` chains: a bearer token of a usual
/// length (an opaque 43-character token).
const BEARER: &str = "Bearer 8sJ2kQ0vX1cR7mN4pL9tY6wE3aZ5uH0bG2dF8iK1oT7";

/// `calls` requests, one at a time, to `remote` (a server in another
/// process, `serve`), or to an axum server on loopback served by the same
/// thread (a current-thread runtime), when `remote` is `None`: then client
/// and server are both counted, the same server for every chain.
fn http(remote: Option<&str>, name: &str, post: bool, calls: u64) {
    // `<chain>+auth` (a chain with no hand-written request of its own, or
    // `bare`): every request carries a caller's credential, which
    // `RetryMiddleware` digests into the route it paces.
    let (name, auth) = match name.strip_suffix("+auth") {
        Some(name) => (name, Some(BEARER)),
        None => (name, None),
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    rt.block_on(async {
        let url = match remote {
            Some(url) => url.to_owned(),
            None => {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                    .await
                    .expect("a port");
                let url = format!("http://{}/x", listener.local_addr().expect("an address"));
                tokio::spawn(async move { axum::serve(listener, app()).await });
                url
            }
        };
        let bare = reqwest::Client::new();
        let time_left = http::HeaderValue::from(30_000u64);
        let chain = match name {
            "bare" | "floor" => None,
            "contract" | "contract-lean" | "contract-own-timer" => {
                Some(chain("empty", false).expect("the empty chain"))
            }
            "retry-floor" => Some(
                ClientBuilder::new(reqwest::Client::new())
                    .with(floor::RetryFloor::new())
                    .build(),
            ),
            "contract-floor" => Some(
                ClientBuilder::new(reqwest::Client::new())
                    .with(floor::ContractFloor::new())
                    .build(),
            ),
            other => Some(chain(other, false).expect("a known chain")),
        };
        for _ in 0..calls {
            let response = match (&chain, name) {
                (Some(c), "contract") => contract_request(c, &url, post)
                    .timeout(Duration::from_secs(30))
                    .send()
                    .await
                    .ok(),
                (Some(c), "contract-lean") => contract_lean_request(c, &url, post, &time_left)
                    .timeout(Duration::from_secs(30))
                    .send()
                    .await
                    .ok(),
                (Some(c), "contract-own-timer") => {
                    let request = contract_request(c, &url, post);
                    let mut sleep = Box::pin(tokio::time::sleep(Duration::from_secs(30)));
                    let response = tokio::select! {
                        r = request.send() => r.ok(),
                        _ = &mut sleep => None,
                    };
                    response.map(|r| {
                        use reqwest::ResponseBuilderExt;
                        let url = r.url().clone();
                        let r: http::Response<reqwest::Body> = r.into();
                        let (mut parts, body) = r.into_parts();
                        let tag = http::Response::builder()
                            .url(url)
                            .body(())
                            .expect("a response");
                        parts.extensions.extend(tag.into_parts().0.extensions);
                        let body = reqwest::Body::wrap(OwnDeadline { body, sleep });
                        reqwest::Response::from(http::Response::from_parts(parts, body))
                    })
                }
                (Some(c), _) => {
                    let request = if post {
                        c.post(&url).body("{}")
                    } else {
                        c.get(&url)
                    };
                    match auth {
                        Some(token) => request.header(http::header::AUTHORIZATION, token),
                        None => request,
                    }
                    .send()
                    .await
                    .ok()
                }
                (None, "floor") => {
                    let mut request = if post {
                        bare.post(&url)
                            .header("idempotency-key", "3f0e8e9c-5d4a-4d7e-9a53-2c0b7f1e6a11")
                            .body("{}")
                    } else {
                        bare.get(&url)
                    };
                    request = request.timeout(Duration::from_secs(30));
                    request.send().await.ok()
                }
                (None, _) => {
                    let request = if post {
                        bare.post(&url).body("{}")
                    } else {
                        bare.get(&url)
                    };
                    match auth {
                        Some(token) => request.header(http::header::AUTHORIZATION, token),
                        None => request,
                    }
                    .send()
                    .await
                    .ok()
                }
            };
            let response = response.expect("the local server answers");
            assert!(response.status().is_success());
            std::hint::black_box(response.bytes().await.expect("the body"));
        }
    });
}
