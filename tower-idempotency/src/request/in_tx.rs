//! A handler's own transaction completing its key: the two
//! [`PostgresStore`] calls that take the [`IdempotencyContext`] the layer
//! hands the handler. Here, with the request path, not in the store's
//! folder: the store knows nothing of the layer's context, and these two
//! calls only read it and note what the handler did.

use sqlx::{Postgres, Transaction};

use crate::postgres::PostgresStore;
use crate::request::context::IdempotencyContext;
use crate::store::{StoreError, StoredResponse};

impl PostgresStore {
    /// Completes the key described by `ctx` inside the caller's transaction.
    ///
    /// Use this from a handler that writes its own effects (say, a payment
    /// row) in `tx`: the effect and the stored response then commit or roll
    /// back together, so a crash can never leave an effect without a
    /// replayable response. After the handler returns, the layer asks the
    /// store once more (it cannot know whether `tx` committed), finds the
    /// key completed and does not store the response again;
    /// [`commit_completed`](Self::commit_completed) commits and spares that
    /// call. Returns `Ok(false)` if the lease is no longer current (the
    /// claim was taken over after the lock timeout); the handler should then
    /// roll back.
    ///
    /// # Errors
    ///
    /// In the transactional mode, where the layer completes the key and
    /// commits itself; or when the store fails.
    ///
    /// ```no_run
    /// # async fn demo(store: tower_idempotency::PostgresStore, ctx: tower_idempotency::IdempotencyContext) -> Result<(), Box<dyn std::error::Error>> {
    /// use tower_idempotency::StoredResponse;
    /// let mut tx = store.pool().begin().await?;
    /// sqlx::query("INSERT INTO payments (account, amount) VALUES ('a', 1)").execute(&mut *tx).await?;
    /// let response = StoredResponse::json(201, r#"{"ok":true}"#);
    /// if store.complete_in_tx(&mut tx, &ctx, &response).await? {
    ///     tx.commit().await?;
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn complete_in_tx(
        &self,
        tx: &mut Transaction<'_, Postgres>,
        ctx: &IdempotencyContext,
        response: &StoredResponse,
    ) -> Result<bool, StoreError> {
        ctx.completable_by_handler()?;
        let completed = self
            .complete_on(tx, ctx.scope(), ctx.key(), ctx.lease(), response)
            .await?;
        if completed {
            ctx.note_completed();
        }
        Ok(completed)
    }

    /// Completes the key described by `ctx` in the caller's transaction and
    /// commits it: [`complete_in_tx`](Self::complete_in_tx), then the
    /// commit, in one call. Told that the key is committed, the layer then
    /// makes no call of its own to store the response (after
    /// `complete_in_tx` and a commit of the handler's own, it must ask the
    /// store, since it cannot know whether that transaction committed): one
    /// statement and one pooled connection fewer per request, two commits
    /// in all (the claim's and this one).
    ///
    /// Returns `Ok(false)`, having rolled the transaction back, if the lease
    /// is no longer current (the claim was taken over after the lock
    /// timeout): write anything else before this call.
    ///
    /// `tx` is a transaction of the pool (`pool().begin()`), never a
    /// savepoint inside another one, whose commit would commit nothing yet:
    /// the type says so (`'static`). The store's own `complete` is not
    /// called for this request, so a wrapper counting completions sees
    /// none. Not for the transactional mode
    /// ([`IdempotencyLayer::transactional`](crate::IdempotencyLayer::transactional)),
    /// where the layer commits: there it is an error, as `complete_in_tx`
    /// is.
    ///
    /// # Errors
    ///
    /// In the transactional mode; when the store fails, or the commit
    /// (then the layer stores the response itself if the key is still in
    /// progress).
    ///
    /// ```no_run
    /// # async fn demo(store: tower_idempotency::PostgresStore, ctx: tower_idempotency::IdempotencyContext) -> Result<(), Box<dyn std::error::Error>> {
    /// use tower_idempotency::StoredResponse;
    /// let mut tx = store.pool().begin().await?;
    /// sqlx::query("INSERT INTO payments (account, amount) VALUES ('a', 1)").execute(&mut *tx).await?;
    /// let response = StoredResponse::json(201, r#"{"ok":true}"#);
    /// if !store.commit_completed(tx, &ctx, &response).await? {
    ///     // Taken over: nothing of this request was committed.
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn commit_completed(
        &self,
        tx: Transaction<'static, Postgres>,
        ctx: &IdempotencyContext,
        response: &StoredResponse,
    ) -> Result<bool, StoreError> {
        ctx.completable_by_handler()?;
        let (scope, key, lease) = (ctx.scope(), ctx.key(), ctx.lease());
        let done = self
            .complete_and_commit(tx, scope, key, lease, response)
            .await;
        // Committed, or failed maybe at the commit: as after a commit of
        // the handler's own that failed, the layer stores the response
        // itself if the key is still in progress.
        if !matches!(done, Ok(false)) {
            ctx.note_completed();
        }
        if done? {
            ctx.note_committed();
            return Ok(true);
        }
        Ok(false)
    }
}
