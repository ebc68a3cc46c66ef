//! The run's questions to admission: before a retry is sent, and before a
//! first attempt to a paced host. Each waits, bounded by the deadline.

use std::time::{Duration, Instant};

use crate::decisions::{Admission, AttemptRecord, AttemptResult, RetryKind, RetryRequest};
use crate::vocabulary::StopReason;

use super::run::Run;

/// What one question to admission came to.
enum Asked {
    /// Send the retry now.
    Admitted(Instant),
    /// Sleep this long and ask again.
    Wait(Duration),
    Stop(StopReason),
}

impl Run<'_> {
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
    pub(super) async fn admit(&mut self, kind: RetryKind) -> Result<Instant, StopReason> {
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

    /// Waits `wait`, and then for as long as the partition stays paced
    /// ([`Run::first_wait`]): returns when the first attempt begins.
    pub(super) async fn admit_first(&mut self, mut wait: Duration) -> Instant {
        loop {
            self.policy.sleeper.sleep(wait).await;
            let now = self.policy.clock.now();
            match self.first_wait(now) {
                Some(next) => wait = next,
                None => return now,
            }
        }
    }

    /// How long the first attempt waits, asked at `now`, while the
    /// partition is paced (it throttled, or its quota is spent); `None`
    /// when it begins now. It never waits past the deadline's last attempt
    /// window, nor once the admission stops answering "wait": then it goes
    /// at once and the server answers. A plain function: the usual answer,
    /// go, makes no future.
    pub(super) fn first_wait(&mut self, now: Instant) -> Option<Duration> {
        let policy = self.policy;
        let partition = self.report.partition;
        // Nothing waited yet on the first pass, the usual one: no clock
        // arithmetic for it.
        let waited = if now == self.started {
            Duration::ZERO
        } else {
            now.saturating_duration_since(self.started)
        };
        let wait = match policy.admission.admit_first(
            partition,
            self.route,
            policy.settings.pace_first_attempts,
            waited,
            now,
        ) {
            Admission::Paced(wait) | Admission::Wait(wait) => wait,
            Admission::Admit(grant) => {
                if grant.is_paced() {
                    self.grant = Some(grant);
                }
                return None;
            }
            _ => return None,
        };
        let room = match self.time_left(now) {
            Some(left) => left.saturating_sub(policy.settings.min_attempt_window),
            None => wait,
        };
        let wait = wait.min(room);
        if wait.is_zero() {
            return None;
        }
        if waited.is_zero() {
            policy.metrics.waited_for_rate_limit(self.host());
        }
        self.report.rate_limit_wait += wait;
        Some(wait)
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
                policy.metrics.deadline_gave_up(self.host());
                return Asked::Stop(StopReason::Deadline);
            }
            policy.metrics.budget_rejected(self.host());
            return Asked::Stop(StopReason::BudgetExhausted);
        }
        let last = self.attempt.saturating_add(1) >= self.limits.max_attempts;
        let request = RetryRequest::new(kind, waited)
            .on_route(self.route)
            .last_attempt(last);
        let answer = policy.admission.admit(self.report.partition, request, now);
        if let Admission::Paced(wait) = answer {
            let left = left.map_or(wait, |left| left.saturating_sub(window));
            let wait = wait.min(left);
            if wait.is_zero() {
                policy.metrics.budget_rejected(self.host());
                return Asked::Stop(StopReason::BudgetExhausted);
            }
            if !self.pacing {
                self.pacing = true;
                policy.metrics.waited_for_rate_limit(self.host());
            }
            self.report.rate_limit_wait += wait;
            return Asked::Wait(wait);
        }
        match answer {
            Admission::Admit(grant) => {
                self.grant = Some(grant);
                self.pacing = false;
                self.report.admission_wait += waited;
                policy.metrics.admitted(self.host(), grant.is_probe());
                policy.metrics.retried(self.host(), self.by_hint);
                if self.by_hint {
                    self.report.retry_after_honoured += 1;
                }
                Asked::Admitted(now)
            }
            Admission::Wait(wait) => {
                if waited.is_zero() {
                    policy.metrics.waited(self.host());
                }
                // The last look happens when exactly one attempt window is
                // left.
                let wait = match left {
                    Some(left) => wait.min(left.saturating_sub(window)),
                    None => wait,
                };
                if wait.is_zero() {
                    policy.metrics.budget_rejected(self.host());
                    return Asked::Stop(StopReason::BudgetExhausted);
                }
                Asked::Wait(wait)
            }
            _ => {
                policy.metrics.budget_rejected(self.host());
                Asked::Stop(StopReason::BudgetExhausted)
            }
        }
    }
}

/// An attempt sent under admission's grant, told to admission if its
/// caller drops the call before the attempt ends (a timeout around the
/// call, `select!`): as [`AttemptResult::Other`], no evidence either way,
/// so that the place it was given (a paced release in flight, the host's
/// one probe) is freed at once, not when a lease runs out.
pub(super) struct Abandoned<'r, 'p>(&'r Run<'p>);

impl<'p> Run<'p> {
    /// The guard of the attempt about to be sent; `None` for one sent
    /// under no grant (a first attempt that was not paced).
    pub(super) fn abandoned(&self) -> Option<Abandoned<'_, 'p>> {
        self.grant.is_some().then(|| Abandoned(self))
    }

    /// The attempt `guard` watched ended, and is recorded as usual:
    /// nothing to tell.
    pub(super) fn attempt_ended(guard: Option<Abandoned<'_, 'p>>) {
        std::mem::forget(guard);
    }
}

impl Drop for Abandoned<'_, '_> {
    fn drop(&mut self) {
        let run = self.0;
        let record =
            AttemptRecord::new(run.attempt, run.grant, AttemptResult::Other).on_route(run.route);
        let now = run.policy.clock.now();
        run.policy
            .admission
            .record(run.report.partition, record, now);
    }
}
