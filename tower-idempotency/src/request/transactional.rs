//! PostgreSQL's transactional mode: the claim, the handler's own writes and
//! the stored response commit in one transaction.
//!
//! The claim row is inserted in a transaction that stays open while the
//! handler runs; the handler writes through the same transaction (the
//! [`IdempotencyTransaction`] in its request extensions); the layer then
//! stores the response in it and commits. One commit, one WAL flush, and
//! nothing can separate an effect from its stored response. A concurrent
//! duplicate waits on the claim row's lock and, once the first commits, gets
//! the replay. A request that fails in any way before the commit (panic,
//! error, release status, a response too large to keep) rolls everything
//! back: no effect, no key, and a retry may run again.
//!
//! Choose it only when every effect of the handler is a write to this
//! database; a handler with effects elsewhere (a payment processor) needs
//! the two-phase mode and its recovery points.

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use http::request::Parts;
use http::{Request, Response};
use http_body::Body;
use sqlx::{Postgres, Transaction};
use tokio::sync::{Mutex, OwnedMappedMutexGuard, OwnedMutexGuard};
use tower_service::Service;

use crate::postgres::PostgresStore;
use crate::request::answer::{answer_without_running, store_error_answer};
use crate::request::body::collect_catching;
use crate::request::config::Config;
use crate::request::context::{BoxError, IdempotencyContext};
use crate::request::inline::{catch_unwind, Panicked};
use crate::request::keeper::Kept;
use crate::request::key::fingerprint;
use crate::request::problem::{problem, ProblemKind};
use crate::request::replay::{retry_after_value, to_stored};
use crate::store::StoreError;

/// A locked [`IdempotencyTransaction`]: dereferences to the sqlx
/// `Transaction`, so statements run on `&mut **guard`.
pub type TransactionGuard =
    OwnedMappedMutexGuard<Option<Transaction<'static, Postgres>>, Transaction<'static, Postgres>>;

/// The transaction a request runs in, in the transactional mode (see
/// [`IdempotencyLayer::transactional`](crate::IdempotencyLayer::transactional)).
///
/// Found in the request extensions (axum: `Extension<IdempotencyTransaction>`).
/// Write the handler's effects through it; the layer commits them together
/// with the claim and the stored response, or rolls everything back.
///
/// ```no_run
/// # async fn handler(tx: tower_idempotency::IdempotencyTransaction) -> Result<(), Box<dyn std::error::Error>> {
/// let mut conn = tx.lock().await?;
/// sqlx::query("INSERT INTO payments (account, amount) VALUES ('a', 1)")
///     .execute(&mut **conn)
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct IdempotencyTransaction {
    tx: Arc<Mutex<Option<Transaction<'static, Postgres>>>>,
}

impl fmt::Debug for IdempotencyTransaction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyTransaction")
            .finish_non_exhaustive()
    }
}

impl IdempotencyTransaction {
    /// Locks the transaction for the handler's statements: execute them on
    /// `&mut **guard`. Do not commit or roll back: the layer does.
    ///
    /// # Errors
    ///
    /// When the request is already finished (the handle was kept after the
    /// handler returned).
    pub fn lock(
        &self,
    ) -> impl std::future::Future<Output = Result<TransactionGuard, StoreError>> + Send + 'static
    {
        // An owned guard, not one borrowing `self`: a borrowed guard held
        // across `.await` trips rustc's higher-ranked `Send` check in axum
        // handlers.
        let tx = self.tx.clone();
        async move {
            OwnedMutexGuard::try_map(tx.lock_owned().await, Option::as_mut)
                .map_err(|_| StoreError::msg("the request's transaction is already finished"))
        }
    }

    async fn take(&self) -> Option<Transaction<'static, Postgres>> {
        self.tx.lock().await.take()
    }
}

