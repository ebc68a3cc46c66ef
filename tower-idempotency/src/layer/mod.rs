//! The top floor: the tower [`IdempotencyLayer`] (and the builder's
//! `build` that makes it) and its [`IdempotencyService`]: what the layer
//! checks before anything is claimed, then the claimed request, run in
//! the response future (see `request/run/`) and handed to a task of its
//! own if that future is dropped (`request/inline.rs`). Beside it,
//! `builder.rs`: the builder that gathers the settings.
//!
//! May use: `store`, `memory`, `postgres`, `request`.

mod builder;

pub use self::builder::{ConfigError, IdempotencyLayerBuilder};

use std::fmt;
use std::future::{poll_fn, Future};
use std::pin::{pin, Pin};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::request::Parts;
use http::{Request, Response};
use http_body::Body;
use tower_layer::Layer;
use tower_service::Service;

use crate::request::body::{collect, CollectError};
use crate::request::config::Config;
use crate::request::context::BoxError;
use crate::request::inline::Detach;
use crate::request::keeper::LeaseKeeper;
use crate::request::key::{parse_key, KeyError, MAX_KEY_LEN};
use crate::request::problem::{problem, ProblemKind};
use crate::request::run::process;
use crate::store::IdempotencyStore;

/// A tower [`Layer`] that makes `POST`/`PATCH` handlers idempotent with the
/// `Idempotency-Key` header.
///
/// Defaults: methods `POST` and `PATCH`; header `Idempotency-Key`, required on
/// those methods; fingerprint over method, path and query and body; stored
/// response headers `content-type`; keys scoped by a digest of the
/// `Authorization` header; lock timeout 5 s with a heartbeat every 5/3 s;
/// expiry 24 h; `Retry-After: 1` on 409 and 503; request and response bodies
/// up to 1 MiB; statuses 400, 415 and 422 free the key, every other status is
/// stored. Other settings: [`IdempotencyLayer::builder`].
#[derive(Clone)]
pub struct IdempotencyLayer {
    store: Arc<dyn IdempotencyStore>,
    pub(crate) config: Arc<Config>,
    keeper: Arc<LeaseKeeper>,
}

impl fmt::Debug for IdempotencyLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyLayer")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl IdempotencyLayer {
    /// A layer with the default settings, using `store`.
    pub fn new(store: impl IdempotencyStore) -> Self {
        let config = Config {
            memory: Config::memory_of(&store),
            ..Config::default()
        };
        Self::from_parts(Arc::new(store), Arc::new(config))
    }

    /// A layer with the default settings, using an already shared store.
    pub fn from_arc(store: Arc<dyn IdempotencyStore>) -> Self {
        Self::from_parts(store, Arc::new(Config::default()))
    }

    /// A builder for a layer with other settings, using `store`.
    pub fn builder(store: impl IdempotencyStore) -> IdempotencyLayerBuilder {
        let memory = Config::memory_of(&store);
        let mut builder = IdempotencyLayerBuilder::new(Arc::new(store));
        builder.config.memory = memory;
        builder
    }

    /// A builder for a layer with other settings, using a shared store.
    pub fn builder_from_arc(store: Arc<dyn IdempotencyStore>) -> IdempotencyLayerBuilder {
        IdempotencyLayerBuilder::new(store)
    }

    /// A builder for PostgreSQL's **transactional mode**: the claim, the
    /// handler's own writes and the stored response commit in one
    /// transaction (one WAL flush per request, exactly once).
    ///
    /// The handler finds an [`IdempotencyTransaction`](crate::IdempotencyTransaction)
    /// in its request extensions and writes through it; the layer commits
    /// after storing the response, or rolls everything back when the
    /// handler fails, panics, answers a release status or a response too
    /// large to keep (then nothing happened and the key is free). A
    /// duplicate arriving meanwhile waits on the claim row's lock, then gets
    /// the replay. Choose it when every effect of the handler is a write to
    /// this database; for effects elsewhere use [`IdempotencyLayer::builder`]
    /// (two-phase: claim, run, complete). No lease is kept: an open
    /// transaction cannot be taken over, and one whose server died is rolled
    /// back by PostgreSQL. Each request in flight holds one pooled
    /// connection: size the pool for the concurrency you expect
    /// ([`PostgresStore::connect_with_pool_size`](crate::PostgresStore::connect_with_pool_size)).
    /// A client that goes away rolls its request back (nothing committed,
    /// the retry runs it once).
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use tower_idempotency::{IdempotencyLayer, PostgresStore};
    /// let store = PostgresStore::connect("postgres://postgres@127.0.0.1:5432/test").await?;
    /// store.migrate().await?;
    /// let layer = IdempotencyLayer::transactional(store).build()?;
    /// # let _ = layer; Ok(()) }
    /// ```
    #[cfg(feature = "postgres")]
    pub fn transactional(store: crate::PostgresStore) -> IdempotencyLayerBuilder {
        IdempotencyLayerBuilder::new(Arc::new(store.clone())).transactional(store)
    }

    pub(crate) fn from_parts(store: Arc<dyn IdempotencyStore>, config: Arc<Config>) -> Self {
        let keeper = Arc::new(LeaseKeeper::new(store.clone(), config.heartbeat_every));
        Self {
            store,
            config,
            keeper,
        }
    }

    /// The store this layer uses.
    pub fn store(&self) -> &Arc<dyn IdempotencyStore> {
        &self.store
    }

    /// The scope a request's key is stored under: a SHA-256 digest (64
    /// lower-case hexadecimal characters) of the caller identity, never the
    /// identity itself.
    pub fn stored_scope(&self, parts: &Parts) -> String {
        self.config.scope.stored_scope(parts).into_owned()
    }
}

