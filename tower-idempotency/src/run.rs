//! The path of a keyed request once its body is read, top to bottom:
//! fingerprint and scope → claim (or answer from the store's state) → run
//! the handler while its lease is kept alive → store its response, free the
//! key, or leave a marker.
//!
//! The rule behind every branch: a key is freed only when the handler
//! provably did no work (it was refused before running, or answered one of
//! the configured release statuses). Whatever happens after the handler
//! started (a panic, an error, a response too large to keep, a store that
//! fails) leaves the key completed, so a retry can never run it twice.

use std::future::{poll_fn, Future};
use std::pin::{pin, Pin};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::request::Parts;
use http::{Request, Response};
use http_body::Body;
use tokio::runtime::Handle;
use tower_service::Service;

use crate::answer::answer_without_running;
use crate::body::{collect_catching, CollectError};
use crate::config::Config;
use crate::context::{BoxError, IdempotencyContext};
use crate::inline::{call_catching, drop_catching, poll_slot, Panicked};
use crate::keeper::{Kept, LeaseKeeper};
use crate::key::fingerprint;
use crate::problem::{problem, ProblemKind};
use crate::replay::{marker, retry_after_value, to_response, to_stored};
use crate::store::{IdempotencyStore, StoreError, StoredResponse};

/// Pause before the second attempt; doubled for each further one, up to
/// [`COMPLETE_BACKOFF_CAP`].
const COMPLETE_BACKOFF: Duration = Duration::from_millis(20);
/// The longest pause between two attempts.
const COMPLETE_BACKOFF_CAP: Duration = Duration::from_secs(1);

/// Runs a keyed request whose body has been read. Polled in the response
/// future inside [`Detach`](crate::inline::Detach): if the client goes away
/// once the body is read, the rest still runs to its end in a task of its
/// own, so it is never cancelled by a disconnect.
///
/// A plain function returning an `async move` block rather than an `async
/// fn`: the block uses its captured arguments in place, where an `async fn`
/// would copy each into a local and hold both (~350 bytes more in every
/// request's boxed future).
// The layout is the point (see above), not an oversight.
#[allow(clippy::too_many_arguments, clippy::manual_async_fn)]
pub(crate) fn process<S, ReqBody, ResBody>(
    mut inner: S,
    store: Arc<dyn IdempotencyStore>,
    keeper: Arc<LeaseKeeper>,
    runtime: Handle,
    config: Arc<Config>,
    mut parts: Parts,
    body: Bytes,
    key: String,
) -> impl Future<Output = Result<Response<ResBody>, S::Error>> + Send + 'static
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqBody: From<Bytes> + Send + 'static,
    ResBody: Body<Data = Bytes> + From<Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    async move {
        let fingerprint = fingerprint(&parts, &config.fingerprint_headers, &body);
        let scope = config.scope.stored_scope(&parts);
        // Through the `dyn`, not `Arc<dyn _>`: the blanket impl for `Arc`
        // would box a second future around the store's own.
        let claimed = (*store)
            .claim(config.claim(&scope, &key, fingerprint))
            .await;
        let lease = match answer_without_running(claimed, &config) {
            Ok(lease) => lease,
            Err(answer) => return Ok(answer),
        };
        let kept = Arc::new(Kept::new(scope, key, lease).with_fingerprint(fingerprint));
        parts
            .extensions
            .insert(IdempotencyContext::from_kept(kept.clone()));
        let claim = Claim {
            store,
            kept,
            config: config.clone(),
        };
        // Extended from the keeper's tasks, not this one: the handler runs
        // inline below and may block this task's thread.
        let keeping = keeper.keep(claim.kept.clone(), &runtime);
        if keeping.started_ticker {
            // Let the new ticker be polled before the handler can block this
            // thread (see `LeaseKeeper::keep`).
            tokio::task::yield_now().await;
        }
        // Inline, in this task: a panic is caught here, and the lease is kept
        // alive by the keeper's tasks, so a handler blocking this thread still
        // keeps it (tests/blocking_handler.rs). The handler's future is pinned
        // right here, not in a nested future that would hold the request twice.
        let request = Request::from_parts(parts, ReqBody::from(body));
        // In a block of its own: the handler's future is gone before its
        // response is stored, so the two never share this future's space.
        let outcome = {
            // `None` if calling the service panicked before it returned a
            // future.
            let mut future = pin!(call_catching(|| inner.call(request)).ok());
            let outcome = poll_fn(|cx| poll_slot(future.as_mut(), cx)).await;
            // Dropped here, where a panic in its destructor is caught as
            // well: the handler started, so that panic too must leave the
            // marker rather than unwind past the claim.
            drop_catching(future).and(outcome)
        };
        // Settled here, each branch awaiting only what it needs. Nothing is
        // borrowed from `outcome` or the response before it is taken apart:
        // a borrowed value keeps its place in this future across every later
        // `.await`, and the response would be held twice.
        let done = match outcome {
            Ok(Ok(response)) => {
                let (parts, body) = response.into_parts();
                let status = parts.status;
                if config.release_statuses.contains(&status) {
                    claim.release().await;
                    Ok(Response::from_parts(parts, body))
                } else {
                    Ok(store_response(parts, body, &claim, &config).await)
                }
            }
            Ok(Err(err)) => {
                claim
                    .leave_marker(
                        "the service failed after it started; whether its effect happened is \
                         unknown",
                    )
                    .await;
                Err(err)
            }
            Err(Panicked) => {
                let detail =
                    "the handler panicked after it started; whether its effect happened is unknown";
                Ok(to_response(claim.leave_marker(detail).await, false))
            }
        };
        drop(keeping);
        done
    }
}