/// Runs a keyed request in one transaction (the transactional counterpart
/// of `run::process`). Called in the response future, not in a task: if
/// the future is dropped (the client went away), the transaction is dropped
/// with it and rolled back, so nothing of the request is committed.
pub(crate) async fn process<S, ReqBody, ResBody>(
    mut inner: S,
    pg: PostgresStore,
    config: Arc<Config>,
    mut parts: Parts,
    body: Bytes,
    key: String,
) -> Result<Response<ResBody>, S::Error>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqBody: From<Bytes> + Send + 'static,
    ResBody: Body<Data = Bytes> + From<Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    let fingerprint = fingerprint(&parts, &config.fingerprint_headers, &body);
    let scope = config.scope.stored_scope(&parts);
    crate::request::scope::announce(&mut parts.extensions, &scope);
    // A duplicate waits on the claim row's lock (held by the first
    // request's open transaction) for at most this long, then answers 409:
    // duplicates of one slow key cannot hold the pool's connections for the
    // slow request's whole duration.
    let lock_wait = duplicate_wait(&config);
    let begin: std::borrow::Cow<'static, str> = if lock_wait == DEFAULT_DUPLICATE_WAIT {
        std::borrow::Cow::Borrowed(DEFAULT_BEGIN)
    } else {
        std::borrow::Cow::Owned(format!(
            "BEGIN; SET LOCAL lock_timeout = '{}ms'",
            lock_wait.as_millis().max(1)
        ))
    };
    let mut tx = match pg.begin_with(begin).await {
        Ok(tx) => tx,
        Err(err) => return Ok(store_error_answer(err, &config)),
    };
    let request = config.claim(&scope, &key, fingerprint);
    let claimed = pg
        .claim_on(&mut tx, request, crate::store::LeaseToken::new_random())
        .await;
    let (claimed, mark) = match claimed {
        Ok((outcome, mark)) => (Ok(outcome), mark),
        Err(err) => (Err(err), false),
    };
    let (lease, epoch) = match answer_without_running(claimed, &config) {
        Ok(claimed) => claimed,
        Err(answer) => {
            rollback(tx).await;
            // After the rollback, on a connection of its own: a mark made
            // in the transaction would vanish with it, and a two-phase
            // owner's dead lease would never be taken over.
            if mark {
                if let Err(err) = pg.mark_stale(None, request).await {
                    tracing::warn!(error = %err, key, "marking a stale idempotency lease failed");
                }
            }
            return Ok(answer);
        }
    };
    let handle = IdempotencyTransaction {
        tx: Arc::new(Mutex::new(Some(tx))),
    };
    parts.extensions.insert(handle.clone());
    // The layer completes and commits: a handler's own completion is refused.
    let mut kept = Kept::new(scope.clone(), key.clone(), lease).with_epoch(epoch);
    kept.layer_commits = true;
    parts
        .extensions
        .insert(IdempotencyContext::from_kept(Arc::new(kept)));
    // Run in this future, not in a task of its own: there is no lease to
    // keep alive beside it, and a panic is caught here as well as by a task.
    let outcome =
        catch_unwind(|| inner.call(Request::from_parts(parts, ReqBody::from(body)))).await;
    let Some(tx) = handle.take().await else {
        // Only this function takes the transaction out.
        return Ok(problem(
            ProblemKind::Internal,
            "the request's transaction disappeared",
            None,
        ));
    };
    let response = match outcome {
        Ok(Ok(response)) => response,
        Ok(Err(err)) => {
            rollback(tx).await;
            return Err(err);
        }
        Err(Panicked) => {
            rollback(tx).await;
            return Ok(problem(
                ProblemKind::Internal,
                "the handler panicked; its transaction was rolled back, nothing was committed",
                None,
            ));
        }
    };
    if config.frees_key(response.status()) {
        rollback(tx).await;
        return Ok(response);
    }
    let (parts, body) = response.into_parts();
    // The body is the handler's code: a stream that panics is answered like
    // a handler that panics.
    let body = match collect_catching(body, config.max_response_body).await {
        Ok(Ok(body)) => body,
        Ok(Err(err)) => {
            rollback(tx).await;
            let detail = format!(
                "the response could not be kept ({err}; the limit is {} bytes); the transaction \
                 was rolled back, nothing was committed",
                config.max_response_body
            );
            return Ok(problem(ProblemKind::Internal, &detail, None));
        }
        Err(Panicked) => {
            rollback(tx).await;
            return Ok(problem(
                ProblemKind::Internal,
                "the handler's response body panicked; its transaction was rolled back, nothing \
                 was committed",
                None,
            ));
        }
    };
    let stored = to_stored(&parts, &config.stored_headers, body.clone());
    match pg
        .complete_and_commit(tx, &scope, &key, lease, &stored)
        .await
    {
        Ok(true) => {}
        // Only through the handler's own statements on the claim row,
        // which the transaction holds: nothing was committed.
        Ok(false) => {
            return Ok(problem(
                ProblemKind::Internal,
                "the request's claim changed inside its transaction; the transaction was rolled \
                 back, nothing was committed",
                None,
            ))
        }
        Err(err) => {
            // Committed or not, the outcome is consistent: a retry gets the
            // stored response, or runs a request that left no trace.
            tracing::error!(error = %err, key, "committing an idempotent request failed");
            return Ok(problem(
                ProblemKind::StoreUnavailable,
                "the commit failed: a retry gets the stored response if it committed, or runs \
                 the request again if it did not",
                Some(retry_after_value(config.retry_after)),
            ));
        }
    }
    Ok(Response::from_parts(parts, ResBody::from(body)))
}

/// How long a duplicate waits on a running request's claim row by default.
const DEFAULT_DUPLICATE_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// The transaction's start with that wait.
const DEFAULT_BEGIN: &str = "BEGIN; SET LOCAL lock_timeout = '1000ms'";

/// The longest a duplicate waits on the claim row: the layer's lock timeout,
/// at most 1 s.
fn duplicate_wait(config: &Config) -> std::time::Duration {
    config.lock_timeout.min(DEFAULT_DUPLICATE_WAIT)
}

async fn rollback(tx: Transaction<'static, Postgres>) {
    if let Err(err) = tx.rollback().await {
        // The connection is gone: PostgreSQL rolls back by itself.
        tracing::warn!(error = %err, "rolling back an idempotent request failed");
    }
}
