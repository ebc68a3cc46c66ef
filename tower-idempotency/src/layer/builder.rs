//! The builder that gathers the layer's settings, and the error its
//! `build` reports. `build` itself, which checks the settings and makes
//! the layer from them, lives beside the layer (`layer/mod.rs`).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, Method, StatusCode};

use crate::request::config::Config;
use crate::request::scope::ScopeRule;
use crate::store::IdempotencyStore;

/// A setting of [`IdempotencyLayerBuilder`] that [`build`](IdempotencyLayerBuilder::build)
/// refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    setting: &'static str,
    reason: String,
}

impl ConfigError {
    pub(crate) fn new(setting: &'static str, reason: impl Into<String>) -> Self {
        Self {
            setting,
            reason: reason.into(),
        }
    }

    /// The name of the builder method whose value was refused.
    pub fn setting(&self) -> &'static str {
        self.setting
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid `{}`: {}", self.setting, self.reason)
    }
}

impl std::error::Error for ConfigError {}

/// Builds an [`IdempotencyLayer`](crate::IdempotencyLayer) with non-default
/// settings; see [`IdempotencyLayer::builder`](crate::IdempotencyLayer::builder).
/// Settings are checked by [`build`](Self::build).
///
/// ```
/// use std::time::Duration;
/// use http::HeaderName;
/// use tower_idempotency::{IdempotencyLayer, MemoryStore};
///
/// let layer = IdempotencyLayer::builder(MemoryStore::new())
///     .scope_with(|parts| {
///         parts.headers.get("x-tenant").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned()
///     })
///     .fingerprint_headers([HeaderName::from_static("x-currency")])
///     .lock_timeout(Duration::from_secs(10))
///     .expiry(Duration::from_secs(48 * 3600))
///     .build()?;
/// # let _ = layer;
/// # Ok::<(), tower_idempotency::ConfigError>(())
/// ```
#[must_use = "call build() to get the layer"]
pub struct IdempotencyLayerBuilder {
    pub(crate) store: Arc<dyn IdempotencyStore>,
    pub(crate) config: Config,
    pub(crate) heartbeat_set: bool,
}

