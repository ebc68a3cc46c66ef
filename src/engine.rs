//! The attempt loop, generic over any async operation whose outcome the
//! caller classifies. The reqwest middleware is one adapter onto it.
//!
//! ```
//! use std::time::Duration;
//! use reqwest_safe_retry::{retry, ManualClock, Outcome, RetryPolicy, StopReason};
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let clock = ManualClock::new(); // no real sleeping in this example
//! let policy = RetryPolicy::builder().manual_clock(&clock).seed(1).build().unwrap();
//!
//! let mut calls = 0;
//! let (value, report) = retry(&policy, |ctx| {
//!     calls += 1;
//!     async move {
//!         // Reconnect to a database, call an RPC… and classify the outcome.
//!         if ctx.attempt() < 3 {
//!             Outcome::transient(Err("connection refused"))
//!         } else {
//!             Outcome::success(Ok(42))
//!         }
//!     }
//! })
//! .await;
//! assert_eq!(value, Ok(42));
//! assert_eq!(report.attempts(), 3);
//! assert_eq!(report.stop_reason(), StopReason::Success);
//! assert_eq!(report.delays(), clock.sleeps());
//! # });
//! ```
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

use crate::admission::{
    Admission, AttemptRecord, AttemptResult, Grant, Partition, RetryKind, RetryRequest,
};
use crate::metrics::Metrics;
use crate::policy::RetryPolicy;
use crate::rate_limit::RateLimit;
use crate::report::{RetryReport, StopReason};
use crate::retry_after;

/// An operation's outcome, classified by the caller.
#[derive(Debug)]
pub struct Outcome<T> {
    value: T,
    verdict: Verdict,
    signal: Signal,
}

/// What an answer says about its host's rate, whatever its verdict.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub(crate) struct Signal {
    /// A throttling answer: 429, or 503 with Retry-After.
    pub(crate) throttled: bool,
    /// The server's Retry-After, when throttled.
    pub(crate) retry_after: Option<Duration>,
    /// The rate-limit fields it carried.
    pub(crate) rate_limit: Option<RateLimit>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Verdict {
    Success,
    Transient {
        retry_after: Option<Duration>,
        kind: RetryKind,
    },
    /// Stop now. `failed` says whether the attempt itself failed
    /// transiently (a transient outcome the safety rule stopped): admission
    /// counts it as a failure.
    Stop {
        reason: StopReason,
        failed: bool,
    },
}

impl Verdict {
    pub(crate) fn stop(reason: StopReason) -> Self {
        Verdict::Stop {
            reason,
            failed: false,
        }
    }

    /// What the classifier said, for the per-attempt event: a transient
    /// outcome that the safety rule stopped is still "transient".
    pub(crate) fn class_name(self) -> &'static str {
        match self {
            Verdict::Success => "success",
            Verdict::Transient { .. } | Verdict::Stop { failed: true, .. } => "transient",
            Verdict::Stop {
                reason: StopReason::Permanent | StopReason::ServerSaidNo,
                ..
            } => "permanent",
            Verdict::Stop { .. } => "stopped",
        }
    }

    /// What admission records of an attempt with this verdict.
    pub(crate) fn result(self) -> AttemptResult {
        match self {
            Verdict::Success => AttemptResult::Success,
            Verdict::Transient { .. } | Verdict::Stop { failed: true, .. } => {
                AttemptResult::Failure
            }
            Verdict::Stop { .. } => AttemptResult::Other,
        }
    }
}

impl Signal {
    /// `record` with what the answer said of its host's rate, a throttling
    /// answer counted.
    pub(crate) fn onto(self, mut record: AttemptRecord, metrics: &Metrics) -> AttemptRecord {
        if self.throttled {
            metrics.throttled();
            record = record.throttled(self.retry_after);
        }
        if let Some(rate_limit) = self.rate_limit {
            record = record.with_rate_limit(rate_limit);
        }
        record
    }
}

impl<T> Outcome<T> {
    pub(crate) fn new(value: T, verdict: Verdict) -> Self {
        Outcome {
            value,
            verdict,
            signal: Signal::default(),
        }
    }