/// Keeps the response of a handler that finished (the marker instead if
/// its body cannot be kept) and returns it. An `async move` block, not an
/// `async fn`, for the reason given at [`process`].
// The layout is the point, not an oversight.
#[allow(clippy::manual_async_fn)]
fn store_response<'a, ResBody>(
    parts: http::response::Parts,
    body: ResBody,
    claim: &'a Claim,
    config: &'a Config,
) -> impl Future<Output = Response<ResBody>> + Send + 'a
where
    ResBody: Body<Data = Bytes> + From<Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    async move {
        // The body is the handler's code too: a stream that panics leaves
        // the marker instead of unwinding past the claim. Its future is gone
        // before any other `.await` below: a local alive across two of them
        // keeps its own place in the request's future.
        let collected = collect_catching(body, config.max_response_body).await;
        // Matched as a temporary, not a local: a local that a `match` takes
        // apart still counts as alive at every later `.await`.
        let body = match kept_body(collected, parts.status, config) {
            Ok(body) => body,
            Err(detail) => return to_response(claim.leave_marker(&detail).await, false),
        };
        let settled = claim
            .complete(|| to_stored(&parts, &config.stored_headers, body.clone()))
            .await;
        match settled {
            Some(Settled::Stored) => Response::from_parts(parts, ResBody::from(body)),
            // Another request took the key over: what it stored, not ours,
            // is the key's answer.
            Some(Settled::Lost) => claim.answer_lost().await,
            None => {
                let detail = format!(
                    "the handler completed with status {} but the store failed to keep its \
                     response",
                    parts.status.as_u16()
                );
                to_response(claim.leave_marker(&detail).await, false)
            }
        }
    }
}

/// `409` with `Retry-After`: the key's answer belongs to another run; the
/// retry reads it from the store.
fn lost_answer<B: From<Bytes>>(config: &Config) -> Response<B> {
    problem(
        ProblemKind::InProgress,
        "another request with this idempotency key holds its outcome; retry to get it",
        Some(retry_after_value(config.retry_after)),
    )
}

/// The collected response body, or why it cannot be kept (the marker's
/// detail).
fn kept_body(
    collected: Result<Result<Bytes, CollectError>, Panicked>,
    status: http::StatusCode,
    config: &Config,
) -> Result<Bytes, String> {
    let status = status.as_u16();
    match collected {
        Ok(Ok(body)) => Ok(body),
        Err(Panicked) => Err(format!(
            "the handler completed with status {status} but its response body panicked"
        )),
        Ok(Err(CollectError::TooLarge)) => Err(format!(
            "the handler completed with status {status} but its response is larger than the {} \
             bytes that can be kept for replay",
            config.max_response_body
        )),
        Ok(Err(CollectError::Failed(err))) => Err(format!(
            "the handler completed with status {status} but its response body failed: {err}"
        )),
    }
}

