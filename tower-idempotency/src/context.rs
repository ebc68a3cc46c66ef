//! The types every part of the layer shares: the names of its headers, the
//! [`IdempotencyContext`] a handler finds in its request, and the error
//! type of bodies. At the bottom of the crate's modules: it imports only
//! the store and the keeper's record of a claim, and the layer, the two
//! modes and the PostgreSQL store import it.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use http::HeaderName;

use crate::keeper::Kept;
use crate::store::LeaseToken;

pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

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
#[derive(Clone)]
pub struct IdempotencyContext {
    /// Shared with the layer's own record of the claim: handing the context
    /// to the handler copies no string.
    kept: Arc<Kept>,
}

impl IdempotencyContext {
    /// Creates a context (the layer does this; useful in tests).
    pub fn new(scope: impl Into<String>, key: impl Into<String>, lease: LeaseToken) -> Self {
        Self::from_kept(Arc::new(Kept::new(
            Cow::Owned(scope.into()),
            key.into(),
            lease,
        )))
    }

    pub(crate) fn from_kept(kept: Arc<Kept>) -> Self {
        Self { kept }
    }

    /// The scope the key is stored under (a digest of the caller identity,
    /// see [`IdempotencyLayer::stored_scope`](crate::IdempotencyLayer::stored_scope)).
    pub fn scope(&self) -> &str {
        &self.kept.scope
    }

    /// The idempotency key (unquoted).
    pub fn key(&self) -> &str {
        &self.kept.key
    }

    /// The lease proving this request owns the claim.
    pub fn lease(&self) -> LeaseToken {
        self.kept.lease
    }

    /// Notes that the handler completed its key itself (in its own
    /// transaction), so that the layer, finding the key completed, answers
    /// with the handler's response instead of treating the lease as lost.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))] // only the transactional mode calls it
    pub(crate) fn note_completed(&self) {
        self.kept.note_completed_in_tx();
    }
}

impl fmt::Debug for IdempotencyContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyContext")
            .field("scope", &self.scope())
            .field("key", &self.key())
            .field("lease", &self.lease())
            .finish()
    }
}

impl PartialEq for IdempotencyContext {
    fn eq(&self, other: &Self) -> bool {
        self.scope() == other.scope() && self.key() == other.key() && self.lease() == other.lease()
    }
}

impl Eq for IdempotencyContext {}
