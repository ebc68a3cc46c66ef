//! The attempt loop, generic over any async operation whose outcome the
//! caller classifies. The reqwest middleware is one adapter onto it.
//!
//! Each turn of the loop, top to bottom: classify → is another attempt
//! allowed → delay (which sees the server's hint) → does it fit the deadline
//! → sleep → admission (which may wait, bounded by the deadline) → next.
//! Admission comes last so that a retry is counted when it is sent, and a
//! give-up spends nothing. The reqwest middleware drives this same loop.
use std::fmt;
use std::future::Future;
use std::time::{Duration, Instant};

use tracing::Instrument;

use crate::decisions::{AttemptRecord, AttemptResult, Grant, RetryKind};
use crate::signals::retry_after;
use crate::vocabulary::{Partition, RetryReport, Route, StopReason};

use super::deadline::{self, shorter, Limits};
use super::outcome::{
    listened, operation_span, trace_attempt, AttemptContext, Elsewhere, Outcome, Signal, Step,
    Verdict,
};
use super::policy::RetryPolicy;

/// Runs `op` until it succeeds, fails permanently, or the policy says stop,
/// and returns the last value with the [`RetryReport`].
///
/// Each call is one logical operation: it starts from the initial delay and
/// counts once as a first attempt for the policy's admission, in its one
/// [`Partition::SINGLE`]; [`retry_in`] names another partition.
pub async fn retry<T, F, Fut>(policy: &RetryPolicy, op: F) -> (T, RetryReport)
where
    F: FnMut(AttemptContext) -> Fut,
    Fut: Future<Output = Outcome<T>>,
{
    retry_in(policy, Partition::SINGLE, op).await
}

/// [`retry`], with admission decided for `partition`: the host (or the
/// database, the shard, the tenant) the operation calls, so that one
/// failing target neither holds back nor releases another's retries.
///
/// ```
/// use reqwest_safe_retry::{admission::Partition, retry::{retry_in, Outcome}, RetryPolicy};
///
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let policy = RetryPolicy::default();
/// let replica = Partition::named("db-replica-2");
/// let (value, report) = retry_in(&policy, replica, |_| async { Outcome::success(Ok::<_, ()>(7)) }).await;
/// assert_eq!(value, Ok(7));
/// assert_eq!(report.attempts(), 1);
/// # });
/// ```
pub async fn retry_in<T, F, Fut>(
    policy: &RetryPolicy,
    partition: Partition,
    op: F,
) -> (T, RetryReport)
where
    F: FnMut(AttemptContext) -> Fut,
    Fut: Future<Output = Outcome<T>>,
{
    let limits = deadline::bound(Limits::from(policy));
    let mut run = Run::start(policy, limits, partition, None);
    let span = operation_span();
    run.traced = !span.is_disabled();
    run.listened = listened();
    let value = run.drive(&mut Closure(op)).instrument(span).await;
    (value, run.report)
}

/// [`retry_in`], for an operation that must not start without time for an
/// attempt: when the deadline, its own or inherited
/// ([`crate::deadline::InheritedDeadline`]), leaves less than the policy's
/// `min_attempt_window`, `op` is not called, the value is `None` and the
/// report says `deadline`, with no attempt (an example is in
/// [`crate::deadline::InheritedDeadline`]). [`retry_in`] has no value to return
/// without `op`, and calls it once even then.
pub async fn retry_if_time<T, F, Fut>(
    policy: &RetryPolicy,
    partition: Partition,
    mut op: F,
) -> (Option<T>, RetryReport)
where
    F: FnMut(AttemptContext) -> Fut,
    Fut: Future<Output = Outcome<T>>,
{
    let limits = deadline::bound(Limits::from(policy));
    if limits.leave_no_room(policy.settings.min_attempt_window) {
        policy.metrics.deadline_refused(0, None);
        return (None, deadline::refusal(StopReason::Deadline, partition));
    }
    let op = |ctx| {
        let attempt = op(ctx);
        async move { attempt.await.map(Some) }
    };
    retry_in(policy, partition, op).await
}