/// A key this request owns.
struct Claim {
    store: Arc<dyn IdempotencyStore>,
    kept: Arc<Kept>,
    /// The layer's settings (its `completion_patience`).
    config: Arc<Config>,
}

/// A store's failure to keep a response: whether trying again may help.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Retryable(bool);

/// How an attempt to keep a response ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Settled {
    /// Kept (by the layer, or by the handler in its own transaction).
    Stored,
    /// The lease is no longer ours: another request took the key over.
    Lost,
}

impl Claim {
    /// Stores the response `response` makes, retrying a failing store with
    /// a growing pause for up to the layer's `completion_patience`: long
    /// enough to outlast a database failover (the lease is kept
    /// alive meanwhile). The first attempt hands it over (a memory store
    /// keeps it without copying it); the retries, rare, store a copy made
    /// again. `None` if the store kept failing.
    async fn complete(&self, response: impl Fn() -> StoredResponse) -> Option<Settled> {
        match self.try_complete_owned(response()).await {
            Ok(done) => Some(done),
            // A permanent error: trying again cannot help.
            Err(Retryable(false)) => None,
            // Retries (with their timer) live in a box: held inline, they
            // would make every request's future larger.
            Err(Retryable(true)) => Box::pin(self.complete_retrying(&response())).await,
        }
    }

