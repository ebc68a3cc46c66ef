//! The tower [`IdempotencyLayer`] and its [`IdempotencyService`].

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::request::Parts;
use http::{header, HeaderName, HeaderValue, Method, Request, Response, StatusCode};
use http_body::Body;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use tower_layer::Layer;
use tower_service::Service;

use crate::key::{fingerprint, parse_key, KeyError, MAX_KEY_LEN};
use crate::problem::{problem, ProblemKind};
use crate::store::{ClaimOutcome, ClaimRequest, IdempotencyStore, LeaseToken, StoredResponse};

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type ScopeFn = Arc<dyn Fn(&Parts) -> String + Send + Sync>;

/// Name of the header added to replayed responses (`idempotent-replayed: true`).
pub const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

/// Default name of the key header (`idempotency-key`).
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// What the layer tells the handler about the key it is running under.
///
/// Inserted into the request extensions of every request that claimed a key
/// (axum: `Extension<IdempotencyContext>`). A handler that writes to
/// PostgreSQL can pass it to `PostgresStore::complete_in_tx` to store the
/// response in the same transaction as its own effects.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IdempotencyContext {
    scope: String,
    key: String,
    lease: LeaseToken,
}

impl IdempotencyContext {
    /// Creates a context (the layer does this; useful in tests).
    pub fn new(scope: impl Into<String>, key: impl Into<String>, lease: LeaseToken) -> Self {
        Self {
            scope: scope.into(),
            key: key.into(),
            lease,
        }
    }

    /// The caller scope the key belongs to.
    pub fn scope(&self) -> &str {
        &self.scope
    }

    /// The idempotency key (unquoted).
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The lease proving this request owns the claim.
    pub fn lease(&self) -> LeaseToken {
        self.lease
    }
}

#[derive(Clone)]
struct Config {
    methods: Vec<Method>,
    header_name: HeaderName,
    require_key: bool,
    fingerprint_headers: Vec<HeaderName>,
    stored_headers: Vec<HeaderName>,
    scope: ScopeFn,
    lock_timeout: Duration,
    expiry: Duration,
    retry_after: Duration,
    max_request_body: usize,
    max_response_body: usize,
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("methods", &self.methods)
            .field("header_name", &self.header_name)
            .field("require_key", &self.require_key)
            .field("fingerprint_headers", &self.fingerprint_headers)
            .field("stored_headers", &self.stored_headers)
            .field("scope", &"<fn>")
            .field("lock_timeout", &self.lock_timeout)
            .field("expiry", &self.expiry)
            .field("retry_after", &self.retry_after)
            .field("max_request_body", &self.max_request_body)
            .field("max_response_body", &self.max_response_body)
            .finish()
    }
}

