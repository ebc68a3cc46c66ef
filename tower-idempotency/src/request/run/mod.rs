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
//!
//! The two-phase mode, in two files: this one runs the request and stores
//! its response; `claim.rs` holds the key the request owns until it is
//! settled. Both may use what lies below the layer (the settings, the
//! store, the keeper, the answers given without running, the body and
//! replay helpers); neither imports the layer or the transactional mode.

mod claim;

use std::future::{poll_fn, Future};
use std::pin::pin;
use std::sync::Arc;

use bytes::Bytes;
use http::request::Parts;
use http::{Request, Response};
use http_body::Body;
use tokio::runtime::Handle;
use tower_service::Service;

use crate::memory::{KeptResponse, KeyHash};
use crate::request::answer::answer_without_running;
use crate::request::body::{collect_catching, CollectError};
use crate::request::config::Config;
use crate::request::context::{BoxError, IdempotencyContext};
use crate::request::inline::{call_catching, drop_catching, poll_slot, Panicked};
use crate::request::keeper::{Kept, LeaseKeeper};
use crate::request::key::fingerprint;
use crate::request::replay::{to_response, to_stored};
use crate::request::scope::announce;
use crate::store::{IdempotencyStore, StoredResponse};

use self::claim::{Answer, Claim, Settled};

/// Runs a keyed request whose body has been read. Polled in the response
/// future inside [`Detach`](crate::request::inline::Detach): if the client goes away
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
        announce(&mut parts.extensions, &scope);
        // Before the claim leaves: the store's lock time is no earlier, so
        // the lease is ours for a lock timeout from here.
        let claimed_at = tokio::time::Instant::now();
        let request = config.claim(&scope, &key, fingerprint);
        // With a `MemoryStore`, the key's hash too, kept for the completion.
        let (claimed, memory_hash) = match &config.memory {
            // A `MemoryStore` answers at once: called directly, without the
            // trait's boxed future.
            Some(memory) => {
                let hash = memory.0.hash_of(&scope, &key);
                (memory.0.claim_hashed(request, hash), hash)
            }
            // Through the `dyn`, not `Arc<dyn _>`: the blanket impl for
            // `Arc` would box a second future around the store's own.
            None => ((*store).claim(request).await, KeyHash::default()),
        };
        let (lease, epoch) = match answer_without_running(claimed, &config) {
            Ok(claimed) => claimed,
            Err(answer) => return Ok(answer),
        };
        let mut kept = Kept::new(scope, key, lease)
            .with_fingerprint(fingerprint)
            .with_epoch(epoch)
            .leased(claimed_at, config.lock_timeout);
        kept.memory_hash = memory_hash;
        let kept = Arc::new(kept);
        parts
            .extensions
            .insert(IdempotencyContext::from_kept(kept.clone()));
        let claim = Claim {
            store,
            kept,
            config: config.clone(),
            keeper,
        };
        // Extended from the keeper's tasks, not this one: the handler runs
        // inline below and may block this task's thread.
        let keeping = claim.keeper.keep(claim.kept.clone(), &runtime);
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
                if config.frees_key(status) {
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
        let answer = HandlerAnswer {
            parts: &parts,
            names: &config.stored_headers,
            body: &body,
        };
        let settled = claim.complete(answer).await;
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

/// The handler's response, to store: a `MemoryStore` keeps its headers
/// as they are, without copying them into strings.
struct HandlerAnswer<'a> {
    parts: &'a http::response::Parts,
    names: &'a [http::HeaderName],
    body: &'a Bytes,
}

impl Answer for HandlerAnswer<'_> {
    fn stored(&self) -> StoredResponse {
        to_stored(self.parts, self.names, self.body.clone())
    }

    fn kept(&self) -> KeptResponse {
        KeptResponse::of(self.parts, self.names, self.body.clone())
    }
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use axum::body::Body;
    use tower::ServiceExt;
    use tower_layer::Layer;

    use super::*;
    use crate::{IdempotencyLayer, MemoryStore};

    /// A `MemoryStore` given by type is claimed and completed directly
    /// (no boxed future of the store trait's), in the very store the layer
    /// was given: the key's record is there, and the retry is a replay.
    /// One behind an `Arc<dyn _>` goes through the trait.
    #[tokio::test]
    async fn a_memory_store_is_called_directly_and_keeps_the_response() {
        let store = MemoryStore::new();
        let layer = IdempotencyLayer::new(store.clone());
        assert!(
            layer.config.memory.is_some(),
            "no direct path for MemoryStore"
        );
        let built = IdempotencyLayer::builder(store.clone()).build().unwrap();
        assert!(
            built.config.memory.is_some(),
            "builder lost the direct path"
        );
        let shared: Arc<dyn IdempotencyStore> = Arc::new(MemoryStore::new());
        assert!(IdempotencyLayer::from_arc(shared).config.memory.is_none());

        let router = axum::Router::new().route(
            "/pay",
            axum::routing::post(|| async { (http::StatusCode::CREATED, "paid") }),
        );
        let mut service = layer.layer(router);
        for attempt in 0..2 {
            let request = Request::post("/pay")
                .header("idempotency-key", "k")
                .body(Body::from("{}"))
                .unwrap();
            let response = ServiceExt::<Request<Body>>::ready(&mut service)
                .await
                .unwrap()
                .call(request)
                .await
                .unwrap();
            assert_eq!(response.status(), http::StatusCode::CREATED);
            let replayed = response.headers().contains_key("idempotent-replayed");
            assert_eq!(replayed, attempt == 1, "attempt {attempt}");
        }
        assert_eq!(store.len(), 1);
        let anonymous = IdempotencyLayer::new(MemoryStore::new())
            .stored_scope(&Request::post("/pay").body(()).unwrap().into_parts().0);
        let found = (&store as &dyn IdempotencyStore)
            .lookup(&anonymous, "k", crate::store::Fingerprint([0; 32]))
            .await
            .unwrap();
        assert!(
            matches!(found, Some(crate::store::ClaimOutcome::Completed { .. })),
            "{found:?}"
        );
    }

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
