//! A key this request owns, until it is settled: its response stored
//! (trying a failing store again for the layer's `completion_patience`),
//! the key freed, or the "response not retained" marker left in its place;
//! and, when the lease turned out lost, the answer the store holds instead.
//!
//! Below `run/mod.rs`, which makes a [`Claim`] once the key is won.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Response;
use tokio::runtime::Handle;

use crate::memory::KeptResponse;
use crate::request::answer::answer_without_running;
use crate::request::config::Config;
use crate::request::keeper::{Kept, LeaseKeeper};
use crate::request::problem::{problem, ProblemKind};
use crate::request::replay::{marker, retry_after_value};
use crate::store::{IdempotencyStore, StoreError, StoredResponse};

/// Pause before the second attempt; doubled for each further one, up to
/// [`COMPLETE_BACKOFF_CAP`].
const COMPLETE_BACKOFF: Duration = Duration::from_millis(20);
/// The longest pause between two attempts.
const COMPLETE_BACKOFF_CAP: Duration = Duration::from_secs(1);

/// `409` with `Retry-After`: the key's answer belongs to another run; the
/// retry reads it from the store.
fn lost_answer<B: From<Bytes>>(config: &Config) -> Response<B> {
    problem(
        ProblemKind::InProgress,
        "another request with this idempotency key holds its outcome; retry to get it",
        Some(retry_after_value(config.retry_after)),
    )
}

/// A response to store, made when a store takes it: as a
/// [`StoredResponse`] for any store, or as the layer's `MemoryStore`
/// keeps it (by default the same, made by [`stored`](Self::stored)).
pub(super) trait Answer {
    /// The response, as the store trait takes it.
    fn stored(&self) -> StoredResponse;

    /// The response, as a `MemoryStore` keeps it.
    fn kept(&self) -> KeptResponse {
        KeptResponse::Stored(self.stored())
    }
}

impl<F: Fn() -> StoredResponse> Answer for F {
    fn stored(&self) -> StoredResponse {
        self()
    }
}

/// A key this request owns.
pub(super) struct Claim {
    pub(super) store: Arc<dyn IdempotencyStore>,
    pub(super) kept: Arc<Kept>,
    /// The layer's settings (its `completion_patience`).
    pub(super) config: Arc<Config>,
    /// Keeps the lease alive while the request runs, and afterwards while
    /// a marker that the store would not take is tried again.
    pub(super) keeper: Arc<LeaseKeeper>,
}

/// A store's failure to keep a response: whether trying again may help.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Retryable(bool);

/// How an attempt to keep a response ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Settled {
    /// Kept (by the layer, or by the handler in its own transaction).
    Stored,
    /// The lease is no longer ours: another request took the key over.
    Lost,
}

impl Claim {
    /// Stores the response `answer` makes, retrying a failing store with
    /// a growing pause for up to the layer's `completion_patience`: long
    /// enough to outlast a database failover (the lease is kept
    /// alive meanwhile). The first attempt hands it over (a memory store
    /// makes it only if the lease is still ours, as it keeps it); the
    /// retries, rare, store a copy made again. `None` if the store kept
    /// failing.
    pub(super) async fn complete(&self, answer: impl Answer) -> Option<Settled> {
        if self.kept.committed_by_handler() {
            // The handler's own transaction stored and committed it.
            return Some(Settled::Stored);
        }
        match self.try_complete_owned(&answer).await {
            Ok(done) => Some(done),
            // A permanent error: trying again cannot help.
            Err(Retryable(false)) => None,
            // Retries (with their timer) live in a box: held inline, they
            // would make every request's future larger.
            Err(Retryable(true)) => Box::pin(self.complete_retrying(&answer.stored())).await,
        }
    }

