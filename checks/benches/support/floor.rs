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

use std::time::Duration;

use http::{Extensions, HeaderName, HeaderValue, Method};
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
        let mut response = next.run(request, extensions).await?;
        drop(copy);
        response
            .extensions_mut()
            .insert(FloorReport(std::hint::black_box([1; 16])));
        Ok(response)
    }
}
