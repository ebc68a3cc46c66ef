//! The least a retry layer that keeps the contract does on a call that
//! succeeds at once: what the contract written by hand sends (a fresh key
//! on a POST, a 30 s timeout, the time left in `Request-Timeout-Ms`), and
//! beside it a copy of the request kept for a retry, made before the
//! headers are added so that it copies only the caller's, and a report in
//! the response's extensions. Issue 33 measures `RetryMiddleware` against
//! it. The time left's value is made once and shared (issue 56).
//!
//! The copy is reqwest's `Request::try_clone`, the only one that keeps
//! the extensions reqwest holds private (a request converted from an
//! `http::Request` carries the caller's); the report is a value of about
//! `RetryReport`'s size, inserted as the middleware inserts it.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use http::{Extensions, HeaderMap, HeaderName, HeaderValue, Method};
use reqwest::{Request, Response};
use reqwest_middleware::{Middleware, Next};
use reqwest_safe_retry::keys::KeyGenerator;
use reqwest_safe_retry::IdempotencyKey;

/// A value of about the report's size: only its size is read.
#[derive(Clone)]
pub struct FloorReport(#[allow(dead_code)] [u64; 16]);

/// The contract's first attempt, a copy kept for a retry, and a report.
/// The time left's value is made once and shared, as `RetryMiddleware`
/// sends a whole deadline's (issue 56): a value made per call allocates
/// twice, which no retry layer needs to.
pub struct RetryFloor {
    time_left: HeaderValue,
}

impl RetryFloor {
    /// The floor, its 30 s value made.
    pub fn new() -> Self {
        RetryFloor::default()
    }
}

impl Default for RetryFloor {
    fn default() -> Self {
        RetryFloor {
            time_left: HeaderValue::from(30_000u64),
        }
    }
}

#[async_trait::async_trait]
impl Middleware for RetryFloor {
    async fn handle(
        &self,
        mut request: Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<Response> {
        let copy = self.prepare(&mut request);
        let mut response = next.run(request, extensions).await?;
        drop(copy);
        report(&mut response);
        Ok(response)
    }
}

impl RetryFloor {
    /// The copy kept for a retry, made before the attempt's headers are
    /// added; then the contract's first attempt: the timeout, a fresh key
    /// on a POST, the time left. Plain functions around the send, so that
    /// a layer built on the floor adds no future of its own (a bigger boxed
    /// future can leave the allocator's fast path).
    #[inline(always)]
    fn prepare(&self, request: &mut Request) -> Option<Request> {
        let copy = request.try_clone();
        let post = request.method() == Method::POST;
        *request.timeout_mut() = Some(Duration::from_secs(30));
        let headers = request.headers_mut();
        if post {
            let key = IdempotencyKey::generate(KeyGenerator::UuidV4);
            if let Ok(value) = HeaderValue::from_str(key.as_str()) {
                headers.insert(HeaderName::from_static("idempotency-key"), value);
            }
        }
        headers.insert(
            HeaderName::from_static("request-timeout-ms"),
            self.time_left.clone(),
        );
        copy
    }
}

/// The report, in the response's extensions.
#[inline(always)]
fn report(response: &mut Response) {
    response
        .extensions_mut()
        .insert(FloorReport(std::hint::black_box([1; 16])));
}

/// The retry floor, and what DESIGN asks of every call beside it that the
/// floor leaves out, each as cheaply as it can be done (issue 56):
/// - admission kept per host counts each first attempt (the retry budget
///   is earned by them) and asks whether the host's quota is reported
///   spent (first attempts are held only then): one lock of a sharded map
///   keyed by the host's digest;
/// - the deadline inherited from a request being served is read (a
///   tokio task-local, as the inbound layer sets one);
/// - the clock is read once, when the call starts: the deadline a retry
///   would be bounded by is counted from there;
/// - every answer is looked at for a server's quota fields (`RateLimit`,
///   `X-RateLimit-*`), which can say a quota is spent on a success too.
///
/// Not asked by DESIGN, so not here: the report's elapsed time (a second
/// clock read), the breaker, hedging, replicas and pacing by credential.
pub struct ContractFloor {
    floor: RetryFloor,
    hosts: [Mutex<HashMap<u64, Host, BuildHasherDefault<Digest>>>; 16],
}

/// What the contract floor keeps per host.
#[derive(Default)]
struct Host {
    first_attempts: u64,
    quota_spent_until: Option<Instant>,
}

/// A hasher for keys that are digests already: their own bits.
#[derive(Default)]
struct Digest(u64);

impl Hasher for Digest {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 << 8) | u64::from(*b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

tokio::task_local! {
    /// The inherited deadline, never set here: a call reads it all the same.
    static INHERITED: Instant;
}

impl ContractFloor {
    /// The contract floor, its map empty.
    pub fn new() -> Self {
        ContractFloor {
            floor: RetryFloor::new(),
            hosts: std::array::from_fn(|_| Mutex::new(HashMap::default())),
        }
    }
}

/// The digest of a URL's host and port (FNV-1a: cheaper than the keyed
/// digest `RetryMiddleware` remembers per thread).
fn host_digest(url: &reqwest::Url) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in url.host_str().unwrap_or_default().bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    (h ^ u64::from(url.port_or_known_default().unwrap_or(0))).wrapping_mul(0x0100_0000_01b3)
}

/// Whether an answer carries quota fields.
fn has_quota_fields(headers: &HeaderMap) -> bool {
    headers.keys().any(|name| {
        let name = name.as_str().as_bytes();
        name.starts_with(b"ratelimit") || name.starts_with(b"x-ratelimit-")
    })
}

#[async_trait::async_trait]
impl Middleware for ContractFloor {
    async fn handle(
        &self,
        mut request: Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<Response> {
        let started = Instant::now();
        let inherited = INHERITED.try_with(|d| *d).ok();
        let host = host_digest(request.url());
        let shard = &self.hosts[(host >> 60) as usize];
        let held = {
            let mut hosts = shard.lock().unwrap_or_else(|e| e.into_inner());
            let state = hosts.entry(host).or_default();
            state.first_attempts += 1;
            state.quota_spent_until.is_some_and(|until| until > started)
        };
        std::hint::black_box((inherited, held));
        let copy = self.floor.prepare(&mut request);
        let mut response = next.run(request, extensions).await?;
        drop(copy);
        std::hint::black_box(has_quota_fields(response.headers()));
        report(&mut response);
        Ok(response)
    }
}