// Here, not in `builder.rs`: the builder's settings (`request/config.rs`)
// sit below the layer they make, and `build` makes the layer.
impl IdempotencyLayerBuilder {
    /// Checks the settings and builds the layer.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the setting when a duration is zero, the lock
    /// timeout exceeds the expiry, the heartbeat is not shorter than the lock
    /// timeout, or a released status is not a 4xx or 5xx.
    pub fn build(mut self) -> Result<IdempotencyLayer, ConfigError> {
        let c = &mut self.config;
        for (setting, value) in [
            ("lock_timeout", c.lock_timeout),
            ("expiry", c.expiry),
            ("request_body_timeout", c.request_body_timeout),
            // `Retry-After: 0` on every 409 and 503 would invite a loop
            // hammering the server.
            ("retry_after", c.retry_after),
            ("completion_patience", c.completion_patience),
        ] {
            if value.is_zero() {
                return Err(ConfigError::new(setting, "must be longer than zero"));
            }
        }
        if c.lock_timeout > c.expiry {
            return Err(ConfigError::new(
                "lock_timeout",
                format!(
                    "{:?} is longer than the expiry ({:?}): an unfinished claim would expire \
                     and run again",
                    c.lock_timeout, c.expiry
                ),
            ));
        }
        if !self.heartbeat_set {
            c.heartbeat_every = c.lock_timeout / 3;
        }
        if c.heartbeat_every.is_zero() || c.heartbeat_every >= c.lock_timeout {
            return Err(ConfigError::new(
                "heartbeat_every",
                format!(
                    "{:?} must be longer than zero and shorter than the lock timeout ({:?})",
                    c.heartbeat_every, c.lock_timeout
                ),
            ));
        }
        if let Some(status) = c
            .release_statuses
            .iter()
            .find(|s| !(s.is_client_error() || s.is_server_error()))
        {
            return Err(ConfigError::new(
                "release_statuses",
                format!("{status} is not an error status; releasing it would repeat its effect"),
            ));
        }
        Ok(IdempotencyLayer::from_parts(
            self.store,
            Arc::new(self.config),
        ))
    }
}

impl<S> Layer<S> for IdempotencyLayer {
    type Service = IdempotencyService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        IdempotencyService {
            inner,
            store: self.store.clone(),
            config: self.config.clone(),
            keeper: self.keeper.clone(),
        }
    }
}

/// The [`Service`] produced by [`IdempotencyLayer`].
///
/// Works with any inner service taking `http::Request<B>` and returning
/// `http::Response<R>` where both bodies carry [`Bytes`] and can be built
/// from `Bytes` (axum's `Body`, `http_body_util::Full<Bytes>`, ...).
///
/// # Cancellation
///
/// Once the request body is read, the rest (claim, handler, storing the
/// response) runs in the response future, but dropping that future (the
/// client went away) neither cancels the handler nor frees its key: the
/// unfinished rest is spawned onto the runtime and runs to its end. That
/// task does not carry the request's task-local values or tracing span
/// over. The handler makes progress only while its response future is
/// polled (or after it is dropped): a layer above that holds the future
/// without polling it holds the key in progress (`409`) for as long.
///
/// In PostgreSQL's transactional mode
#[cfg_attr(feature = "postgres", doc = "([`IdempotencyLayer::transactional`])")]
#[cfg_attr(
    not(feature = "postgres"),
    doc = "(`IdempotencyLayer::transactional`, feature `postgres`)"
)]
/// the request runs in the response
/// future itself: dropping it rolls the request's transaction back, so
/// nothing it wrote is committed, the key stays free, and a retry runs the
/// request once.
#[derive(Clone)]
pub struct IdempotencyService<S> {
    inner: S,
    store: Arc<dyn IdempotencyStore>,
    config: Arc<Config>,
    keeper: Arc<LeaseKeeper>,
}

impl<S: fmt::Debug> fmt::Debug for IdempotencyService<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyService")
            .field("inner", &self.inner)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// The key of a covered request, or why it has none.
enum KeyCheck {
    Key(String),
    Refused(String),
    /// No key and none required: pass through.
    Unprotected,
}