/// A generic call's limits: the policy's.
impl From<&RetryPolicy> for Limits {
    fn from(policy: &RetryPolicy) -> Self {
        Limits {
            max_attempts: policy.settings.max_attempts,
            deadline: policy.settings.deadline,
            attempt_timeout: policy.settings.attempt_timeout,
        }
    }
}

/// One attempt of a logical operation, as the loop drives it.
pub(crate) trait Attempt {
    /// What an attempt returns.
    type Output;

    /// Makes attempt `ctx.attempt()`.
    async fn attempt(&mut self, ctx: AttemptContext) -> Outcome<Self::Output>;

    /// The attempt's status or error kind, for the per-attempt event.
    fn label(&self, value: &Self::Output, f: &mut fmt::Formatter<'_>) -> fmt::Result;

    /// Publishes that the attempt to `host` took `elapsed` (the `metrics`
    /// feature): an HTTP attempt's duration; nothing for another.
    #[cfg(feature = "metrics")]
    fn took(&self, _value: &Self::Output, _host: u64, _elapsed: Duration) {}
}

/// The generic engine's operation: a closure.
struct Closure<F>(F);

impl<T, F, Fut> Attempt for Closure<F>
where
    F: FnMut(AttemptContext) -> Fut,
    Fut: Future<Output = Outcome<T>>,
{
    type Output = T;

    async fn attempt(&mut self, ctx: AttemptContext) -> Outcome<T> {
        (self.0)(ctx).await
    }

    fn label(&self, _: &T, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("-")
    }
}

/// Formats an attempt's label only if a subscriber records the event.
struct Label<'a, A: Attempt>(&'a A, &'a A::Output);

impl<A: Attempt> fmt::Display for Label<'_, A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.label(self.1, f)
    }
}

/// The state of one logical operation.
pub(crate) struct Run<'p> {
    pub(super) policy: &'p RetryPolicy,
    pub(super) limits: Limits,
    pub(super) started: Instant,
    pub(super) attempt: u32,
    pub(super) prev_delay: Duration,
    /// The grant the current attempt was sent under (`None` for the first).
    pub(super) grant: Option<Grant>,
    /// Whether the current delay was set by a server's Retry-After.
    pub(super) by_hint: bool,
    /// Whether the current retry has waited for a paced host's rate.
    pub(super) pacing: bool,
    /// The route of the partition the operation is on: what a pacing is
    /// kept for.
    pub(crate) route: Route,
    /// Whether the operation's span has a subscriber: only then does
    /// [`Run::finish`] record the retry count and the stop reason into it.
    pub(crate) traced: bool,
    /// Whether anyone may listen ([`listened`]): only then is the
    /// per-attempt event made. True unless the caller asked.
    pub(crate) listened: bool,
    /// The host an HTTP call is sent to (its URL's partition's digest),
    /// whose published series count it whatever partition admits it; 0
    /// for another operation.
    #[cfg(feature = "metrics")]
    host: u64,
    pub(crate) report: RetryReport,
}

impl<'p> Run<'p> {
    /// Starts an operation on `partition`, with `limits` already bounded
    /// by the inherited deadline ([`deadline::bound`]); `to`, for an HTTP
    /// call, is the host it is sent to ([`Partition::of_url`] of its URL)
    /// and the URL that names that host's published series.
    pub(crate) fn start(
        policy: &'p RetryPolicy,
        limits: Limits,
        partition: Partition,
        to: Option<(Partition, &reqwest::Url)>,
    ) -> Self {
        let now = policy.clock.now();
        let host = to.map_or(0, |(host, _)| host.id());
        policy.metrics.call_started(host, to.map(|(_, url)| url));
        policy.admission.first_attempt(partition, now);
        Run {
            policy,
            limits,
            started: now,
            attempt: 0,
            prev_delay: policy.settings.backoff.base(),
            grant: None,
            by_hint: false,
            pacing: false,
            route: Route::WHOLE,
            traced: false,
            listened: true,
            #[cfg(feature = "metrics")]
            host,
            report: RetryReport {
                partition,
                ..RetryReport::new()
            },
        }
    }