    /// The answer of an owner whose lease was lost: what the store holds
    /// for the key (the replay of the run that took it over, `409` while
    /// that run is in progress), never its own response as if it had won.
    /// Boxed: a rare path.
    fn answer_lost<'a, B: From<Bytes> + Send + 'a>(
        &'a self,
    ) -> Pin<Box<dyn Future<Output = Response<B>> + Send + 'a>> {
        Box::pin(async move {
            let (kept, config) = (&self.kept, &*self.config);
            tracing::error!(
                key = kept.key,
                "idempotency lease lost while the handler ran (taken over after it was stale); \
                 answering with what the store holds"
            );
            let found = (*self.store)
                .lookup(&kept.scope, &kept.key, kept.fingerprint)
                .await;
            match found {
                Ok(Some(outcome)) => match answer_without_running(Ok(outcome), config) {
                    Err(answer) => answer,
                    // `lookup` never claims.
                    Ok(_) => lost_answer(config),
                },
                Ok(None) | Err(_) => lost_answer(config),
            }
        })
    }

    /// The first attempt to store a handler's response, handing it over;
    /// `Err` if the store failed.
    async fn try_complete_owned(&self, response: StoredResponse) -> Result<Settled, Retryable> {
        let kept = &self.kept;
        // Through the `dyn` (see `process`).
        let stored = (*self.store)
            .complete_owned(&kept.scope, &kept.key, kept.lease, response)
            .await;
        self.completed(stored, 1)
    }

    /// Attempts `attempt` to store `response`; `Err` if the store failed.
    async fn try_complete(
        &self,
        response: &StoredResponse,
        attempt: u32,
    ) -> Result<Settled, Retryable> {
        let kept = &self.kept;
        // Through the `dyn` (see `process`).
        let stored = (*self.store)
            .complete(&kept.scope, &kept.key, kept.lease, response)
            .await;
        self.completed(stored, attempt)
    }

    /// What a store's answer to attempt `attempt` means; `Err` if the
    /// store failed, saying whether trying again may help.
    fn completed(
        &self,
        stored: Result<bool, StoreError>,
        attempt: u32,
    ) -> Result<Settled, Retryable> {
        let kept = &self.kept;
        match stored {
            Ok(true) => Ok(Settled::Stored),
            // The handler stored its response in its own transaction.
            Ok(false) if kept.completed_in_tx() => Ok(Settled::Stored),
            Ok(false) => Ok(Settled::Lost),
            Err(err) => {
                tracing::warn!(error = %err, key = kept.key, attempt, "storing an idempotent response failed");
                Err(Retryable(err.is_transient()))
            }
        }
    }

    /// The attempts after a failed first one, with a growing pause, for
    /// up to the layer's `completion_patience`.
    async fn complete_retrying(&self, response: &StoredResponse) -> Option<Settled> {
        // `None`: a patience past what an `Instant` holds, never give up.
        let give_up = tokio::time::Instant::now().checked_add(self.config.completion_patience);
        let mut pause = COMPLETE_BACKOFF;
        let mut attempt = 1;
        while give_up.is_none_or(|at| tokio::time::Instant::now() + pause <= at) {
            tokio::time::sleep(pause).await;
            pause = pause.saturating_mul(2).min(COMPLETE_BACKOFF_CAP);
            attempt += 1;
            match self.try_complete(response, attempt).await {
                Ok(done) => return Some(done),
                Err(Retryable(false)) => return None,
                Err(Retryable(true)) => {}
            }
        }
        None
    }

    /// Completes the key with the "response not retained" marker and
    /// returns it. If even that fails the key stays in progress until its
    /// lock times out, after which a retry runs the handler again: logged
    /// as an error.
    ///
    /// Boxed: a rare path, whose future would otherwise be held inline by
    /// every request's.
    fn leave_marker<'a>(
        &'a self,
        detail: &'a str,
    ) -> Pin<Box<dyn Future<Output = StoredResponse> + Send + 'a>> {
        Box::pin(async move {
            tracing::error!(
                key = self.kept.key,
                detail,
                "idempotent response not retained"
            );
            let marker = marker(detail);
            if self.complete(|| marker.clone()).await.is_none() {
                tracing::error!(
                    key = self.kept.key,
                    "storing the not-retained marker failed; the key frees after the lock timeout"
                );
            }
            marker
        })
    }

    /// Frees the key: the handler did no work.
    async fn release(&self) {
        if let Err(err) = (*self.store)
            .release(&self.kept.scope, &self.kept.key, self.kept.lease)
            .await
        {
            tracing::warn!(error = %err, key = self.kept.key, "releasing an idempotency key failed; it frees after the lock timeout");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use axum::body::Body;
    use tower::ServiceExt;
    use tower_layer::Layer;

    use super::*;
    use crate::{IdempotencyLayer, MemoryStore};

    /// Every keyed request allocates its future twice: the layer's response
    /// future, and the rest of the request in a box of its own (which a
    /// dropped response future hands to the runtime). glibc serves blocks
    /// up to 1 032 bytes from a per-thread cache and larger ones from its
    /// arenas, whose slower path (and the consolidation of freed blocks)
    /// showed in the layer's profile at 1 368 bytes. Measured with axum's
    /// router as the inner service, as `Router::layer` composes it.
    #[tokio::test]
    async fn a_keyed_requests_futures_fit_the_allocators_small_blocks() {
        let router = axum::Router::new().route("/pay", axum::routing::post(|| async { "paid" }));
        let store: Arc<dyn IdempotencyStore> = Arc::new(MemoryStore::new());
        let keeper = Arc::new(LeaseKeeper::new(store.clone(), Duration::from_secs(1)));
        let (parts, ()) = Request::post("/pay").body(()).unwrap().into_parts();
        let rest = process::<_, Body, Body>(
            router.clone(),
            store,
            keeper,
            Handle::current(),
            Arc::new(Config::default()),
            parts,
            Bytes::from_static(b"{}"),
            "k".to_owned(),
        );
        let rest = std::mem::size_of_val(&rest);
        assert!(rest <= 1024, "the claimed request's future is {rest} bytes");

        let mut service = IdempotencyLayer::new(MemoryStore::new()).layer(router);
        let service = ServiceExt::<Request<Body>>::ready(&mut service)
            .await
            .unwrap();
        let request = Request::post("/pay")
            .header("idempotency-key", "k")
            .body(Body::from("{}"))
            .unwrap();
        let response = service.call(request);
        let outer = std::mem::size_of_val(&*response);
        assert!(outer <= 1024, "the response future is {outer} bytes");
        assert_eq!(response.await.unwrap().status(), http::StatusCode::OK);
    }
}
