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
//! → budget → sleep → next. The budget comes last so that a token is spent
//! only on a retry that really happens.

use std::future::Future;
use std::time::{Duration, Instant};

use tracing::Instrument;

use crate::policy::RetryPolicy;
use crate::report::{RetryReport, StopReason};
use crate::retry_after;

/// An operation's outcome, classified by the caller.
#[derive(Debug)]
pub struct Outcome<T> {
    value: T,
    verdict: Verdict,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Verdict {
    Success,
    Transient {
        retry_after: Option<Duration>,
        timed_out: bool,
    },
    Stop(StopReason),
}

impl Verdict {
    /// What the classifier said, for the per-attempt event: a transient
    /// outcome that the safety rule stopped is still "transient".
    pub(crate) fn class_name(self) -> &'static str {
        match self {
            Verdict::Success => "success",
            Verdict::Transient { .. }
            | Verdict::Stop(StopReason::NotIdempotent | StopReason::BodyNotCloneable) => {
                "transient"
            }
            Verdict::Stop(StopReason::Permanent | StopReason::ServerSaidNo) => "permanent",
            Verdict::Stop(_) => "stopped",
        }
    }
}

impl<T> Outcome<T> {
    /// Done: return `value`.
    pub fn success(value: T) -> Self {
        Outcome {
            value,
            verdict: Verdict::Success,
        }
    }

    /// Worth another attempt; `value` is returned if none is made.
    pub fn transient(value: T) -> Self {
        Outcome {
            value,
            verdict: Verdict::Transient {
                retry_after: None,
                timed_out: false,
            },
        }
    }

    /// Retrying cannot help: return `value` now.
    pub fn permanent(value: T) -> Self {
        Outcome::stop(value, StopReason::Permanent)
    }

    /// Stop now for the given reason.
    pub fn stop(value: T, reason: StopReason) -> Self {
        Outcome {
            value,
            verdict: Verdict::Stop(reason),
        }
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
    pub fn timed_out(mut self) -> Self {
        if let Verdict::Transient { timed_out, .. } = &mut self.verdict {
            *timed_out = true;
        }
        self
    }

    pub(crate) fn verdict(&self) -> Verdict {
        self.verdict
    }

    pub(crate) fn into_value(self) -> T {
        self.value
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
/// deposits into the policy's budget once.
pub async fn retry<T, F, Fut>(policy: &RetryPolicy, mut op: F) -> (T, RetryReport)
where
    F: FnMut(AttemptContext) -> Fut,
    Fut: Future<Output = Outcome<T>>,
{
    let span = operation_span();
    async move {
        let mut run = Run::start(policy, Limits::from(policy));
        loop {
            let ctx = run.context();
            let outcome = op(ctx).await;
            let step = run.decide(outcome.verdict());
            trace_attempt(&ctx, &"-", outcome.verdict(), step);
            match step {
                Step::Stop(reason) => return (outcome.into_value(), run.finish(reason)),
                Step::Retry(delay) => run.sleep(delay).await,
            }
        }
    }
    .instrument(span)
    .await
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
pub(crate) fn trace_attempt(
    ctx: &AttemptContext,
    outcome: &dyn std::fmt::Display,
    verdict: Verdict,
    step: Step,
) {
    let (delay_ms, stop_reason) = match step {
        Step::Retry(d) => (u64::try_from(d.as_millis()).unwrap_or(u64::MAX), ""),
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
    Retry(Duration),
    Stop(StopReason),
}

/// The state of one logical operation.
pub(crate) struct Run<'p> {
    policy: &'p RetryPolicy,
    limits: Limits,
    deadline: Option<Instant>,
    attempt: u32,
    prev_delay: Duration,
    pub(crate) report: RetryReport,
}

impl<'p> Run<'p> {
    pub(crate) fn start(policy: &'p RetryPolicy, limits: Limits) -> Self {
        policy.metrics.call_started();
        if let Some(budget) = &policy.budget {
            budget.deposit();
        }
        let now = policy.clock.now();
        Run {
            policy,
            limits,
            // An instant too far to represent is no deadline at all.
            deadline: limits.deadline.and_then(|d| now.checked_add(d)),
            attempt: 0,
            prev_delay: policy.settings.backoff.base(),
            report: RetryReport::new(),
        }
    }

    /// Begins the next attempt.
    pub(crate) fn context(&mut self) -> AttemptContext {
        self.attempt += 1;
        self.report.attempts = self.attempt;
        let time_left = self.time_left();
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

    fn time_left(&self) -> Option<Duration> {
        self.deadline
            .map(|d| d.saturating_duration_since(self.policy.clock.now()))
    }

    /// Decides, after an attempt, whether and how long to wait for the next.
    pub(crate) fn decide(&mut self, verdict: Verdict) -> Step {
        if self.attempt == 1 && verdict != Verdict::Success {
            self.policy.metrics.first_attempt_failed();
        }
        let (hint, timed_out) = match verdict {
            Verdict::Success => return Step::Stop(StopReason::Success),
            Verdict::Stop(reason) => return Step::Stop(reason),
            Verdict::Transient {
                retry_after,
                timed_out,
            } => (retry_after, timed_out),
        };
        if self.attempt >= self.limits.max_attempts {
            return Step::Stop(StopReason::AttemptsExhausted);
        }
        let settings = &self.policy.settings;
        let n = self.attempt - 1;
        let (computed, delay) = self.policy.with_rng(|rng| {
            let computed = settings.backoff.delay(n, self.prev_delay, rng);
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
        if let Some(left) = self.time_left() {
            let needed = delay.saturating_add(settings.min_attempt_window);
            if needed > left {
                self.policy.metrics.deadline_gave_up();
                let hint_alone_fits =
                    hint.is_none_or(|h| h.saturating_add(settings.min_attempt_window) <= left);
                return Step::Stop(if hint_alone_fits {
                    StopReason::Deadline
                } else {
                    StopReason::RetryAfterTooLong
                });
            }
        }
        if let Some(budget) = &self.policy.budget {
            let paid = if timed_out {
                budget.try_withdraw_timeout()
            } else {
                budget.try_withdraw_retry()
            };
            if !paid {
                self.policy.metrics.budget_rejected();
                return Step::Stop(StopReason::BudgetExhausted);
            }
        }
        let by_hint = delay > computed;
        self.policy.metrics.retried(by_hint);
        if by_hint {
            self.report.retry_after_honoured += 1;
        }
        self.prev_delay = delay;
        Step::Retry(delay)
    }

    pub(crate) async fn sleep(&mut self, delay: Duration) {
        self.report.delays.push(delay);
        self.policy.sleeper.sleep(delay).await;
    }

    pub(crate) fn finish(mut self, reason: StopReason) -> RetryReport {
        self.report.stop_reason = reason;
        let span = tracing::Span::current();
        span.record("http.request.resend_count", self.attempt.saturating_sub(1));
        span.record("stop_reason", reason.as_str());
        self.policy
            .metrics
            .call_finished(self.attempt, reason == StopReason::Success);
        self.report
    }
}