    /// The attempt loop: attempt → decide → sleep → admission → next. It
    /// borrows the run (an `async fn` keeps a copy of each argument it moves
    /// in, and the run is the largest) and leaves the report, finished, in
    /// it for its owner to move out.
    ///
    /// The clock is read once per attempt, when it ends: the first attempt
    /// begins at the run's start, a retry when admission lets it go, and
    /// an operation that stops after an attempt ends when that attempt did.
    pub(crate) async fn drive<A: Attempt>(&mut self, op: &mut A) -> A::Output {
        // Asked before any future is made: a first attempt usually goes
        // at once.
        let mut begins = match self.first_wait(self.started) {
            None => self.started,
            Some(wait) => self.admit_first(wait).await,
        };
        loop {
            let ctx = self.context(begins);
            // An attempt sent under a grant that its caller drops is told
            // to admission all the same (a first attempt has none).
            let guard = self.abandoned();
            // Split at once: only the value is kept across the sleeps
            // below, so the future stays small.
            let Outcome {
                value,
                verdict,
                signal,
            } = op.attempt(ctx).await;
            Self::attempt_ended(guard);
            let ended = self.policy.clock.now();
            #[cfg(feature = "metrics")]
            op.took(&value, self.host(), ended.saturating_duration_since(begins));
            let step = self.decide(verdict, signal, ended);
            // The attempt's number from the run, not from `ctx`: the
            // context is then not kept across the attempt's await, which
            // leaves the future room for `begins`, the attempt's duration.
            if self.listened {
                trace_attempt(self.attempt, &Label(op, &value), verdict, step);
            }
            let (reason, at) = match step {
                Step::Stop(reason) => (reason, ended),
                Step::Retry(delay, kind) => {
                    self.sleep(delay).await;
                    match self.admit(kind).await {
                        Ok(now) => {
                            begins = now;
                            continue;
                        }
                        Err(reason) => (reason, self.policy.clock.now()),
                    }
                }
            };
            self.finish(reason, at);
            return value;
        }
    }

    /// Begins the next attempt at `now`.
    #[inline]
    fn context(&mut self, now: Instant) -> AttemptContext {
        self.attempt += 1;
        self.report.attempts = self.attempt;
        // A first attempt that did not wait begins at the start: the whole
        // deadline is left.
        let time_left = if self.attempt == 1 && now == self.started {
            self.deadline().and(self.limits.deadline)
        } else {
            self.time_left(now)
        };
        let settings = &self.policy.settings;
        // gRPC's rule: at least the floor, and at least the backoff that would
        // follow this attempt.
        let floor = settings
            .min_attempt_timeout
            .map(|f| f.max(settings.backoff.ceiling(self.attempt - 1)));
        let configured = match (self.limits.attempt_timeout, floor) {
            (Some(a), Some(f)) => Some(a.max(f)),
            (a, f) => a.or(f),
        };
        let timeout = shorter(configured, time_left);
        AttemptContext {
            attempt: self.attempt,
            timeout,
            time_left,
        }
    }

    /// The host the operation's counters are published for: the one a
    /// call to a host is sent to, 0 for another operation.
    pub(super) fn host(&self) -> u64 {
        #[cfg(feature = "metrics")]
        return self.host;
        #[cfg(not(feature = "metrics"))]
        0
    }

    /// The instant the deadline ends at, made when asked (a call that
    /// succeeds at once asks once): not kept in the future every call
    /// boxes. An instant too far to represent is no deadline at all.
    fn deadline(&self) -> Option<Instant> {
        self.limits
            .deadline
            .and_then(|d| self.started.checked_add(d))
    }

    pub(super) fn time_left(&self, now: Instant) -> Option<Duration> {
        self.deadline().map(|d| d.saturating_duration_since(now))
    }

