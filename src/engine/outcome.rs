//! What one attempt came to, as the loop reads it: the caller's
//! [`Outcome`], the verdict on it, what the answer said of its host's rate,
//! and the [`AttemptContext`] the attempt was made with; what the loop does
//! next; and how it tells tracing (a span per operation, an event per
//! attempt, made only where someone may listen).

use std::fmt;
use std::time::Duration;

use crate::decisions::{AttemptRecord, AttemptResult, RetryKind};
use crate::signals::rate_limit::RateLimit;
use crate::vocabulary::StopReason;

/// An operation's outcome, classified by the caller.
#[derive(Debug)]
pub struct Outcome<T> {
    pub(super) value: T,
    pub(super) verdict: Verdict,
    pub(super) signal: Signal,
}

/// What an answer says about its host's rate, whatever its verdict.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub(crate) struct Signal {
    /// A throttling answer: 429, or 503 with Retry-After.
    pub(crate) throttled: bool,
    /// A 429: the requests came too fast.
    pub(crate) too_fast: bool,
    /// The server's Retry-After, when throttled.
    pub(crate) retry_after: Option<Duration>,
    /// The rate-limit fields it carried.
    pub(crate) rate_limit: Option<RateLimit>,
    /// The failure was one replica's: another address of the host is
    /// healthy, and the next attempt goes there.
    pub(crate) elsewhere: Option<Elsewhere>,
}

/// How the next attempt goes to another replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Elsewhere {
    /// At once: the connection failed (reset, refused, closed before an
    /// answer); the other machine has no reason to be slow.
    AtOnce,
    /// After the usual backoff: the replica answered (a 5xx) or hung.
    AfterBackoff,
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
    /// What the circuit breaker hears of this answer, whose `verdict`
    /// counts as `result`: whether the host accepted it, or `None`. A 429
    /// says "too fast" for a route and a caller: the pacing's evidence,
    /// not the host's failure, so one route over its limit opens no
    /// breaker for the others. A "do not retry" on it still counts, as
    /// every such failure does.
    pub(crate) fn for_breaker(self, verdict: Verdict, result: AttemptResult) -> Option<bool> {
        let too_fast = self.too_fast && matches!(verdict, Verdict::Transient { .. });
        (!too_fast).then_some(result != AttemptResult::Failure)
    }

    /// `record` with what the answer said of its host's rate;
    /// `count_throttled` is called for a throttling answer. A hold longer than `max_hold` (the policy's
    /// `max_retry_after`) is refused, and holds nothing: neither a
    /// Retry-After nor a spent quota whose reset is that far.
    pub(crate) fn onto(
        self,
        mut record: AttemptRecord,
        count_throttled: impl FnOnce(),
        max_hold: Duration,
    ) -> AttemptRecord {
        let accepted = |d: &Duration| *d <= max_hold;
        if self.throttled {
            count_throttled();
            record = record.throttled(self.retry_after.filter(accepted));
            if self.too_fast {
                record = record.too_fast();
            }
        }
        if let Some(mut rate_limit) = self.rate_limit {
            if rate_limit.exhausted() && rate_limit.reset.is_some_and(|r| !accepted(&r)) {
                // A spent quota the policy will not wait for says nothing
                // it can act on.
                rate_limit.remaining = None;
                rate_limit.reset = None;
            }
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

    /// The same outcome, its value mapped by `f`.
    pub(crate) fn map<U>(self, f: impl FnOnce(T) -> U) -> Outcome<U> {
        Outcome {
            value: f(self.value),
            verdict: self.verdict,
            signal: self.signal,
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
            self.signal.too_fast = true;
            self.signal.retry_after = retry_after;
        }
        self.with_kind(RetryKind::Throttled)
    }

    /// The server's rate-limit fields (see [`crate::pacing::rate_limit`]): a
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
    pub(super) attempt: u32,
    pub(super) timeout: Option<Duration>,
    pub(super) time_left: Option<Duration>,
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

/// The span of one logical operation; `Run::finish` records the retry
/// count and the stop reason into it.
pub(crate) fn operation_span() -> tracing::Span {
    tracing::info_span!(
        "retry",
        http.request.resend_count = tracing::field::Empty,
        stop_reason = tracing::field::Empty,
    )
}

/// Whether anyone may listen to a span or an event: a subscriber has been
/// set (tracing's own test for eliding trace points, what its macros expand
/// to), or a logger would print one (tracing's `log` feature).
pub(crate) fn listened() -> bool {
    tracing::dispatcher::has_been_set() || log::log_enabled!(log::Level::Info)
}

/// One event per attempt: number, status or error kind, class, chosen delay,
/// and the reason when it is the last (the OpenTelemetry count as `i64`, see `Run::finish`).
pub(crate) fn trace_attempt(
    attempt: u32,
    outcome: &dyn fmt::Display,
    verdict: Verdict,
    step: Step,
) {
    let (delay_ms, stop_reason) = match step {
        Step::Retry(d, _) => (u64::try_from(d.as_millis()).unwrap_or(u64::MAX), ""),
        Step::Stop(r) => (0, r.as_str()),
    };
    tracing::info!(
        attempt,
        http.request.resend_count = i64::from(attempt - 1),
        %outcome,
        class = verdict.class_name(),
        delay_ms,
        stop_reason,
        "attempt finished"
    );
}

/// What to do after an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// Sleep this long, then ask admission for a retry of this kind.
    Retry(Duration, RetryKind),
    Stop(StopReason),
}