impl fmt::Debug for IdempotencyLayerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyLayerBuilder")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl IdempotencyLayerBuilder {
    pub(crate) fn new(store: Arc<dyn IdempotencyStore>) -> Self {
        Self {
            store,
            config: Config::default(),
            heartbeat_set: false,
        }
    }

    #[cfg(feature = "postgres")]
    pub(crate) fn transactional(mut self, store: crate::PostgresStore) -> Self {
        self.config.transactional = Some(store);
        self
    }

    /// Methods the layer applies to (default `POST`, `PATCH`); requests with
    /// other methods pass through untouched.
    pub fn methods(mut self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.config.methods = methods.into_iter().collect();
        self
    }

    /// Name of the key header (default `Idempotency-Key`).
    pub fn header_name(mut self, name: HeaderName) -> Self {
        self.config.header_name = name;
        self
    }

    /// Whether a request with a covered method and no key is rejected with
    /// 400 (`true`), or passes through without protection (`false`, the
    /// default): putting the layer on a live API must not break the
    /// clients that send no key yet. Require it for the operations whose
    /// documentation says a key is required, as the IETF draft puts it
    /// (a layer of its own on those routes).
    pub fn require_key(mut self, require: bool) -> Self {
        self.config.require_key = require;
        self
    }

    /// Request headers that are part of the fingerprint, in addition to method,
    /// path and query, and body (default none).
    pub fn fingerprint_headers(mut self, names: impl IntoIterator<Item = HeaderName>) -> Self {
        self.config.fingerprint_headers = names.into_iter().collect();
        self
    }

    /// Response headers stored and replayed (default `content-type`). Their
    /// values are stored and replayed byte for byte, text or not (a UTF-8
    /// file name in `Content-Disposition`, a UTF-8 `Location`), by every
    /// store.
    pub fn stored_headers(mut self, names: impl IntoIterator<Item = HeaderName>) -> Self {
        self.config.stored_headers = names.into_iter().collect();
        self
    }

    /// Derives the caller identity that keys are scoped to, instead of the
    /// default (a SHA-256 digest of the `Authorization` header; requests
    /// without one share one anonymous scope). Two callers with different
    /// scopes never see each other's keys, responses or 422s. Derive it from
    /// authenticated data (a tenant id, the principal an auth layer put in
    /// the extensions), not from a header the client may choose freely.
    ///
    /// The returned string may have any length: the store only sees its
    /// digest, which never collides with the default scopes.
    pub fn scope_with<F>(mut self, scope: F) -> Self
    where
        F: Fn(&http::request::Parts) -> String + Send + Sync + 'static,
    {
        self.config.scope = ScopeRule::Custom(Arc::new(scope));
        self
    }

    /// An in-progress claim whose lease was not extended for this long is
    /// considered abandoned (its server died) and a retry with the same
    /// fingerprint takes it over (default 5 s). A live handler extends its
    /// lease every [`heartbeat_every`](Self::heartbeat_every), so this bounds
    /// how long a crashed server's keys answer 409, not how long a handler
    /// may run. Must be non-zero and at most [`expiry`](Self::expiry);
    /// `Duration::MAX` means "never taken over".
    pub fn lock_timeout(mut self, timeout: Duration) -> Self {
        self.config.lock_timeout = timeout;
        self
    }

    /// How often a running handler's lease is extended (default a third of
    /// the lock timeout). Must be non-zero and shorter than the lock timeout.
    pub fn heartbeat_every(mut self, every: Duration) -> Self {
        self.config.heartbeat_every = every;
        self.heartbeat_set = true;
        self
    }

    /// How long a key is remembered (default 24 h, as Stripe). It must exceed
    /// the client's whole retry horizon (its overall deadline), or a late
    /// retry would run the handler a second time. Must be non-zero;
    /// `Duration::MAX` means "as long as the store lives" (stores cap it at
    /// 100 years).
    pub fn expiry(mut self, window: Duration) -> Self {
        self.config.expiry = window;
        self
    }

    /// Value of `Retry-After` on `409 Conflict` and `503` (default 1 s,
    /// rounded up to whole seconds). Must be non-zero: `Retry-After: 0`
    /// would invite clients to hammer the server.
    pub fn retry_after(mut self, after: Duration) -> Self {
        self.config.retry_after = after;
        self
    }

    /// Largest request body buffered for fingerprinting (default 1 MiB);
    /// larger bodies get `413 Content Too Large` and claim nothing.
    pub fn max_request_body_bytes(mut self, limit: usize) -> Self {
        self.config.max_request_body = limit;
        self
    }

    /// Largest response body stored (default 1 MiB). A larger response
    /// cannot be replayed: the key is completed with a marker and every
    /// caller, the first included, gets `410` problem+json
    /// (`response_not_retained`); the handler is never run again for it. Size
    /// this limit above any response your handlers produce.
    pub fn max_response_body_bytes(mut self, limit: usize) -> Self {
        self.config.max_response_body = limit;
        self
    }

    /// Handler statuses that free the key instead of being stored, so that a
    /// retry runs the handler again (default `400`, `415`, `422`: request
    /// validation that ran before any effect, as Stripe). `401` and `403`
    /// always free it, whatever this list: an unauthenticated answer is
    /// never stored. Every other status is stored and replayed, 5xx and
    /// 429 included. Add 5xx or 429 here only
    /// if your handlers guarantee they answered them before any effect.
    /// Only 4xx and 5xx statuses may be listed.
    pub fn release_statuses(mut self, statuses: impl IntoIterator<Item = StatusCode>) -> Self {
        self.config.release_statuses = statuses.into_iter().collect();
        self
    }

    /// How long the layer keeps trying a failing store to keep a finished
    /// handler's response (default 10 minutes), with a growing pause of up
    /// to 1 s. Meanwhile the key's lease is kept alive, so no retry takes
    /// it over: a store that is gone for seconds or minutes (a database
    /// failover) gets the response as soon as it is back, and retries get
    /// the replay. A permanent store error is not tried again. Past it the
    /// layer answers the `410` marker and tries to store that with the same
    /// patience; if that fails too it keeps trying, in a task of its own
    /// with the lease kept alive, for as long as the process lives, so the
    /// `410`'s "never runs again" holds while the server does.
    /// `Duration::MAX` means "as long as the process lives" for the
    /// response itself. Must be non-zero (a patience shorter than the
    /// first pause, 20 ms, makes one attempt and no retry).
    pub fn completion_patience(mut self, patience: Duration) -> Self {
        self.config.completion_patience = patience;
        self
    }

    /// How long a keyed request's body may take to arrive in full (default
    /// 30 s); a slower one gets `408 Request Timeout` and claims nothing,
    /// so a client trickling its body cannot hold the connection (and a
    /// store connection in the transactional mode) for long.
    pub fn request_body_timeout(mut self, timeout: Duration) -> Self {
        self.config.request_body_timeout = timeout;
        self
    }
}