    /// Decides, after an attempt, whether and how long to wait for the next.
    /// Pure but for the random draw and the counters; admission comes after
    /// the sleep.
    fn decide(&mut self, verdict: Verdict, signal: Signal, now: Instant) -> Step {
        let policy = self.policy;
        // One replica's failure, while another address of the host is
        // healthy, is no evidence against the host: neither the admission
        // nor the breaker counts it.
        let result = match (verdict.result(), signal.elsewhere) {
            (AttemptResult::Failure, Some(_)) => AttemptResult::Other,
            (result, _) => result,
        };
        let record = signal.onto(
            AttemptRecord::new(self.attempt, self.grant, result).on_route(self.route),
            || policy.metrics.throttled(self.host()),
            policy.settings.max_retry_after,
        );
        policy.admission.record(self.report.partition, record, now);
        if let (Some(breaker), Some(ok)) = (&policy.breaker, signal.for_breaker(verdict, result)) {
            breaker.record(self.report.partition, ok, now);
        }
        if self.attempt == 1 && verdict != Verdict::Success && !signal.throttled {
            policy.metrics.first_attempt_failed(self.host());
        }
        let (hint, kind) = match verdict {
            Verdict::Success => return Step::Stop(StopReason::Success),
            Verdict::Stop { reason, .. } => return Step::Stop(reason),
            Verdict::Transient { retry_after, kind } => (retry_after, kind),
        };
        if self.attempt >= self.limits.max_attempts {
            return Step::Stop(StopReason::AttemptsExhausted);
        }
        let settings = &policy.settings;
        let backoff = match (kind, &settings.throttle_backoff) {
            (RetryKind::Throttled, Some(throttle)) => throttle,
            _ => &settings.backoff,
        };
        let n = self.attempt - 1;
        // Another machine, reached at once: no backoff, but the deadline
        // and admission as for any retry.
        let at_once = signal.elsewhere == Some(Elsewhere::AtOnce) && hint.is_none();
        let (computed, delay) = if at_once {
            (Duration::ZERO, Duration::ZERO)
        } else {
            policy.with_rng(|rng| {
                let computed = backoff.delay(n, self.prev_delay, rng);
                let delay = match hint {
                    Some(h) => retry_after::floor_with_jitter(computed, h, rng),
                    None => computed,
                };
                (computed, delay)
            })
        };
        if let Some(h) = hint {
            if h > settings.max_retry_after {
                return Step::Stop(StopReason::RetryAfterTooLong);
            }
        }
        if let Some(left) = self.time_left(now) {
            let needed = delay.saturating_add(settings.min_attempt_window);
            if needed > left {
                policy.metrics.deadline_gave_up(self.host());
                let hint_alone_fits =
                    hint.is_none_or(|h| h.saturating_add(settings.min_attempt_window) <= left);
                return Step::Stop(if hint_alone_fits {
                    StopReason::Deadline
                } else {
                    StopReason::RetryAfterTooLong
                });
            }
        }
        // A strategy that fails fast fails before the sleep.
        if !policy.admission.may_admit(self.report.partition, kind) {
            policy.metrics.budget_rejected(self.host());
            return Step::Stop(StopReason::BudgetExhausted);
        }
        self.by_hint = delay > computed;
        if !at_once {
            // Decorrelated jitter grows from the last backoff slept.
            self.prev_delay = delay;
        }
        Step::Retry(delay, kind)
    }

    async fn sleep(&mut self, delay: Duration) {
        self.report.delays.push(delay);
        if !delay.is_zero() {
            self.policy.sleeper.sleep(delay).await;
        }
    }

    /// Ends the operation at `now`: the report, in place; the span; the counters.
    pub(crate) fn finish(&mut self, reason: StopReason, now: Instant) {
        let host = self.host();
        let report = &mut self.report;
        report.stop_reason = reason;
        // A success (the usual end) notes nothing, and asks no task-local.
        if reason != StopReason::Success {
            deadline::note_stop(reason, self.attempt);
        }
        report.elapsed = now.saturating_duration_since(self.started);
        if self.traced {
            let span = tracing::Span::current();
            // `i64`: tracing-opentelemetry exports a `u64` as a string.
            let resends = i64::from(self.attempt.saturating_sub(1));
            span.record("http.request.resend_count", resends);
            span.record("stop_reason", reason.as_str());
        }
        self.policy
            .metrics
            .call_finished(host, self.attempt, reason == StopReason::Success);
    }
}
