//! What the benches share: a chain's end that answers without a socket, and
//! a poller for futures that never wait.

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use http::Extensions;
use reqwest_middleware::{Middleware, Next};

/// The end of a middleware chain: answers `200 ok` without a socket, so a
/// chain ending here prices its middlewares alone.
pub struct Canned;

#[async_trait::async_trait]
impl Middleware for Canned {
    async fn handle(
        &self,
        _req: reqwest::Request,
        _extensions: &mut Extensions,
        _next: Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        Ok(reqwest::Response::from(http::Response::new("ok")))
    }
}

/// Polls a future that never waits (no I/O, a sleeper that returns at
/// once) to completion, without a runtime.
pub fn block_on<F: Future>(f: F) -> F::Output {
    let mut f = pin!(f);
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
    }
}