/// A tower [`Layer`] that makes `POST`/`PATCH` handlers idempotent with the
/// `Idempotency-Key` header.
///
/// Defaults: methods `POST` and `PATCH`; header `Idempotency-Key`, required on
/// those methods; fingerprint over method, path and query and body; stored
/// response headers `content-type`; empty scope; lock timeout 30 s; expiry
/// 24 h; `Retry-After: 1` on 409; request and response bodies up to 1 MiB.
///
/// ```
/// use std::time::Duration;
/// use http::HeaderName;
/// use tower_idempotency::{IdempotencyLayer, MemoryStore};
///
/// let layer = IdempotencyLayer::new(MemoryStore::new())
///     .scope_with(|parts| {
///         parts.headers.get("x-tenant").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned()
///     })
///     .fingerprint_headers([HeaderName::from_static("x-tenant")])
///     .lock_timeout(Duration::from_secs(60))
///     .expiry(Duration::from_secs(48 * 3600));
/// # let _ = layer;
/// ```
#[derive(Clone)]
pub struct IdempotencyLayer {
    store: Arc<dyn IdempotencyStore>,
    config: Arc<Config>,
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
        Self::from_arc(Arc::new(store))
    }

    /// A layer using an already shared store.
    pub fn from_arc(store: Arc<dyn IdempotencyStore>) -> Self {
        Self {
            store,
            config: Arc::new(Config {
                methods: vec![Method::POST, Method::PATCH],
                header_name: IDEMPOTENCY_KEY,
                require_key: true,
                fingerprint_headers: Vec::new(),
                stored_headers: vec![header::CONTENT_TYPE],
                scope: Arc::new(|_| String::new()),
                lock_timeout: Duration::from_secs(30),
                expiry: Duration::from_secs(24 * 60 * 60),
                retry_after: Duration::from_secs(1),
                max_request_body: 1024 * 1024,
                max_response_body: 1024 * 1024,
            }),
        }
    }

    fn config_mut(&mut self) -> &mut Config {
        Arc::make_mut(&mut self.config)
    }

    /// The store this layer uses.
    pub fn store(&self) -> &Arc<dyn IdempotencyStore> {
        &self.store
    }

    /// Methods the layer applies to (default `POST`, `PATCH`); requests with
    /// other methods pass through untouched.
    pub fn methods(mut self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.config_mut().methods = methods.into_iter().collect();
        self
    }

    /// Name of the key header (default `Idempotency-Key`).
    pub fn header_name(mut self, name: HeaderName) -> Self {
        self.config_mut().header_name = name;
        self
    }

    /// Whether a request with a covered method and no key is rejected with 400
    /// (default `true`); with `false` it passes through without protection.
    pub fn require_key(mut self, require: bool) -> Self {
        self.config_mut().require_key = require;
        self
    }

    /// Request headers that are part of the fingerprint, in addition to method,
    /// path and query, and body (default none).
    pub fn fingerprint_headers(mut self, names: impl IntoIterator<Item = HeaderName>) -> Self {
        self.config_mut().fingerprint_headers = names.into_iter().collect();
        self
    }

    /// Response headers stored and replayed (default `content-type`). Header
    /// values that are not valid text are not stored.
    pub fn stored_headers(mut self, names: impl IntoIterator<Item = HeaderName>) -> Self {
        self.config_mut().stored_headers = names.into_iter().collect();
        self
    }

    /// How to derive the caller identity that keys are scoped to (default: one
    /// empty scope for everybody). Two callers with different scopes never see
    /// each other's keys, so one tenant can never replay another's response.
    /// Derive it from authenticated data (an API key id, a verified token
    /// subject), not from a header the client may choose freely.
    pub fn scope_with<F>(mut self, scope: F) -> Self
    where
        F: Fn(&Parts) -> String + Send + Sync + 'static,
    {
        self.config_mut().scope = Arc::new(scope);
        self
    }

    /// After this long, an in-progress claim is considered abandoned (its
    /// server died) and a retry with the same fingerprint takes it over
    /// (default 30 s). Must exceed the slowest legitimate handler run.
    pub fn lock_timeout(mut self, timeout: Duration) -> Self {
        self.config_mut().lock_timeout = timeout;
        self
    }

    /// How long a key is remembered (default 24 h, as Stripe). It must exceed
    /// the client's whole retry horizon (its overall deadline), or a late
    /// retry would run the handler a second time.
    pub fn expiry(mut self, window: Duration) -> Self {
        self.config_mut().expiry = window;
        self
    }

    /// Value of `Retry-After` on `409 Conflict` (default 1 s, rounded up to
    /// whole seconds).
    pub fn retry_after(mut self, after: Duration) -> Self {
        self.config_mut().retry_after = after;
        self
    }

    /// Largest request body buffered for fingerprinting (default 1 MiB);
    /// larger bodies get `413 Content Too Large`.
    pub fn max_request_body_bytes(mut self, limit: usize) -> Self {
        self.config_mut().max_request_body = limit;
        self
    }

    /// Largest response body stored (default 1 MiB). A larger response is
    /// not returned: the client gets `500` (problem+json) and the key is
    /// released, so **the handler's effects may happen again on retry** —
    /// size this limit above any response your handlers produce.
    pub fn max_response_body_bytes(mut self, limit: usize) -> Self {
        self.config_mut().max_response_body = limit;
        self
    }
}

impl<S> Layer<S> for IdempotencyLayer {
    type Service = IdempotencyService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        IdempotencyService {
            inner,
            store: self.store.clone(),
            config: self.config.clone(),
        }
    }
}

