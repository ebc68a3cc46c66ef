//! Every setting of the layer, as the request path reads them
//! ([`Config`]). The builder that gathers them stands above, with the
//! layer (`layer/builder.rs`).

use std::fmt;
use std::time::Duration;

use http::{header, HeaderName, Method, StatusCode};

use crate::memory::MemoryStore;
use crate::request::context::IDEMPOTENCY_KEY;
use crate::request::scope::ScopeRule;
use crate::store::{ClaimRequest, Fingerprint, IdempotencyStore};

/// Default lock timeout: short, because live handlers extend their lease.
pub(crate) const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(5);

/// Default of [`IdempotencyLayerBuilder::completion_patience`].
pub(crate) const DEFAULT_COMPLETION_PATIENCE: Duration = Duration::from_secs(600);

/// Default of [`IdempotencyLayerBuilder::request_body_timeout`].
pub(crate) const DEFAULT_REQUEST_BODY_TIMEOUT: Duration = Duration::from_secs(30);

/// The validated settings shared by a layer and its services.
#[derive(Clone, Debug)]
pub(crate) struct Config {
    pub(crate) methods: Vec<Method>,
    pub(crate) header_name: HeaderName,
    pub(crate) require_key: bool,
    pub(crate) fingerprint_headers: Vec<HeaderName>,
    pub(crate) stored_headers: Vec<HeaderName>,
    pub(crate) scope: ScopeRule,
    pub(crate) lock_timeout: Duration,
    pub(crate) heartbeat_every: Duration,
    pub(crate) expiry: Duration,
    pub(crate) retry_after: Duration,
    pub(crate) max_request_body: usize,
    pub(crate) max_response_body: usize,
    pub(crate) release_statuses: Vec<StatusCode>,
    /// How long a failing store is tried again to keep a response.
    pub(crate) completion_patience: Duration,
    /// How long the request body may take to arrive.
    pub(crate) request_body_timeout: Duration,
    /// PostgreSQL's transactional mode: claim, handler writes and response
    /// in one transaction.
    #[cfg(feature = "postgres")]
    pub(crate) transactional: Option<crate::PostgresStore>,
    /// The layer's store when it is a [`MemoryStore`] (the same one, shared):
    /// claimed and completed by direct calls, without the store trait's two
    /// boxed futures per request (see [`Config::memory_of`]).
    pub(crate) memory: Option<Direct>,
}

/// A [`MemoryStore`] the layer calls directly; printed as its name only
/// (the layer's `Debug` would otherwise print every record).
#[derive(Clone)]
pub(crate) struct Direct(pub(crate) MemoryStore);

impl fmt::Debug for Direct {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("MemoryStore")
    }
}

impl Config {
    /// Whether a handler's answer with `status` frees its key instead of
    /// being stored: the release statuses, and always 401 and 403. An
    /// unauthenticated or forbidden answer ran nothing a retry could
    /// repeat; stored, it would keep a record per made-up credential (the
    /// scope is the `Authorization` digest), and a flood of them could fill
    /// the store against every genuine caller.
    pub(crate) fn frees_key(&self, status: StatusCode) -> bool {
        status == StatusCode::UNAUTHORIZED
            || status == StatusCode::FORBIDDEN
            || self.release_statuses.contains(&status)
    }

    /// The claim of `key` under `scope`, with this layer's lock timeout and
    /// expiry.
    pub(crate) fn claim<'a>(
        &self,
        scope: &'a str,
        key: &'a str,
        fingerprint: Fingerprint,
    ) -> ClaimRequest<'a> {
        ClaimRequest {
            scope,
            key,
            fingerprint,
            lock_timeout: self.lock_timeout,
            ttl: self.expiry,
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Self {
            methods: vec![Method::POST, Method::PATCH],
            header_name: IDEMPOTENCY_KEY,
            require_key: false,
            fingerprint_headers: Vec::new(),
            stored_headers: vec![header::CONTENT_TYPE],
            scope: ScopeRule::Authorization,
            lock_timeout: DEFAULT_LOCK_TIMEOUT,
            heartbeat_every: DEFAULT_LOCK_TIMEOUT / 3,
            expiry: Duration::from_secs(24 * 60 * 60),
            retry_after: Duration::from_secs(1),
            max_request_body: 1024 * 1024,
            max_response_body: 1024 * 1024,
            release_statuses: vec![
                StatusCode::BAD_REQUEST,
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                StatusCode::UNPROCESSABLE_ENTITY,
            ],
            completion_patience: DEFAULT_COMPLETION_PATIENCE,
            request_body_timeout: DEFAULT_REQUEST_BODY_TIMEOUT,
            #[cfg(feature = "postgres")]
            transactional: None,
            memory: None,
        }
    }
}

impl Config {
    /// `store`, if it is a [`MemoryStore`]: one whose calls answer without
    /// waiting, which the layer then makes directly. Only a store passed by
    /// its type is recognized (`IdempotencyLayer::new`, `builder`); one
    /// behind an `Arc<dyn IdempotencyStore>`, or wrapped, goes through the
    /// trait as before.
    pub(crate) fn memory_of<T: IdempotencyStore>(store: &T) -> Option<Direct> {
        (store as &dyn std::any::Any)
            .downcast_ref::<MemoryStore>()
            .map(|memory| Direct(memory.clone()))
    }
}
