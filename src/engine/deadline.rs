//! Deadlines: the time a caller still waits, carried from the
//! request a service is serving to every call it makes on its behalf.
//!
//! ```
//! use std::time::Duration;
//! use reqwest_safe_retry::RetryPolicy;
//! use reqwest_safe_retry::deadline::InheritedDeadline;
//! use reqwest_safe_retry::retry::{retry, Outcome};
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().start_paused(true).build().unwrap().block_on(async {
//! let policy = RetryPolicy::default(); // its own deadline: 30 s
//! // What `InheritDeadlineLayer` does around a handler whose caller sent
//! // `Request-Timeout-Ms: 800`:
//! let inherited = InheritedDeadline::after(Duration::from_millis(800));
//! let (left, _report) = inherited
//!     .scope(async {
//!         retry(&policy, |ctx| async move { Outcome::success(ctx.time_left()) }).await
//!     })
//!     .await;
//! assert_eq!(left, Some(Duration::from_millis(800)), "min(30 s, 800 ms)");
//! # });
//! ```
//!
//! The deadline arithmetic lives here: a call's [`Limits`], the shorter of
//! two limits, and the time a caller still waits, inherited inside a
//! service from the request it is serving.

use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::time::Instant;

use idempotency_key::CallerScope;

use crate::vocabulary::{
    derivation_seed, lock, scoped_derivation_seed, Partition, RetryReport, SharedKey, StopReason,
};

tokio::task_local! {
    static INHERITED: InheritedDeadline;
}

/// What the calls made while serving one request inherit from it: the time
/// its caller still waits, and a note of any call that gave up.
///
/// # How it travels
///
/// **Between services**, as a duration: every attempt carries the time left
/// before the call's deadline, in whole milliseconds, in the
/// `Request-Timeout-Ms` header ([`crate::deadline::DEFAULT_DEADLINE_HEADER`]; another name
/// with `RetryPolicyBuilder::deadline_header`, none with
/// `RetryPolicyBuilder::no_deadline_header`). A duration and not an
/// instant, as gRPC's `grpc-timeout` and userver do, so that clock skew
/// between two machines cannot expire a request early or keep it alive
/// late; the price is that the network's transit time is not subtracted.
///
/// **Inside a service**, in a tokio task-local: the inbound layer
/// ([`crate::deadline::InheritDeadlineLayer`]) reads the header and runs the handler's
/// future inside an [`InheritedDeadline`] scope; every call that this crate
/// makes within it — through the middleware or through [`crate::retry::retry`] —
/// gets `deadline = min(its own, the inherited time left)`, and so every
/// attempt timeout is bounded by it too. No plumbing through the
/// application: a task-local rather than the request's extensions, because
/// the handler builds its outgoing requests itself and the extensions of
/// the incoming one never reach them.
///
/// A call that starts with less time left than an attempt's window (the
/// policy's `min_attempt_window`), none at all included, sends nothing: an
/// HTTP call ends at once with the `deadline` stop reason and a
/// [`crate::RetryError`] whose `is_timeout()` is true, and the scope notes
/// the give-up. Not even a request with a zero timeout goes: reqwest's
/// timer may fire after the request left, and a payment API without our
/// inbound layer would run a POST nobody waits for. A generic operation
/// run by [`crate::retry::retry_if_time`] is not called either (its value is
/// `None`); [`crate::retry::retry`] has no value to return without calling its
/// operation, and calls it once, with `ctx.timeout()` the time left (zero
/// when none).
///
/// ```
/// use std::time::Duration;
/// use reqwest_safe_retry::RetryPolicy;
/// use reqwest_safe_retry::admission::Partition;
/// use reqwest_safe_retry::deadline::InheritedDeadline;
/// use reqwest_safe_retry::retry::{retry_if_time, Outcome};
///
/// # tokio::runtime::Builder::new_current_thread().enable_all().start_paused(true).build().unwrap().block_on(async {
/// let policy = RetryPolicy::default(); // an attempt's window: 100 ms
/// let charge = |_| async { Outcome::success("charged") };
/// // Called with 40 ms left: not run.
/// let (value, report) = InheritedDeadline::after(Duration::from_millis(40))
///     .scope(retry_if_time(&policy, Partition::SINGLE, charge))
///     .await;
/// assert_eq!((value, report.attempts()), (None, 0));
/// # });
/// ```
///
/// A task-local belongs to the task: work the handler **spawns** onto
/// another task (`tokio::spawn`) does not inherit it. Carry it explicitly:
///
/// ```
/// # use reqwest_safe_retry::deadline::InheritedDeadline;
/// # async fn handler() {
/// let scope = InheritedDeadline::current();
/// tokio::spawn(async move {
///     let work = async { /* calls made with this crate */ };
///     match scope {
///         Some(scope) => scope.scope(work).await,
///         None => work.await,
///     }
/// });
/// # }
/// ```
///
/// The layer and the client share the task-local, so both live in this
/// crate (the client's crate): a separate layer crate would have to depend
/// on the client for it, or the client on the layer.
///
/// Set by [`crate::deadline::InheritDeadlineLayer`] around a handler; read by every
/// call this crate makes inside it. Clones share the note, so a scope
/// carried into a spawned task still reports its give-ups to the layer.
#[derive(Debug, Clone)]
pub struct InheritedDeadline {
    /// When the caller stops waiting, on tokio's clock (paused in tests).
    at: Option<Instant>,
    gave_up: Arc<Mutex<Option<StopReason>>>,
    /// The request's own Idempotency-Key, when it had one: the keys of the
    /// calls made on its behalf derive from it.
    incoming: Option<Arc<Incoming>>,
}

/// A served request's key, as the seed its calls' keys derive from, and
/// how many keyed calls were made so far.
#[derive(Debug)]
struct Incoming {
    seed: Seed,
    calls: AtomicU32,
}

/// The seed: given, or made by the first keyed call.
#[derive(Debug)]
enum Seed {
    Given([u8; 32]),
    Pending {
        made: OnceLock<[u8; 32]>,
        source: Source,
    },
}

/// What a seed not made yet is made of: the request's key, its
/// `Authorization`, and the caller a server's idempotency layer scoped it
/// to, which that layer sets once the request reaches it (inside the
/// inbound layer) and which counts instead of the credential when set.
#[derive(Debug)]
struct Source {
    key: Box<str>,
    authorization: Box<[u8]>,
    served: CallerScope,
}

impl Seed {
    fn get(&self) -> &[u8; 32] {
        match self {
            Seed::Given(seed) => seed,
            Seed::Pending { made, source: s } => made.get_or_init(|| match s.served.get() {
                Some(scope) => scoped_derivation_seed(scope, &s.key),
                None => derivation_seed(&s.authorization, &s.key),
            }),
        }
    }
}

impl InheritedDeadline {
    /// The scope the current task runs in, if any.
    pub fn current() -> Option<InheritedDeadline> {
        INHERITED.try_with(InheritedDeadline::clone).ok()
    }

    /// A scope whose caller waits `time_left` from now, or less if the
    /// current scope ends sooner (it shares the current scope's note of
    /// give-ups). A `time_left` too far to represent is no limit.
    pub fn after(time_left: Duration) -> InheritedDeadline {
        InheritedDeadline::within_current(Instant::now().checked_add(time_left))
    }

    /// A scope ending at `at` (`None`: no limit of its own), nested in the
    /// current one.
    pub(crate) fn within_current(at: Option<Instant>) -> InheritedDeadline {
        match InheritedDeadline::current() {
            Some(outer) => InheritedDeadline {
                at: match (outer.at, at) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                },
                gave_up: outer.gave_up,
                incoming: outer.incoming,
            },
            None => InheritedDeadline {
                at,
                gave_up: Arc::default(),
                incoming: None,
            },
        }
    }

    /// The time left before the caller stops waiting (zero once it has);
    /// `None` when the caller set no limit.
    pub fn time_left(&self) -> Option<Duration> {
        self.at
            .map(|at| at.saturating_duration_since(Instant::now()))
    }

    /// Why the last call made in this scope that did not succeed stopped
    /// (attempts exhausted, deadline, budget…), if one did not.
    pub fn gave_up(&self) -> Option<StopReason> {
        *lock(&self.gave_up)
    }

    /// The same scope, serving a request whose own `Idempotency-Key` is
    /// `key`, sent by `caller` (its `Authorization`, or empty): each keyed
    /// call made inside it (a POST or PATCH through the middleware, with no
    /// key of its own) gets a key derived from the two and from its place
    /// in order, the first call the first key and so on. A handler that
    /// runs again for the same request (a retry its own store let through,
    /// a takeover by another replica) makes its calls in the same order,
    /// with the same keys, so a downstream service that honours keys runs
    /// each effect once. Two callers' requests with the same key derive
    /// different keys.
    ///
    /// [`crate::deadline::InheritDeadlineLayer`] sets it from the request's headers.
    ///
    /// ```
    /// use reqwest_safe_retry::deadline::InheritedDeadline;
    ///
    /// let scope = InheritedDeadline::unlimited().serving_key(b"Bearer alice", "order-17");
    /// let first = scope.derive_key();
    /// assert_eq!(first, scope.clone().serving_key(b"Bearer alice", "order-17").derive_key());
    /// assert_ne!(first, scope.derive_key(), "the second call's key");
    /// ```
    #[must_use]
    pub fn serving_key(mut self, caller: &[u8], key: &str) -> Self {
        self.incoming = Some(Arc::new(Incoming {
            seed: Seed::Given(derivation_seed(caller, key)),
            calls: AtomicU32::new(0),
        }));
        self
    }

    /// [`InheritedDeadline::serving_key`] for a request whose caller a
    /// server's idempotency layer may scope (`served`, shared with the
    /// request's extensions): the keys derive from that scope once it is
    /// set, from `authorization` otherwise. Read at the first keyed call,
    /// by when the idempotency layer (inside) has set it.
    #[must_use]
    pub(crate) fn serving_key_for(
        mut self,
        served: CallerScope,
        authorization: &[u8],
        key: &str,
    ) -> Self {
        self.incoming = Some(Arc::new(Incoming {
            seed: Seed::Pending {
                made: OnceLock::new(),
                source: Source {
                    key: key.into(),
                    authorization: authorization.into(),
                    served,
                },
            },
            calls: AtomicU32::new(0),
        }));
        self
    }

    /// A scope with no limit of its own, nested in the current one.
    pub fn unlimited() -> Self {
        InheritedDeadline::within_current(None)
    }

    /// The key of the next keyed call made in this scope, when it serves a
    /// request with a key ([`InheritedDeadline::serving_key`]).
    pub fn derive_key(&self) -> Option<String> {
        self.next_key().map(|k| k.as_str().to_owned())
    }

    /// The next derived key, shared with the header and the report.
    pub(crate) fn next_key(&self) -> Option<SharedKey> {
        let incoming = self.incoming.as_ref()?;
        let ordinal = incoming
            .calls
            .fetch_add(1, Ordering::Relaxed)
            .wrapping_add(1);
        Some(SharedKey::derived(incoming.seed.get(), ordinal))
    }

    /// Runs `future` inside this scope: the calls it makes inherit it.
    pub fn scope<F: Future>(self, future: F) -> impl Future<Output = F::Output> {
        INHERITED.scope(self, future)
    }

    /// Runs `f` inside this scope, for work done before a future exists
    /// (a service's `call`).
    pub(crate) fn sync_scope<R>(self, f: impl FnOnce() -> R) -> R {
        INHERITED.sync_scope(self, f)
    }

    /// The task-local future [`InheritedDeadline::scope`] makes, nameable.
    pub(crate) fn scope_named<F: Future>(
        self,
        future: F,
    ) -> tokio::task::futures::TaskLocalFuture<InheritedDeadline, F> {
        INHERITED.scope(self, future)
    }
}

/// The limits of a call made now: its own, with the deadline bounded by
/// the inherited time left.
pub(crate) fn bound(limits: Limits) -> Limits {
    match InheritedDeadline::current().and_then(|s| s.time_left()) {
        Some(left) => Limits {
            deadline: shorter(limits.deadline, Some(left)),
            ..limits
        },
        None => limits,
    }
}

/// Notes, in the current scope, how a call ended, when it ended because
/// retrying was spent or refused here: that is what lets the layer answer
/// "do not retry" (this hop already retried, or was told not to). A call
/// that failed for good without retrying (a permanent answer, a request
/// that may not be repeated) or made one attempt only (a hop configured
/// not to retry) notes nothing: its failure says nothing about whether the
/// caller should retry.
pub(crate) fn note_stop(reason: StopReason, attempts: u32) {
    let gave_up = match reason {
        StopReason::Deadline
        | StopReason::BudgetExhausted
        | StopReason::RetryAfterTooLong
        | StopReason::ServerSaidNo
        | StopReason::CircuitOpen => true,
        StopReason::AttemptsExhausted => attempts > 1,
        _ => false,
    };
    if gave_up {
        let _ = INHERITED.try_with(|s| *lock(&s.gave_up) = Some(reason));
    }
}

/// The report of a call on `partition` refused before its first attempt,
/// for `reason`, noted in the current scope as [`note_stop`] says.
pub(crate) fn refusal(reason: StopReason, partition: Partition) -> RetryReport {
    note_stop(reason, 0);
    let mut report = RetryReport::new();
    report.stop_reason = reason;
    report.partition = partition;
    report
}

/// The limits of one logical operation: the policy's, or a request's own.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub(crate) max_attempts: u32,
    pub(crate) deadline: Option<Duration>,
    pub(crate) attempt_timeout: Option<Duration>,
}