    pub(crate) fn with_signal(mut self, signal: Signal) -> Self {
        self.signal = signal;
        self
    }

    /// Done: return `value`.
    pub fn success(value: T) -> Self {
        Outcome::new(value, Verdict::Success)
    }

    /// Worth another attempt; `value` is returned if none is made.
    pub fn transient(value: T) -> Self {
        Outcome::new(
            value,
            Verdict::Transient {
                retry_after: None,
                kind: RetryKind::Transient,
            },
        )
    }

    /// Retrying cannot help: return `value` now.
    pub fn permanent(value: T) -> Self {
        Outcome::stop(value, StopReason::Permanent)
    }

    /// Stop now for the given reason.
    pub fn stop(value: T, reason: StopReason) -> Self {
        Outcome::new(value, Verdict::stop(reason))
    }

    /// The server asked to wait at least `hint` (a transient outcome only).
    #[must_use]
    pub fn with_retry_after(mut self, hint: Duration) -> Self {
        if let Verdict::Transient { retry_after, .. } = &mut self.verdict {
            *retry_after = Some(hint);
        }
        self
    }

    /// The attempt timed out (a transient outcome only); a budget may charge
    /// more for it.
    #[must_use]
    pub fn timed_out(self) -> Self {
        self.with_kind(RetryKind::Timeout)
    }

    /// The server throttled the attempt (a transient outcome only): the
    /// policy's throttling backoff applies, a budget may charge less, and
    /// the admission paces the partition's next requests to the rate it
    /// accepts.
    #[must_use]
    pub fn throttled(mut self) -> Self {
        if let Verdict::Transient { retry_after, .. } = self.verdict {
            self.signal.throttled = true;
            self.signal.retry_after = retry_after;
        }
        self.with_kind(RetryKind::Throttled)
    }

    /// The server's rate-limit fields (see [`crate::rate_limit`]): a
    /// partition whose quota is spent is held until its reset.
    #[must_use]
    pub fn with_rate_limit(mut self, rate_limit: RateLimit) -> Self {
        self.signal.rate_limit = Some(rate_limit);
        self
    }

    fn with_kind(mut self, new: RetryKind) -> Self {
        if let Verdict::Transient { kind, .. } = &mut self.verdict {
            *kind = new;
        }
        self
    }
}

/// What the operation learns about the attempt it is making.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttemptContext {
    attempt: u32,
    timeout: Option<Duration>,
    time_left: Option<Duration>,
}

impl AttemptContext {
    /// The attempt number, 1 for the first.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// How long this attempt may take: `min(attempt timeout, time left)`.
    /// The operation must enforce it.
    pub fn timeout(&self) -> Option<Duration> {
        self.timeout
    }

    /// Time left before the deadline, if there is one.
    pub fn time_left(&self) -> Option<Duration> {
        self.time_left
    }
}

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
/// use reqwest_safe_retry::{retry_in, ManualClock, Outcome, Partition, RetryPolicy};
///
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let clock = ManualClock::new();
/// let policy = RetryPolicy::builder().manual_clock(&clock).seed(1).build().unwrap();
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
    let mut run = Run::start(policy, Limits::from(policy), partition);
    let span = operation_span();
    run.traced = !span.is_disabled();
    run.drive(&mut Closure(op)).instrument(span).await
}

/// One attempt of a logical operation, as the loop drives it.
pub(crate) trait Attempt {
    /// What an attempt returns.
    type Output;

    /// Makes attempt `ctx.attempt()`.
    async fn attempt(&mut self, ctx: AttemptContext) -> Outcome<Self::Output>;

