//! The inbound half of deadline propagation: a tower layer that reads the
//! time its caller still waits and lends it to every call the handler
//! makes.
//!
//! ```
//! use std::convert::Infallible;
//! use std::time::Duration;
//! use reqwest_safe_retry::deadline::{InheritDeadlineLayer, InheritedDeadline};
//! use tower::{Layer, Service, ServiceExt};
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().start_paused(true).build().unwrap().block_on(async {
//! let handler = tower::service_fn(|_: http::Request<String>| async {
//!     // Every call made here with this crate's client, or with `retry`,
//!     // ends by the time the caller stops waiting.
//!     let left = InheritedDeadline::current().and_then(|d| d.time_left());
//!     Ok::<_, Infallible>(http::Response::new(format!("{left:?}")))
//! });
//! let mut service = InheritDeadlineLayer::new().layer(handler);
//!
//! let request = |ms: &str| {
//!     http::Request::builder().header("request-timeout-ms", ms).body(String::new()).unwrap()
//! };
//! let response = service.ready().await.unwrap().call(request("800")).await.unwrap();
//! assert_eq!(response.into_body(), format!("{:?}", Some(Duration::from_millis(800))));
//!
//! // The caller has stopped waiting: answered at once, the handler not run.
//! let response = service.ready().await.unwrap().call(request("0")).await.unwrap();
//! assert_eq!(response.status(), 504);
//! assert_eq!(response.headers()["stripe-should-retry"], "false");
//! # });
//! ```
//!
//! With axum: `Router::new().route(..).layer(InheritDeadlineLayer::new())`.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use http::header::HeaderName;
use idempotency_key::CallerScope;
use pin_project_lite::pin_project;
use tokio::task::futures::TaskLocalFuture;
use tokio::time::Instant;
use tower_layer::Layer;
use tower_service::Service;

use crate::engine::InheritedDeadline;
use crate::signals::retried_by_a_keyed_client;
use crate::vocabulary::IdempotencyKey;

use super::deadline_header::{time_left_in, DEFAULT_DEADLINE_HEADER};
use super::give_up::{do_not_retry, DEFAULT_VERDICT_HEADER};

/// Reads the caller's time left from each request and runs the inner
/// service inside an [`InheritedDeadline`] scope.
///
/// What the layer does with each request:
///
/// - It reads `Request-Timeout-Ms` (whole milliseconds; another name with
///   [`InheritDeadlineLayer::header`]) and runs the inner service inside an
///   [`InheritedDeadline`] scope ending that long after the request
///   arrived. A malformed value (not only ASCII digits) is ignored, as if
///   absent; with several values the smallest counts.
/// - A request whose time is already spent (`0`) is not run: the layer
///   answers `504 Gateway Timeout` with `Stripe-Should-Retry: false` and an
///   empty body at once.
/// - When a call made inside the scope gave up after retrying (or was
///   refused its retries) and the handler answers with something this
///   crate's client would retry — 408, 425, 429, 500, 502, 503, 504, a 409
///   (retried when the request carried a key, which the layer cannot
///   see), a 413 with a readable `Retry-After`, or any 4xx or 5xx whose
///   verdict header says `true` — the layer sets `Stripe-Should-Retry:
///   false`, replacing an upstream's `true` handed on with the answer: the
///   handler's calls were the one retry layer ([`crate::deadline::GiveUp`] says
///   why), and an upstream's "retry" is not this service's to give.
/// - When the request carries an `Idempotency-Key` (another name with
///   [`InheritDeadlineLayer::key_header`]; none with
///   [`InheritDeadlineLayer::no_derived_keys`]), the keyed calls the
///   handler makes with this crate's client carry keys derived from it and
///   from its caller ([`InheritedDeadline::serving_key`]): the scope a
///   server's idempotency layer gave the request (`tower-idempotency`'s
///   `IdempotencyLayer`, inside or outside this layer: it sets the
///   [`idempotency_key::CallerScope`] this layer puts in the request's
///   extensions, or puts one there), else the request's `Authorization`:
///   a handler run twice for one request (a retry, a takeover by another
///   replica) sends the same keys downstream, so a downstream service that
///   honours keys runs each effect once. A malformed key derives nothing.
///
/// The layer does not cut a handler short when the time runs out: the
/// handler's calls stop by themselves, and hyper drops a handler whose
/// caller hangs up.
#[derive(Debug, Clone)]
#[must_use]
pub struct InheritDeadlineLayer {
    header: HeaderName,
    verdict: Option<HeaderName>,
    key_header: Option<HeaderName>,
}

impl InheritDeadlineLayer {
    /// Reads `Request-Timeout-Ms` and answers with `Stripe-Should-Retry`.
    pub fn new() -> Self {
        InheritDeadlineLayer {
            header: HeaderName::from_static(DEFAULT_DEADLINE_HEADER),
            verdict: Some(HeaderName::from_static(DEFAULT_VERDICT_HEADER)),
            key_header: Some(HeaderName::from_static("idempotency-key")),
        }
    }

    /// Derive the handler's calls' keys from this request header (match
    /// the server's key header).
    pub fn key_header(mut self, name: HeaderName) -> Self {
        self.key_header = Some(name);
        self
    }

    /// Never derive the handler's calls' keys from the request's: each
    /// keyed call gets a fresh key, as outside a handler.
    pub fn no_derived_keys(mut self) -> Self {
        self.key_header = None;
        self
    }

    /// Read the time left from this header (match the callers'
    /// `RetryPolicyBuilder::deadline_header`).
    pub fn header(mut self, name: HeaderName) -> Self {
        self.header = name;
        self
    }

    /// Give the "do not retry" verdict in this header (match the callers'
    /// `RetryPolicyBuilder::server_verdict_header`).
    pub fn verdict_header(mut self, name: HeaderName) -> Self {
        self.verdict = Some(name);
        self
    }

    /// Never add a verdict (a spent request is still answered 504).
    pub fn no_verdict(mut self) -> Self {
        self.verdict = None;
        self
    }
}

impl InheritDeadlineLayer {
    /// The request's own key, read as the server reads it (bare or as a
    /// structured-field string); `None` when absent, repeated or malformed.
    fn incoming_key(&self, headers: &http::HeaderMap) -> Option<IdempotencyKey> {
        let mut values = headers.get_all(self.key_header.as_ref()?).iter();
        let first = values.next()?;
        if values.next().is_some() {
            return None;
        }
        IdempotencyKey::from_header(first).ok()
    }
}

impl Default for InheritDeadlineLayer {
    fn default() -> Self {
        InheritDeadlineLayer::new()
    }
}

impl<S> Layer<S> for InheritDeadlineLayer {
    type Service = InheritDeadline<S>;

    fn layer(&self, inner: S) -> Self::Service {
        InheritDeadline {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service [`InheritDeadlineLayer`] makes.
#[derive(Debug, Clone)]
pub struct InheritDeadline<S> {
    inner: S,
    layer: InheritDeadlineLayer,
}

impl<S, ReqBody, ResBody> Service<http::Request<ReqBody>> for InheritDeadline<S>
where
    S: Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
    ResBody: Default,
{
    type Response = http::Response<ResBody>;
    type Error = S::Error;
    type Future = InheritDeadlineFuture<S::Future, ResBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<ReqBody>) -> Self::Future {
        let left = time_left_in(request.headers(), &self.layer.header);
        // A limit too far to represent is no limit.
        let at = left.and_then(|left| Instant::now().checked_add(left));
        let mut scope = InheritedDeadline::within_current(at);
        if let Some(key) = self.layer.incoming_key(request.headers()) {
            // The caller as a server's idempotency layer scopes it: set
            // already by one outside this layer, or later by one inside.
            let served = match request.extensions().get::<CallerScope>() {
                Some(served) => served.clone(),
                None => {
                    let served = CallerScope::new();
                    request.extensions_mut().insert(served.clone());
                    served
                }
            };
            let caller = request
                .headers()
                .get(http::header::AUTHORIZATION)
                .map_or(&b""[..], |v| v.as_bytes());
            scope = scope.serving_key_for(served, caller, key.as_str());
        }
        let verdict = self.layer.verdict.clone();
        if left == Some(Duration::ZERO) || scope.time_left() == Some(Duration::ZERO) {
            let mut response = http::Response::new(ResBody::default());
            *response.status_mut() = http::StatusCode::GATEWAY_TIMEOUT;
            if let Some(name) = &verdict {
                do_not_retry(response.headers_mut(), name);
            }
            return InheritDeadlineFuture {
                state: State::Spent {
                    response: Some(response),
                },
            };
        }
        // `call` itself may do the handler's first work: in the scope too.
        let inner = &mut self.inner;
        let future = scope.clone().sync_scope(|| inner.call(request));
        InheritDeadlineFuture {
            state: State::Running {
                future: scope.clone().scope_named(future),
                scope,
                verdict,
            },
        }
    }
}

pin_project! {
    /// The response future of [`InheritDeadline`].
    pub struct InheritDeadlineFuture<F, B> {
        #[pin]
        state: State<F, B>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, B> {
        // The caller's time was spent: this answer, once.
        Spent { response: Option<http::Response<B>> },
        Running {
            #[pin]
            future: TaskLocalFuture<InheritedDeadline, F>,
            scope: InheritedDeadline,
            verdict: Option<HeaderName>,
        },
    }
}

impl<F, B> fmt::Debug for InheritDeadlineFuture<F, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Spent { .. } => "spent",
            State::Running { .. } => "running",
        };
        f.debug_struct("InheritDeadlineFuture")
            .field("state", &state)
            .finish_non_exhaustive()
    }
}

impl<F, B, E> Future for InheritDeadlineFuture<F, B>
where
    F: Future<Output = Result<http::Response<B>, E>>,
{
    type Output = Result<http::Response<B>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            // Polled again after it completed, it never completes again
            // (rather than panic).
            StateProj::Spent { response } => match response.take() {
                Some(response) => Poll::Ready(Ok(response)),
                None => Poll::Pending,
            },
            StateProj::Running {
                future,
                scope,
                verdict,
            } => {
                let mut response = ready!(future.poll(cx))?;
                if let Some(name) = verdict {
                    // An upstream's "retry" handed on is overwritten, not
                    // kept: this hop already retried.
                    if scope.gave_up().is_some()
                        && retried_by_a_keyed_client(response.status(), response.headers(), name)
                    {
                        do_not_retry(response.headers_mut(), name);
                    }
                }
                Poll::Ready(Ok(response))
            }
        }
    }
}
