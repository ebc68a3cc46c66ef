//! The types every part of the layer shares: the names of its headers, the
//! [`IdempotencyContext`] a handler finds in its request, and the error
//! type of bodies. At the bottom of the request path: it imports only the
//! store and the keeper's record of a claim, and the layer, the two modes
//! and the completions in a handler's transaction (`in_tx.rs`) import it.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use http::HeaderName;

use crate::request::keeper::Kept;
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

    /// The same context with the claim's fencing `epoch` (the layer does
    /// this; useful in tests).
    pub fn with_epoch(self, epoch: u64) -> Self {
        let Kept {
            scope, key, lease, ..
        } = &*self.kept;
        let kept = Kept::new(scope.clone(), key.clone(), *lease).with_epoch(epoch);
        Self::from_kept(Arc::new(kept))
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

    /// The claim's fencing epoch: greater than that of every earlier claim
    /// of this key (see [`next_epoch`](crate::next_epoch)). Hand it to the
    /// system your effect lands in, so that it refuses an owner whose key
    /// was taken over: keep the highest epoch seen per key and refuse a
    /// lower one (`UPDATE … WHERE epoch < $1`, a conditional write).
    pub fn epoch(&self) -> u64 {
        self.kept.epoch
    }

    /// Whether this request surely still owns its key: no other request
    /// can take it over before this turns `false`. Call it right before an
    /// effect outside the store (a charge at a payment processor) and skip
    /// the effect when it says `false` (answer `503`: the retry gets the
    /// answer of whichever run holds the key).
    ///
    /// The lease is surely held for one lock timeout after the sending of
    /// the last claim or heartbeat the store accepted; a takeover needs the
    /// lease seen stale (a lock timeout without a heartbeat, by the store's
    /// clock) and then a lock timeout more. So this turns `false` at least
    /// a lock timeout before any other replica may take the key over, even
    /// when only this replica is cut off from the store. It turns `true`
    /// again if a heartbeat gets through before anyone took the key over.
    ///
    /// What it cannot cover: an effect already under way when this
    /// replica lost the store, which finishes more than a lock timeout
    /// later. For that, pass [`epoch`](Self::epoch) (or a key derived from
    /// this one) to the effect's system. It assumes the replica's and the
    /// store's clocks run at the same rate (drift far below a lock
    /// timeout). Always `true` in PostgreSQL's transactional mode, whose
    /// open transaction holds the key's row.
    pub fn still_held(&self) -> bool {
        self.kept.still_held()
    }

    /// Resolves once [`still_held`](Self::still_held) turns `false`: a
    /// lock timeout after the last accepted heartbeat was sent, or at once
    /// when the store says the key was taken over. Race it against a long
    /// effect to stop before the key can change hands:
    ///
    /// ```
    /// # async fn handler(ctx: tower_idempotency::IdempotencyContext) -> u16 {
    /// # let charge = async { 201 };
    /// tokio::select! {
    ///     status = charge => status,
    ///     () = ctx.lost() => 503, // stopped before anyone could take over
    /// }
    /// # }
    /// ```
    ///
    /// Never resolves in PostgreSQL's transactional mode.
    pub async fn lost(&self) {
        self.kept.lost().await
    }

    /// Notes that the handler completed its key itself (in its own
    /// transaction), so that the layer, finding the key completed, answers
    /// with the handler's response instead of treating the lease as lost.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))] // only the transactional mode calls it
    pub(crate) fn note_completed(&self) {
        self.kept.note_completed_in_tx();
    }

    /// Refuses a context whose key the layer itself completes and commits
    /// (the transactional mode): a handler completing it in a transaction
    /// of its own would wait on the row the layer's transaction holds, or
    /// not see it at all.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))] // only `complete_in_tx` calls it
    pub(crate) fn completable_by_handler(&self) -> Result<(), crate::StoreError> {
        if self.kept.layer_commits {
            return Err(crate::StoreError::msg(
                "in the transactional mode the layer stores the response and commits: write \
                 through the request's IdempotencyTransaction, and do not complete the key",
            ));
        }
        Ok(())
    }

    /// Notes that the handler's transaction that completed its key
    /// committed, so that the layer stores nothing.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))] // only `commit_completed` calls it
    pub(crate) fn note_committed(&self) {
        self.kept.note_committed_by_handler();
    }
}

impl fmt::Debug for IdempotencyContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyContext")
            .field("scope", &self.scope())
            .field("key", &self.key())
            .field("lease", &self.lease())
            .field("epoch", &self.epoch())
            .finish()
    }
}

impl PartialEq for IdempotencyContext {
    fn eq(&self, other: &Self) -> bool {
        self.scope() == other.scope() && self.key() == other.key() && self.lease() == other.lease()
    }
}

impl Eq for IdempotencyContext {}