    /// The attempt's status or error kind, for the per-attempt event.
    fn label(&self, value: &Self::Output, f: &mut fmt::Formatter<'_>) -> fmt::Result;
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

/// The span of one logical operation; [`Run::finish`] records the retry
/// count and the stop reason into it.
pub(crate) fn operation_span() -> tracing::Span {
    tracing::info_span!(
        "retry",
        http.request.resend_count = tracing::field::Empty,
        stop_reason = tracing::field::Empty,
    )
}

/// One event per attempt: number, status or error kind, class, chosen delay,
/// and the reason when it is the last.
fn trace_attempt(ctx: &AttemptContext, outcome: &dyn fmt::Display, verdict: Verdict, step: Step) {
    let (delay_ms, stop_reason) = match step {
        Step::Retry(d, _) => (u64::try_from(d.as_millis()).unwrap_or(u64::MAX), ""),
        Step::Stop(r) => (0, r.as_str()),
    };
    tracing::info!(
        attempt = ctx.attempt(),
        http.request.resend_count = ctx.attempt() - 1,
        %outcome,
        class = verdict.class_name(),
        delay_ms,
        stop_reason,
        "attempt finished"
    );
}

/// The limits of one logical operation: the policy's, or a request's own.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub(crate) max_attempts: u32,
    pub(crate) deadline: Option<Duration>,
    pub(crate) attempt_timeout: Option<Duration>,
}

impl From<&RetryPolicy> for Limits {
    fn from(policy: &RetryPolicy) -> Self {
        Limits {
            max_attempts: policy.settings.max_attempts,
            deadline: policy.settings.deadline,
            attempt_timeout: policy.settings.attempt_timeout,
        }
    }
}

/// The shorter of two optional limits; `None` is no limit.
pub(crate) fn shorter(a: Option<Duration>, b: Option<Duration>) -> Option<Duration> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// What to do after an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// Sleep this long, then ask admission for a retry of this kind.
    Retry(Duration, RetryKind),
    Stop(StopReason),
}

/// What one question to admission came to.
enum Asked {
    /// Send the retry now.
    Admitted(Instant),
    /// Sleep this long and ask again.
    Wait(Duration),
    Stop(StopReason),
}

/// The state of one logical operation.
pub(crate) struct Run<'p> {
    policy: &'p RetryPolicy,
    limits: Limits,
    started: Instant,
    deadline: Option<Instant>,
    attempt: u32,
    prev_delay: Duration,
    /// The grant the current attempt was sent under (`None` for the first).
    grant: Option<Grant>,
    /// Whether the current delay was set by a server's Retry-After.
    by_hint: bool,
    /// Whether the current retry has waited for a paced host's rate.
    pacing: bool,
    /// Whether the operation's span has a subscriber: only then does
    /// [`Run::finish`] record the retry count and the stop reason into it.
    pub(crate) traced: bool,
    pub(crate) report: RetryReport,
}

impl<'p> Run<'p> {
    pub(crate) fn start(policy: &'p RetryPolicy, limits: Limits, partition: Partition) -> Self {
        let now = policy.clock.now();
        // A call made while serving a request ends when its caller stops waiting.
        let limits = crate::propagation::bound(limits);
        policy.metrics.call_started();
        policy.admission.first_attempt(partition, now);
        Run {
            policy,
            limits,
            started: now,
            // An instant too far to represent is no deadline at all.
            deadline: limits.deadline.and_then(|d| now.checked_add(d)),
            attempt: 0,
            prev_delay: policy.settings.backoff.base(),
            grant: None,
            by_hint: false,
            pacing: false,
            traced: false,
            report: RetryReport {
                partition,
                ..RetryReport::new()
            },
        }
    }

    /// The attempt loop: attempt → decide → sleep → admission → next.
    ///
    /// Borrows the run rather than taking it: an `async fn` keeps a copy of
    /// each argument it moves in, and the run is the largest.
    ///
    /// The clock is read once per attempt, when it ends: the first attempt
    /// begins at the run's start, a retry when admission lets it go, and
    /// an operation that stops after an attempt ends when that attempt did.
    pub(crate) async fn drive<A: Attempt>(&mut self, op: &mut A) -> (A::Output, RetryReport) {
        let mut begins = self.started;
        if self.policy.settings.pace_first_attempts {
            begins = self.admit_first().await;
        }
        loop {
            let ctx = self.context(begins);
            // Split at once: only the value is kept across the sleeps
            // below, so the future stays small.
            let Outcome {
                value,
                verdict,
                signal,
            } = op.attempt(ctx).await;
            let ended = self.policy.clock.now();
            let step = self.decide(verdict, signal, ended);
            trace_attempt(&ctx, &Label(op, &value), verdict, step);
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
            return (value, self.finish(reason, at));
        }
    }