impl Limits {
    /// Whether a call starting now with these limits (bounded by
    /// [`bound`]) has no room for one attempt of `window`: then nothing
    /// is sent.
    pub(crate) fn leave_no_room(&self, window: Duration) -> bool {
        self.deadline.is_some_and(|left| left < window)
    }
}

/// The shorter of two optional limits; `None` is no limit.
pub(crate) fn shorter(a: Option<Duration>, b: Option<Duration>) -> Option<Duration> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_scope_nothing_is_inherited() {
        assert!(InheritedDeadline::current().is_none());
        let limits = Limits {
            max_attempts: 3,
            deadline: Some(Duration::from_secs(30)),
            attempt_timeout: None,
        };
        assert_eq!(bound(limits).deadline, Some(Duration::from_secs(30)));
        note_stop(StopReason::Deadline, 1); // no scope: nowhere to note it, no panic
    }

    /// Only a call that spent or was refused its retries lets the layer
    /// say "do not retry": not a permanent answer (a lookup's expected
    /// 404), not a request that may not be repeated, not a hop that made
    /// one attempt only.
    #[tokio::test(start_paused = true)]
    async fn only_spent_retries_are_noted() {
        let noted = |reason, attempts| async move {
            let scope = InheritedDeadline::after(Duration::from_secs(1));
            scope
                .clone()
                .scope(async move {
                    note_stop(reason, attempts);
                    InheritedDeadline::current().and_then(|s| s.gave_up())
                })
                .await
        };
        assert_eq!(noted(StopReason::Permanent, 1).await, None);
        assert_eq!(noted(StopReason::NotIdempotent, 1).await, None);
        assert_eq!(noted(StopReason::Success, 2).await, None);
        assert_eq!(noted(StopReason::AttemptsExhausted, 1).await, None);
        assert_eq!(
            noted(StopReason::AttemptsExhausted, 3).await,
            Some(StopReason::AttemptsExhausted)
        );
        assert_eq!(
            noted(StopReason::Deadline, 1).await,
            Some(StopReason::Deadline)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_nested_scope_keeps_the_sooner_end_and_shares_the_note() {
        let outer = InheritedDeadline::after(Duration::from_millis(500));
        let seen = outer
            .clone()
            .scope(async {
                let inner = InheritedDeadline::after(Duration::from_secs(10));
                inner
                    .scope(async {
                        note_stop(StopReason::BudgetExhausted, 2);
                        InheritedDeadline::current().unwrap().time_left()
                    })
                    .await
            })
            .await;
        assert_eq!(seen, Some(Duration::from_millis(500)));
        assert_eq!(outer.gave_up(), Some(StopReason::BudgetExhausted));
    }
}