fn check_key<B>(req: &Request<B>, config: &Config) -> KeyCheck {
    let name = &config.header_name;
    let mut values = req.headers().get_all(name).iter();
    match (values.next(), values.next()) {
        (None, _) if !config.require_key => KeyCheck::Unprotected,
        (None, _) => KeyCheck::Refused(format!(
            "{} requests must carry an {name} header",
            req.method()
        )),
        (Some(_), Some(_)) => KeyCheck::Refused(format!("the {name} header must appear only once")),
        (Some(value), None) => match parse_key(value) {
            Ok(key) => KeyCheck::Key(key),
            Err(KeyError::Empty) => KeyCheck::Refused(format!("the {name} header is empty")),
            Err(KeyError::TooLong) => KeyCheck::Refused(format!(
                "the {name} header is longer than {MAX_KEY_LEN} characters"
            )),
            Err(KeyError::Invalid(why)) => {
                KeyCheck::Refused(format!("invalid {name} header: {why}"))
            }
        },
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for IdempotencyService<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqBody: Body<Data = Bytes> + From<Bytes> + Send + 'static,
    ReqBody::Error: Into<BoxError>,
    ResBody: Body<Data = Bytes> + From<Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Response<ResBody>, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        // Use the service that was driven to readiness; leave a fresh clone.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let config = self.config.clone();
        let store = self.store.clone();
        let keeper = self.keeper.clone();

        if !config.methods.contains(req.method()) {
            return Box::pin(inner.call(req));
        }
        let key = match check_key(&req, &config) {
            KeyCheck::Key(key) => key,
            KeyCheck::Unprotected => return Box::pin(inner.call(req)),
            KeyCheck::Refused(detail) => {
                return Box::pin(async move { Ok(problem(ProblemKind::BadKey, &detail, None)) })
            }
        };

        Box::pin(async move {
            let (parts, body) = req.into_parts();
            let body = pin!(body);
            let mut collecting = pin!(collect(body, config.max_request_body));
            // A body already there (one frame, the common case) is read
            // without a timer; only one still arriving is timed.
            let read = match poll_fn(|cx| Poll::Ready(collecting.as_mut().poll(cx))).await {
                Poll::Ready(read) => Ok(read),
                // A timer needs a tokio runtime: without one the request is
                // answered below, once its body is in.
                Poll::Pending if tokio::runtime::Handle::try_current().is_err() => {
                    Ok(collecting.await)
                }
                Poll::Pending => {
                    tokio::time::timeout(config.request_body_timeout, collecting).await
                }
            };
            let Ok(read) = read else {
                let detail = format!(
                    "the request body did not arrive within {:?}",
                    config.request_body_timeout
                );
                return Ok(problem(ProblemKind::RequestTimeout, &detail, None));
            };
            let body = match read {
                Ok(body) => body,
                Err(CollectError::TooLarge) => {
                    let detail = format!(
                        "request bodies of idempotent requests are limited to {} bytes",
                        config.max_request_body
                    );
                    return Ok(problem(ProblemKind::RequestTooLarge, &detail, None));
                }
                Err(err) => {
                    let detail = format!("failed to read the request body: {err}");
                    return Ok(problem(ProblemKind::BadBody, &detail, None));
                }
            };
            // The transactional mode needs no task of its own: everything
            // the handler does is in one transaction, so a client that goes
            // away (hyper drops this future) rolls it back: no effect, no
            // key, and the retry runs the request once. Running it here
            // saves a spawn and a hand-over between threads per request.
            // Boxed: held inline, its ~3 KB would make every request's
            // response future that large, in both modes.
            #[cfg(feature = "postgres")]
            if let Some(pg) = config.transactional.clone() {
                // (Boxed in the `let`: a named unboxed future would keep
                // its storage in this one until the end of the block.)
                let rest = Box::pin(crate::request::transactional::process(
                    inner, pg, config, parts, body, key,
                ));
                return rest.await;
            }
            // From here on nothing is cancelled by the client: the rest
            // runs here, in the response future, and if hyper drops that
            // future (the client went away) `Detach` hands the rest to a
            // task of its own, so the handler is never cancelled, its key
            // never freed, and its response is stored for the retry. The
            // common path pays no spawn and no hand-over between threads.
            let Ok(runtime) = tokio::runtime::Handle::try_current() else {
                return Ok(problem(
                    ProblemKind::Internal,
                    "the idempotency layer must run on a tokio runtime",
                    None,
                ));
            };
            // Built and boxed in one statement, for the same reason.
            let rest = Detach::new(
                process(
                    inner,
                    store,
                    keeper,
                    runtime.clone(),
                    config,
                    parts,
                    body,
                    key,
                ),
                runtime,
            );
            match rest.await {
                Some(result) => result,
                // Unreachable: a `Detach` is awaited once.
                None => Ok(problem(
                    ProblemKind::Internal,
                    "the request was already answered",
                    None,
                )),
            }
        })
    }
}
