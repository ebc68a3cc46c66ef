//! Running a claimed request in the response future instead of a task of
//! its own, without giving up what the task gave: [`Detach`] hands the
//! unfinished rest to the runtime when the response future is dropped (the
//! client went away), and [`catch_unwind`] turns a handler's panic into a
//! value, as a task's `JoinError` did.

use std::future::Future;
use std::panic::{self, AssertUnwindSafe};
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::runtime::Handle;

/// Polls `future` in place, in the caller's task; if dropped before the
/// future finishes, spawns the (already pinned and boxed) rest on `runtime`
/// so that it still runs to completion.
///
/// The hand-over costs nothing on the common path: a request whose client
/// stays connected runs where hyper polls it, with no spawn and no wake-up
/// of another thread. The box is the allocation a spawned task would have
/// made anyway.
pub(crate) struct Detach<F: Future<Output: Send + 'static> + Send + 'static> {
    future: Option<Pin<Box<F>>>,
    runtime: Handle,
}

impl<F: Future<Output: Send + 'static> + Send + 'static> Detach<F> {
    pub(crate) fn new(future: F, runtime: Handle) -> Self {
        Self {
            future: Some(Box::pin(future)),
            runtime,
        }
    }
}

impl<F: Future<Output: Send + 'static> + Send + 'static> Future for Detach<F> {
    type Output = Option<F::Output>;

    /// `None` only if polled again after it finished (never, by the layer).
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let Some(future) = self.future.as_mut() else {
            return Poll::Ready(None);
        };
        match panic::catch_unwind(AssertUnwindSafe(|| future.as_mut().poll(cx))) {
            Ok(Poll::Ready(output)) => {
                self.future = None;
                Poll::Ready(Some(output))
            }
            Ok(Poll::Pending) => Poll::Pending,
            Err(payload) => {
                // A future that panicked must not be polled again: forget
                // it, so that the drop during the unwind spawns nothing.
                self.future = None;
                panic::resume_unwind(payload)
            }
        }
    }
}

impl<F: Future<Output: Send + 'static> + Send + 'static> Drop for Detach<F> {
    fn drop(&mut self) {
        if let Some(rest) = self.future.take() {
            // Its output (the response nobody waits for) is dropped; what
            // matters is that the handler finishes and its claim settles.
            // On a runtime that is shutting down the task is dropped at
            // once, as the spawned task of before was.
            drop(self.runtime.spawn(rest));
        }
    }
}

/// The handler panicked (the payload was reported by the panic hook).
#[derive(Debug)]
pub(crate) struct Panicked;

/// Calls `call` and awaits the future it returns, turning a panic in either
/// into `Err(Panicked)` (the transactional mode's handler). After a panic the future is dropped, never polled
/// again, so nothing observes state the panic left half-updated
/// (`AssertUnwindSafe`).
#[cfg(feature = "postgres")]
pub(crate) async fn catch_unwind<F: Future>(
    call: impl FnOnce() -> F,
) -> Result<F::Output, Panicked> {
    let mut future = std::pin::pin!(call_catching(call).ok());
    std::future::poll_fn(|cx| poll_slot(future.as_mut(), cx)).await
}

/// `call()`, or `Err(Panicked)` if it panicked.
pub(crate) fn call_catching<F>(call: impl FnOnce() -> F) -> Result<F, Panicked> {
    panic::catch_unwind(AssertUnwindSafe(call)).map_err(|_| Panicked)
}

/// Polls `future`, turning a panic into `Ready(Err(Panicked))`; the caller
/// must not poll it again after that. The pieces of [`catch_unwind`], for
/// a caller that pins the future in its own state rather than in one more
/// nested future (which would hold the handler's arguments once more).
pub(crate) fn poll_catching<F: Future>(
    future: Pin<&mut F>,
    cx: &mut Context<'_>,
) -> Poll<Result<F::Output, Panicked>> {
    match panic::catch_unwind(AssertUnwindSafe(|| future.poll(cx))) {
        Ok(Poll::Ready(output)) => Poll::Ready(Ok(output)),
        Ok(Poll::Pending) => Poll::Pending,
        Err(_) => Poll::Ready(Err(Panicked)),
    }
}

/// [`poll_catching`] for a future kept in an `Option` (so that its owner
/// can drop it at a moment of its choosing, see [`drop_catching`]):
/// `Err(Panicked)` at once for `None`, the slot of a call that panicked
/// before it returned a future.
pub(crate) fn poll_slot<F: Future>(
    slot: Pin<&mut Option<F>>,
    cx: &mut Context<'_>,
) -> Poll<Result<F::Output, Panicked>> {
    match slot.as_pin_mut() {
        Some(future) => poll_catching(future, cx),
        None => Poll::Ready(Err(Panicked)),
    }
}

/// Drops what `slot` holds, turning a panic of its destructor into
/// `Err(Panicked)`: code of the handler's (its future, its response body)
/// is dropped where a panic is caught, not while another unwinds.
pub(crate) fn drop_catching<T>(mut slot: Pin<&mut Option<T>>) -> Result<(), Panicked> {
    call_catching(|| slot.set(None))
}