    /// Begins the next attempt at `now`.
    fn context(&mut self, now: Instant) -> AttemptContext {
        self.attempt += 1;
        self.report.attempts = self.attempt;
        // A first attempt that did not wait begins at the start: the whole
        // deadline is left.
        let time_left = if self.attempt == 1 && now == self.started {
            self.deadline.and(self.limits.deadline)
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

    fn time_left(&self, now: Instant) -> Option<Duration> {
        self.deadline.map(|d| d.saturating_duration_since(now))
    }

    /// Decides, after an attempt, whether and how long to wait for the next.
    /// Pure but for the random draw and the counters; admission comes after
    /// the sleep.
    fn decide(&mut self, verdict: Verdict, signal: Signal, now: Instant) -> Step {
        let policy = self.policy;
        let result = verdict.result();
        let record = signal.onto(
            AttemptRecord::new(self.attempt, self.grant, result),
            &policy.metrics,
        );
        policy.admission.record(self.report.partition, record, now);
        if let Some(breaker) = &policy.breaker {
            breaker.record(self.report.partition, result != AttemptResult::Failure, now);
        }
        if self.attempt == 1 && verdict != Verdict::Success && !signal.throttled {
            policy.metrics.first_attempt_failed();
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
        let (computed, delay) = policy.with_rng(|rng| {
            let computed = backoff.delay(n, self.prev_delay, rng);
            let delay = match hint {
                Some(h) => retry_after::floor_with_jitter(computed, h, rng),
                None => computed,
            };
            (computed, delay)
        });
        if let Some(h) = hint {
            if h > settings.max_retry_after {
                return Step::Stop(StopReason::RetryAfterTooLong);
            }
        }
        if let Some(left) = self.time_left(now) {
            let needed = delay.saturating_add(settings.min_attempt_window);
            if needed > left {
                policy.metrics.deadline_gave_up();
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
            policy.metrics.budget_rejected();
            return Step::Stop(StopReason::BudgetExhausted);
        }
        self.by_hint = delay > computed;
        self.prev_delay = delay;
        Step::Retry(delay, kind)
    }

    async fn sleep(&mut self, delay: Duration) {
        self.report.delays.push(delay);
        self.policy.sleeper.sleep(delay).await;
    }

    /// Waits for admission, bounded by the deadline: `Ok` with the time it
    /// was admitted once the retry may be sent, or the reason to stop.
    ///
    /// The deadline is checked again before every question: a sleeper that
    /// woke late (the backoff's or admission's) must not start an attempt
    /// without its window. Woken late from the backoff, the operation ends
    /// with `deadline`; still waiting for admission when no window is left,
    /// with `budget_exhausted`: admission, not the deadline, is why it was
    /// not sent. The wait admission sees, and the report's, is the time
    /// elapsed, not the sum of the waits asked for.
    async fn admit(&mut self, kind: RetryKind) -> Result<Instant, StopReason> {
        let first_ask = self.policy.clock.now();
        loop {
            // Decided in a plain function: only what the sleep needs is
            // kept across it, so the future stays small.
            match self.ask(kind, first_ask) {
                Asked::Admitted(now) => return Ok(now),
                Asked::Wait(wait) => self.policy.sleeper.sleep(wait).await,
                Asked::Stop(reason) => {
                    let now = self.policy.clock.now();
                    self.report.admission_wait += now.saturating_duration_since(first_ask);
                    return Err(reason);
                }
            }
        }
    }

    /// Waits, before the first attempt, while the partition is paced (it
    /// throttled, or its quota is spent): returns when the attempt begins.
    /// It never waits past the deadline's last attempt window, nor once the
    /// admission stops answering "wait": then it goes at once and the
    /// server answers.
    async fn admit_first(&mut self) -> Instant {
        let policy = self.policy;
        let partition = self.report.partition;
        let mut now = self.started;
        loop {
            let waited = now.saturating_duration_since(self.started);
            let wait = match policy.admission.admit_first(partition, waited, now) {
                Admission::Paced(wait) | Admission::Wait(wait) => wait,
                Admission::Admit(grant) => {
                    if grant.is_paced() {
                        self.grant = Some(grant);
                    }
                    return now;
                }
                _ => return now,
            };
            let room = match self.time_left(now) {
                Some(left) => left.saturating_sub(policy.settings.min_attempt_window),
                None => wait,
            };
            let wait = wait.min(room);
            if wait.is_zero() {
                return now;
            }
            if waited.is_zero() {
                policy.metrics.waited_for_rate_limit();
            }
            self.report.rate_limit_wait += wait;
            policy.sleeper.sleep(wait).await;
            now = policy.clock.now();
        }
    }

    /// One question to admission, `first_ask` being when the retry first
    /// asked.
    fn ask(&mut self, kind: RetryKind, first_ask: Instant) -> Asked {
        let policy = self.policy;
        let window = policy.settings.min_attempt_window;
        let now = policy.clock.now();
        let waited = now.saturating_duration_since(first_ask);
        let left = self.time_left(now);
        if left.is_some_and(|left| left < window) {
            if waited.is_zero() {
                policy.metrics.deadline_gave_up();
                return Asked::Stop(StopReason::Deadline);
            }
            policy.metrics.budget_rejected();
            return Asked::Stop(StopReason::BudgetExhausted);
        }
        let request = RetryRequest::new(kind, waited);
        let answer = policy.admission.admit(self.report.partition, request, now);
        if let Admission::Paced(wait) = answer {
            let left = left.map_or(wait, |left| left.saturating_sub(window));
            let wait = wait.min(left);
            if wait.is_zero() {
                policy.metrics.budget_rejected();
                return Asked::Stop(StopReason::BudgetExhausted);
            }
            if !self.pacing {
                self.pacing = true;
                policy.metrics.waited_for_rate_limit();
            }
            self.report.rate_limit_wait += wait;
            return Asked::Wait(wait);
        }
        match answer {
            Admission::Admit(grant) => {
                self.grant = Some(grant);
                self.pacing = false;
                self.report.admission_wait += waited;
                policy.metrics.admitted(grant.is_probe());
                policy.metrics.retried(self.by_hint);
                if self.by_hint {
                    self.report.retry_after_honoured += 1;
                }
                Asked::Admitted(now)
            }
            Admission::Wait(wait) => {
                if waited.is_zero() {
                    policy.metrics.waited();
                }
                // The last look happens when exactly one attempt window is
                // left.
                let wait = match left {
                    Some(left) => wait.min(left.saturating_sub(window)),
                    None => wait,
                };
                if wait.is_zero() {
                    policy.metrics.budget_rejected();
                    return Asked::Stop(StopReason::BudgetExhausted);
                }
                Asked::Wait(wait)
            }
            _ => {
                policy.metrics.budget_rejected();
                Asked::Stop(StopReason::BudgetExhausted)
            }
        }
    }

    /// Ends the operation at `now`: the report, the span's fields, the
    /// counters.
    pub(crate) fn finish(&mut self, reason: StopReason, now: Instant) -> RetryReport {
        let mut report = std::mem::replace(&mut self.report, RetryReport::new());
        report.stop_reason = reason;
        crate::propagation::note_stop(reason, self.attempt);
        report.elapsed = now.saturating_duration_since(self.started);
        if self.traced {
            let span = tracing::Span::current();
            span.record("http.request.resend_count", self.attempt.saturating_sub(1));
            span.record("stop_reason", reason.as_str());
        }
        self.policy
            .metrics
            .call_finished(self.attempt, reason == StopReason::Success);
        report
    }
}