    /// The answer of an owner whose lease was lost: what the store holds
    /// for the key (the replay of the run that took it over, `409` while
    /// that run is in progress), never its own response as if it had won.
    /// Boxed: a rare path.
    pub(super) fn answer_lost<'a, B: From<Bytes> + Send + 'a>(
        &'a self,
    ) -> Pin<Box<dyn Future<Output = Response<B>> + Send + 'a>> {
        Box::pin(async move {
            let (kept, config) = (&self.kept, &*self.config);
            tracing::error!(
                key = kept.key,
                "idempotency lease lost while the handler ran (taken over after it was stale); \
                 answering with what the store holds"
            );
            let found = (*self.store)
                .lookup(&kept.scope, &kept.key, kept.fingerprint)
                .await;
            match found {
                Ok(Some(outcome)) => match answer_without_running(Ok(outcome), config) {
                    Err(answer) => answer,
                    // `lookup` never claims.
                    Ok(_) => lost_answer(config),
                },
                Ok(None) | Err(_) => lost_answer(config),
            }
        })
    }

    /// The first attempt to store a handler's response, handing it over;
    /// `Err` if the store failed.
    async fn try_complete_owned(&self, answer: &impl Answer) -> Result<Settled, Retryable> {
        let kept = &self.kept;
        let stored = match &self.config.memory {
            // Directly, as the claim (see `run::process`).
            Some(memory) => Ok(memory.0.complete_now(
                kept.memory_hash,
                &kept.scope,
                &kept.key,
                kept.lease,
                || answer.kept(),
            )),
            // Through the `dyn` (see `run::process`).
            None => {
                (*self.store)
                    .complete_owned(&kept.scope, &kept.key, kept.lease, answer.stored())
                    .await
            }
        };
        self.completed(stored, 1)
    }

    /// Attempts `attempt` to store `response`; `Err` if the store failed.
    async fn try_complete(
        &self,
        response: &StoredResponse,
        attempt: u32,
    ) -> Result<Settled, Retryable> {
        let kept = &self.kept;
        // Through the `dyn` (see `run::process`).
        let stored = (*self.store)
            .complete(&kept.scope, &kept.key, kept.lease, response)
            .await;
        self.completed(stored, attempt)
    }

    /// What a store's answer to attempt `attempt` means; `Err` if the
    /// store failed, saying whether trying again may help.
    fn completed(
        &self,
        stored: Result<bool, StoreError>,
        attempt: u32,
    ) -> Result<Settled, Retryable> {
        let kept = &self.kept;
        match stored {
            Ok(true) => Ok(Settled::Stored),
            // The handler stored its response in its own transaction.
            Ok(false) if kept.completed_in_tx() => Ok(Settled::Stored),
            Ok(false) => Ok(Settled::Lost),
            Err(err) => {
                tracing::warn!(error = %err, key = kept.key, attempt, "storing an idempotent response failed");
                Err(Retryable(err.is_transient()))
            }
        }
    }

    /// The attempts after a failed first one, with a growing pause, for
    /// up to the layer's `completion_patience`.
    async fn complete_retrying(&self, response: &StoredResponse) -> Option<Settled> {
        self.patiently(|attempt| self.try_complete(response, attempt))
            .await
            .ok()
    }

    /// Attempts 2, 3, … of `attempt`, with a growing pause, for up to the
    /// layer's `completion_patience`: `Err(Retryable(true))` when the
    /// patience ran out, `Err(Retryable(false))` on a permanent error.
    async fn patiently<T, F>(&self, mut attempt: impl FnMut(u32) -> F) -> Result<T, Retryable>
    where
        F: Future<Output = Result<T, Retryable>>,
    {
        // `None`: a patience past what an `Instant` holds, never give up.
        let give_up = tokio::time::Instant::now().checked_add(self.config.completion_patience);
        let mut pause = COMPLETE_BACKOFF;
        let mut number = 1;
        while give_up.is_none_or(|at| tokio::time::Instant::now() + pause <= at) {
            tokio::time::sleep(pause).await;
            pause = pause.saturating_mul(2).min(COMPLETE_BACKOFF_CAP);
            number += 1;
            match attempt(number).await {
                Err(Retryable(true)) => {}
                done => return done,
            }
        }
        Err(Retryable(true))
    }

    /// Completes the key with the "response not retained" marker and
    /// returns it. If even that fails for the layer's patience, the marker
    /// is tried again in a task of its own, with the lease kept alive, for
    /// as long as the process lives: the caller is told the handler never
    /// runs again for this key, and a takeover would make that false.
    ///
    /// Boxed: a rare path, whose future would otherwise be held inline by
    /// every request's.
    pub(super) fn leave_marker<'a>(
        &'a self,
        detail: &'a str,
    ) -> Pin<Box<dyn Future<Output = StoredResponse> + Send + 'a>> {
        Box::pin(async move {
            tracing::error!(
                key = self.kept.key,
                detail,
                "idempotent response not retained"
            );
            let marker = marker(detail);
            if self.complete(|| marker.clone()).await.is_none() {
                tracing::error!(
                    key = self.kept.key,
                    "storing the not-retained marker failed; trying again, with the lease kept, \
                     until it is stored"
                );
                let (store, kept) = (self.store.clone(), self.kept.clone());
                let keeping = self.keeper.keep(kept.clone(), &Handle::current());
                let stored = marker.clone();
                drop(tokio::spawn(async move {
                    keep_trying(&*store, &kept, &stored).await;
                    drop(keeping);
                }));
            }
            marker
        })
    }

    /// Frees the key: the handler did no work. A store that fails is tried
    /// again as for a completion (a growing pause, for the layer's
    /// `completion_patience`, the lease kept alive), then in a task of its
    /// own every second for as long as the process lives: a key left in
    /// progress would refuse the corrected request (`422`). Should the
    /// process die first, the key's lease goes stale, and the corrected
    /// request takes it over in the takeover's two steps.
    pub(super) async fn release(&self) {
        if self.try_release(1).await != Err(Retryable(true)) {
            return;
        }
        // Boxed: a rare path, whose timer would otherwise be held inline
        // by every request's future.
        let retried = Box::pin(self.patiently(|attempt| self.try_release(attempt))).await;
        if retried != Err(Retryable(true)) {
            return;
        }
        tracing::error!(
            key = self.kept.key,
            "releasing an idempotency key kept failing; trying again in the background until \
             the store frees it"
        );
        let (store, kept) = (self.store.clone(), self.kept.clone());
        drop(tokio::spawn(async move {
            loop {
                tokio::time::sleep(COMPLETE_BACKOFF_CAP).await;
                match (*store).release(&kept.scope, &kept.key, kept.lease).await {
                    Err(err) if err.is_transient() => {}
                    Err(err) => {
                        tracing::error!(error = %err, key = kept.key, "the store refused to free an idempotency key; a corrected request takes it over once its lease is stale");
                        return;
                    }
                    // Freed, or no longer ours (taken over): done.
                    Ok(_) => return,
                }
            }
        }));
    }

    /// Attempt `attempt` to free the key; `Ok` when it is free or no
    /// longer ours.
    async fn try_release(&self, attempt: u32) -> Result<(), Retryable> {
        let kept = &self.kept;
        match (*self.store)
            .release(&kept.scope, &kept.key, kept.lease)
            .await
        {
            Ok(_) => Ok(()),
            Err(err) => {
                tracing::warn!(error = %err, key = kept.key, attempt, "releasing an idempotency key failed");
                Err(Retryable(err.is_transient()))
            }
        }
    }
}

/// Stores `marker` for `kept`'s key, trying a failing store again every
/// [`COMPLETE_BACKOFF_CAP`] until it is stored, the lease turns out lost,
/// or the store refuses it for good. The caller keeps the lease alive
/// meanwhile.
async fn keep_trying(store: &dyn IdempotencyStore, kept: &Kept, marker: &StoredResponse) {
    loop {
        tokio::time::sleep(COMPLETE_BACKOFF_CAP).await;
        match store
            .complete(&kept.scope, &kept.key, kept.lease, marker)
            .await
        {
            Ok(_) => return,
            Err(err) if !err.is_transient() => {
                tracing::error!(error = %err, key = kept.key, "the store refused the not-retained marker");
                return;
            }
            Err(_) => {}
        }
    }
}