/// The [`Service`] produced by [`IdempotencyLayer`].
///
/// Works with any inner service taking `http::Request<B>` and returning
/// `http::Response<R>` where both bodies carry [`Bytes`] and can be built
/// from `Bytes` (axum's `Body`, `http_body_util::Full<Bytes>`, ...).
#[derive(Clone)]
pub struct IdempotencyService<S> {
    inner: S,
    store: Arc<dyn IdempotencyStore>,
    config: Arc<Config>,
}

impl<S: fmt::Debug> fmt::Debug for IdempotencyService<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyService")
            .field("inner", &self.inner)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// Releases a claim if dropped while armed: the handler panicked, the inner
/// service failed, or the request future was dropped (client went away).
struct ReleaseGuard {
    armed: Option<(Arc<dyn IdempotencyStore>, String, String, LeaseToken)>,
}

impl ReleaseGuard {
    fn disarm(&mut self) {
        self.armed = None;
    }

    async fn release_now(mut self) {
        if let Some((store, scope, key, lease)) = self.armed.take() {
            if let Err(err) = store.release(&scope, &key, lease).await {
                tracing::warn!(error = %err, key, "releasing idempotency key failed");
            }
        }
    }
}

impl Drop for ReleaseGuard {
    fn drop(&mut self) {
        let Some((store, scope, key, lease)) = self.armed.take() else {
            return;
        };
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn(async move {
                    if let Err(err) = store.release(&scope, &key, lease).await {
                        tracing::warn!(error = %err, key, "releasing abandoned idempotency key failed");
                    }
                });
            }
            Err(_) => tracing::warn!(
                key,
                "no tokio runtime to release an abandoned idempotency key; it frees after the lock timeout"
            ),
        }
    }
}

fn is_transient(status: StatusCode) -> bool {
    status.is_server_error() || status == StatusCode::TOO_MANY_REQUESTS
}

fn retry_after_value(d: Duration) -> HeaderValue {
    let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    HeaderValue::from(secs)
}

fn replay<B: From<Bytes>>(stored: StoredResponse) -> Response<B> {
    let Ok(status) = StatusCode::from_u16(stored.status) else {
        return problem(
            ProblemKind::Internal,
            "the stored response has an invalid status code",
            None,
        );
    };
    let mut response = Response::new(B::from(stored.body));
    *response.status_mut() = status;
    for (name, value) in stored.headers {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(&value),
        ) {
            response.headers_mut().append(name, value);
        }
    }
    response
        .headers_mut()
        .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    response
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

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

        if !config.methods.contains(req.method()) {
            return Box::pin(inner.call(req));
        }
        let mut values = req.headers().get_all(&config.header_name).iter();
        let key = match (values.next(), values.next()) {
            (None, _) if !config.require_key => return Box::pin(inner.call(req)),
            (None, _) => Err(format!(
                "{} requests must carry an {} header",
                req.method(),
                config.header_name
            )),
            (Some(_), Some(_)) => Err(format!(
                "the {} header must appear only once",
                config.header_name
            )),
            (Some(value), None) => parse_key(value).map_err(|e| match e {
                KeyError::Empty => format!("the {} header is empty", config.header_name),
                KeyError::TooLong => format!(
                    "the {} header is longer than {MAX_KEY_LEN} characters",
                    config.header_name
                ),
                KeyError::Invalid(why) => format!("invalid {} header: {why}", config.header_name),
            }),
        };

        Box::pin(async move {
            // Everything after the request body is read runs in a task the
            // connection does not own: once a handler has started, a client
            // that disconnects (hyper drops this future) neither cancels it
            // nor releases its key; the response is stored for the retry.
            let key = match key {
                Ok(key) => key,
                Err(detail) => return Ok(problem(ProblemKind::BadKey, &detail, None)),
            };
            let (parts, body) = req.into_parts();
            let body = match Limited::new(body, config.max_request_body).collect().await {
                Ok(collected) => collected.to_bytes(),
                Err(err) if err.is::<LengthLimitError>() => {
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
            let task = tokio::spawn(process(inner, store, config, parts, body, key));
            match task.await {
                Ok(result) => result,
                // A panic in the handler: re-raise it, as an unspawned
                // handler would have.
                Err(err) if err.is_panic() => std::panic::resume_unwind(err.into_panic()),
                // The runtime is shutting down and cancelled the task.
                Err(_) => Ok(problem(
                    ProblemKind::Internal,
                    "the server is shutting down",
                    None,
                )),
            }
        })
    }
}

