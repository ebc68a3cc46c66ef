//! What the benches share: a chain's end that answers without a socket, the
//! middleware without a deadline, and a poller for futures that never wait.

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use reqwest_safe_retry::{RetryMiddleware, RetryPolicy};

#[path = "../../tests/support/canned.rs"]
mod canned;
pub use canned::Canned;

/// `RetryMiddleware` with the default policy but no deadline: no timeout
/// is armed per request, which prices the default deadline's timer.
pub fn without_deadline() -> RetryMiddleware {
    RetryMiddleware::new(
        RetryPolicy::builder()
            .no_deadline()
            .build()
            .expect("a valid policy"),
    )
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