async fn process<S, ReqBody, ResBody>(
    mut inner: S,
    store: Arc<dyn IdempotencyStore>,
    config: Arc<Config>,
    parts: Parts,
    body: Bytes,
    key: String,
) -> Result<Response<ResBody>, S::Error>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ReqBody: From<Bytes>,
    ResBody: Body<Data = Bytes> + From<Bytes>,
    ResBody::Error: Into<BoxError>,
{
    {
        {
            let fingerprint = fingerprint(&parts, &config.fingerprint_headers, &body);
            let scope = (config.scope)(&parts);
            let claim = store
                .claim(ClaimRequest {
                    scope: &scope,
                    key: &key,
                    fingerprint,
                    lock_timeout: config.lock_timeout,
                    ttl: config.expiry,
                })
                .await;
            let retry_after = retry_after_value(config.retry_after);
            let lease = match claim {
                Err(err) => {
                    tracing::error!(error = %err, "idempotency store unavailable");
                    return Ok(problem(
                        ProblemKind::StoreUnavailable,
                        "the idempotency store is unavailable; retry later",
                        Some(retry_after),
                    ));
                }
                Ok(ClaimOutcome::Completed {
                    response,
                    fingerprint_matches: true,
                }) => return Ok(replay(response)),
                Ok(ClaimOutcome::InProgress {
                    fingerprint_matches: true,
                }) => {
                    return Ok(problem(
                        ProblemKind::InProgress,
                        "a request with this idempotency key is still being processed",
                        Some(retry_after),
                    ));
                }
                Ok(ClaimOutcome::Completed { .. } | ClaimOutcome::InProgress { .. }) => {
                    return Ok(problem(
                        ProblemKind::KeyReused,
                        "this idempotency key was already used with a different request",
                        None,
                    ));
                }
                Ok(ClaimOutcome::Claimed(lease)) => lease,
            };

            let mut guard = ReleaseGuard {
                armed: Some((store.clone(), scope.clone(), key.clone(), lease)),
            };
            let mut parts = parts;
            parts
                .extensions
                .insert(IdempotencyContext::new(scope.clone(), key.clone(), lease));
            let response = match inner
                .call(Request::from_parts(parts, ReqBody::from(body)))
                .await
            {
                Ok(response) => response,
                Err(err) => {
                    guard.release_now().await;
                    return Err(err);
                }
            };
            if is_transient(response.status()) {
                guard.release_now().await;
                return Ok(response);
            }
            let (parts, body) = response.into_parts();
            let body = match Limited::new(body, config.max_response_body).collect().await {
                Ok(collected) => collected.to_bytes(),
                Err(err) => {
                    guard.release_now().await;
                    let detail = if err.is::<LengthLimitError>() {
                        format!(
                            "the response is larger than the {} bytes that can be stored for replay",
                            config.max_response_body
                        )
                    } else {
                        format!("failed to read the response body: {err}")
                    };
                    tracing::error!(key, detail, "idempotent response not stored");
                    return Ok(problem(ProblemKind::ResponseNotStored, &detail, None));
                }
            };
            let headers = config
                .stored_headers
                .iter()
                .flat_map(|name| {
                    parts.headers.get_all(name).iter().filter_map(move |v| {
                        v.to_str()
                            .ok()
                            .map(|v| (name.as_str().to_owned(), v.to_owned()))
                    })
                })
                .collect();
            let stored = StoredResponse {
                status: parts.status.as_u16(),
                headers,
                body: body.clone(),
            };
            match store.complete(&scope, &key, lease, &stored).await {
                Ok(true) => {}
                Ok(false) => tracing::debug!(
                    key,
                    "idempotency key already completed by the handler or taken over"
                ),
                Err(err) => tracing::warn!(error = %err, key, "storing idempotent response failed"),
            }
            guard.disarm();
            Ok(Response::from_parts(parts, ResBody::from(body)))
        }
    }
}
