//! The adaptive admission's answers: a first attempt counted, a retry
//! admitted, paced, told to wait or refused, an attempt's result learnt;
//! and its pacing: what an answer says about its route's rate, and a
//! paced route's answer.
//!
//! Whose limit a throttling answer speaks of, and which routes a limit
//! wider than one holds: the `scope` module.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::vocabulary::{Partition, Route};

use super::super::pacing::Pace;
use super::super::{
    Admission, AttemptRecord, AttemptResult, FirstAttemptPacing, Grant, GrantSource,
    RetryAdmission, RetryKind, RetryRequest,
};
use super::{after, AdaptiveAdmission, Due, Host, WAITER_STALE_POLLS};

/// The longest a probe whose caller never reported holds its host's one
/// probe slot.
const PROBE_LEASE: Duration = Duration::from_secs(30);

impl RetryAdmission for AdaptiveAdmission {
    fn first_attempt(&self, partition: Partition, now: Instant) {
        self.host(partition, now, |h| {
            h.deposits = h.deposits.saturating_add(1)
        });
    }

    fn admit(&self, partition: Partition, retry: RetryRequest, now: Instant) -> Admission {
        let c = &self.config;
        let arrival = now.checked_sub(retry.waited()).unwrap_or(now);
        let stale = c.poll_interval.saturating_mul(WAITER_STALE_POLLS);
        self.host(partition, now, |h| {
            if retry.kind() == RetryKind::Hedge {
                let paced = self
                    .pace(h, retry.route(), now)
                    .is_some_and(|p| p.governs(now));
                return Self::admit_hedge(h, c, paced, now, stale);
            }
            // A paced route's retries go out at its rate, not the budget's.
            if let Some(pace) = self.pace(h, retry.route(), now).filter(|p| p.governs(now)) {
                return Self::release(pace, now, retry.is_last_attempt());
            }
            h.deposit(c);
            h.refill(now, c.poll_interval);
            h.prune_waiters(now, stale);
            // The floor rate starts when the bucket runs dry, each time it
            // does: a bucket with tokens again (the host recovered, and
            // first attempts refilled it) disarms the probe, so the next
            // dry spell's first probe also waits its interval.
            let dry = h.tokens < c.retry_cost && h.allowance < 1.0;
            if h.tokens >= c.retry_cost {
                h.next_probe = Due::Unarmed;
            } else if dry && h.next_probe == Due::Unarmed {
                h.next_probe = after(now, h.probe_interval);
            }
            // A probe presumed lost (never reported: the engine reports
            // one whose call is dropped, another caller may not) frees its
            // place after the longest wait, at most PROBE_LEASE (an
            // unbounded wait must not stop probing for good), and never
            // before the probe interval.
            let lease = c.max_admission_wait.min(PROBE_LEASE).max(h.probe_interval);
            let in_flight = h
                .probe_in_flight
                .is_some_and(|sent| now.saturating_duration_since(sent) < lease);
            let probe_due = !in_flight && matches!(h.next_probe, Due::At(due) if now >= due);
            // What could go now, and how many earlier waiters still asking
            // are ahead: with `k` retries' worth available, the first `k`
            // in line may go, so order holds to within one poll interval
            // without a release waiting for one waiter's turn to ask.
            // Casts saturate; only a count up to `available` matters.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let available = ((h.tokens / c.retry_cost).floor() as usize)
                .saturating_add(h.allowance.floor() as usize)
                .saturating_add(usize::from(probe_due));
            let ahead = h.waiters.range(..arrival).take(available).count();
            let grant = if ahead >= available {
                None
            } else if h.tokens >= c.retry_cost {
                h.tokens -= c.retry_cost;
                Some(Grant::new(GrantSource::Token, c.retry_cost))
            } else if h.allowance >= 1.0 {
                h.allowance -= 1.0;
                Some(Grant::new(GrantSource::Released, 0.0))
            } else {
                h.probe_in_flight = Some(now);
                h.next_probe = after(now, h.probe_interval);
                Some(Grant::new(GrantSource::Probe, 0.0))
            };
            if let Some(grant) = grant {
                h.waiters.remove(&arrival);
                return Admission::Admit(grant);
            }
            let left = c.max_admission_wait.saturating_sub(retry.waited());
            if left.is_zero() {
                h.waiters.remove(&arrival);
                return Admission::Refuse;
            }
            // A retry holds its place in line from its second ask: the first
            // may be a one-off question.
            if !retry.waited().is_zero() {
                h.waiters.insert(arrival, now);
            }
            let mut wait = c.poll_interval.min(left);
            if let Due::At(due) = h.next_probe {
                if due > now {
                    wait = wait.min(due - now);
                }
            }
            let rate = h.rate(now);
            if rate > 0.0 {
                // Until the next released retry, at least 1 ms.
                let next = Duration::try_from_secs_f64((1.0 - h.allowance) / rate)
                    .unwrap_or(Duration::MAX);
                wait = wait.min(next.max(Duration::from_millis(1)));
            }
            Admission::Wait(wait)
        })
    }

    fn admit_first(
        &self,
        partition: Partition,
        route: Route,
        pacing: FirstAttemptPacing,
        waited: Duration,
        now: Instant,
    ) -> Admission {
        let go = Admission::Admit(Grant::new(GrantSource::Free, 0.0));
        if self.paced.load(Ordering::Relaxed) == 0 {
            return go;
        }
        self.host(partition, now, |h| {
            // Only a quota reported spent to this route holds its calls.
            let own_quota = h.paces.as_ref().is_none_or(|p| p.own_quota(route));
            match self.pace(h, route, now) {
                // A call already held keeps its place in the queue, so the
                // queue behind a reset goes out at the rate, not as one wave.
                Some(pace)
                    if pace.governs(now)
                        && (pacing == FirstAttemptPacing::Always
                            || !waited.is_zero()
                            || (own_quota && pace.quota_spent(now))) =>
                {
                    Self::release(pace, now, false)
                }
                _ => go,
            }
        })
    }

    fn record(&self, partition: Partition, attempt: AttemptRecord, now: Instant) {
        let c = &self.config;
        self.learn(partition, &attempt, now);
        if attempt.grant().is_some_and(|g| g.is_paced()) {
            // A paced release says nothing about an outage.
            return;
        }
        if attempt
            .grant()
            .is_some_and(|g| g.source() == GrantSource::Hedge)
        {
            // Nor does a hedge: its answer is not a retry's, so it neither
            // raises the release rate (a healthy host's hedges would let an
            // outage's retries out fast) nor halves it.
            return;
        }
        match (attempt.result(), attempt.grant()) {
            (AttemptResult::Success, Some(grant)) => self.host(partition, now, |h| {
                // Slow start: successes per second grow with the rate, so
                // the rate grows exponentially while retries succeed.
                h.refill(now, c.poll_interval);
                h.settle_rate(now);
                h.rate = (h.rate + c.release_step).min(c.max_release_rate);
                h.evidence = Some(h.evidence.map_or(now, |e| e.max(now)));
                self.set_probe_interval(h, c.probe_interval);
                if grant.is_probe() {
                    h.probe_in_flight = None;
                }
            }),
            // The host answers again: probe at once rather than at the end
            // of a backed-off interval. While no host is backed off (the
            // usual case), a first attempt's success takes no lock.
            (AttemptResult::Success, None) if self.backed_off.load(Ordering::Relaxed) > 0 => {
                self.host(partition, now, |h| {
                    if h.probe_interval > c.probe_interval {
                        self.set_probe_interval(h, c.probe_interval);
                        h.next_probe = Due::At(now);
                    }
                });
            }
            (AttemptResult::Failure, Some(grant)) => self.host(partition, now, |h| {
                // Collapse: each failed retry halves the release rate; below
                // one retry per second only probes remain.
                h.refill(now, c.poll_interval);
                h.settle_rate(now);
                h.rate /= 2.0;
                if h.rate < 1.0 {
                    h.rate = 0.0;
                    h.allowance = 0.0;
                }
                if grant.is_probe() {
                    h.probe_in_flight = None;
                    let interval = h.probe_interval.saturating_mul(2).min(c.max_probe_interval);
                    self.set_probe_interval(h, interval);
                    h.next_probe = after(now, interval);
                }
            }),
            (AttemptResult::Other, Some(grant)) if grant.is_probe() => {
                self.host(partition, now, |h| h.probe_in_flight = None);
            }
            _ => {}
        }
    }
}

impl AdaptiveAdmission {
    /// A paced host's answer. The wait is bounded by the request's
    /// deadline, not by `max_admission_wait`: a host that admits five
    /// requests a second takes forty seconds for two hundred, and each
    /// of them is worth its wait. A call's last attempt goes out only at a
    /// rate that worked (`Pace::release_last`).
    pub(super) fn release(pace: &mut Pace, now: Instant, last: bool) -> Admission {
        let released = if last {
            pace.release_last(now)
        } else {
            pace.release(now)
        };
        match released {
            Ok(()) => Admission::Admit(Grant::new(GrantSource::Paced, 0.0)),
            Err(wait) => Admission::Paced(wait),
        }
    }

    /// What an answer says about its route's rate: throttling, a spent
    /// quota, a success while paced.
    pub(super) fn learn(&self, partition: Partition, attempt: &AttemptRecord, now: Instant) {
        // A spent quota says something only with a reset to hold until:
        // one with none, or one that is no time (epoch milliseconds), holds
        // nothing; the route's next 429, if it comes, speaks for itself.
        let exhausted = attempt
            .rate_limit()
            .filter(|r| r.exhausted() && r.reset.is_some());
        let success = attempt.result() == AttemptResult::Success;
        let released = attempt.grant().is_some_and(|g| g.is_paced());
        // A release is answered whatever its answer: a pace counts the
        // releases in flight.
        if !attempt.was_throttled()
            && exhausted.is_none()
            && !((success || released) && self.paced.load(Ordering::Relaxed) > 0)
        {
            return;
        }
        let quota_rate = attempt.rate_limit().and_then(|r| r.quota_rate());
        let max_rate = self.config.max_release_rate;
        let route = attempt.route();
        let throttling = attempt.was_too_fast() || exhausted.is_some();
        let policy = attempt.rate_limit().and_then(|r| r.policy_id());
        let spent = exhausted.is_some();
        // The answer's hint, if it holds a pacing: a 429's Retry-After.
        let hint = attempt.retry_after().filter(|_| attempt.was_too_fast());
        self.host(partition, now, |h| {
            if let Some(paces) = h.paces.as_mut().filter(|_| success) {
                // A success: throttling so far proves no wider limit.
                paces.no_wider();
            }
            // A route that throttled for the owner of a wider limit joins
            // it; its request was not sent under that limit's slot.
            let joined = throttling
                && !success
                && h.paces
                    .as_mut()
                    .is_some_and(|p| p.join(route, policy, spent));
            // Pacings that have ended are dropped here too, so that a
            // host's successes stop taking this lock once it is calm.
            if self.pace(h, route, now).is_none() {
                // Only the server's word about the rate starts a pacing.
                if !throttling {
                    return;
                }
                self.begin_route(h, route, Pace::begin(now, quota_rate, max_rate));
            }
            // A pacing just widened to the host sent none of its requests.
            // A success is no evidence of a wider limit, even one that
            // says its route's quota is spent.
            let widened = throttling
                && !success
                && h.paces.as_mut().is_some_and(|p| {
                    p.widen(
                        (route, policy, spent),
                        (Pace::begin(now, quota_rate, max_rate), hint),
                        now,
                    )
                });
            if widened {
                self.paced.fetch_add(1, Ordering::Relaxed);
            }
            let released = released && !widened && !joined;
            let Some(pace) = self.pace(h, route, now) else {
                return;
            };
            if let Some(reset) = exhausted.and_then(|r| r.reset) {
                pace.hold_spent_quota(now, reset);
            }
            if attempt.was_throttled() {
                pace.throttled(now, released, attempt.was_too_fast(), attempt.retry_after());
            } else if success {
                pace.succeeded(now, released);
            } else if released {
                pace.answered();
            }
        });
    }
}

impl AdaptiveAdmission {
    /// The rate, requests per second, at which a paced route's requests
    /// are released (the wider limit's, while the route is held by one:
    /// the `scope` module); `None` when the route is not paced.
    pub fn pace_rate(&self, partition: Partition, route: Route) -> Option<f64> {
        self.hosts
            .peek(partition, |h| h.paces.as_ref()?.rate_for(route))
            .flatten()
    }

    /// Whether some of the host's routes are paced as one (a limit wider
    /// than a route).
    pub fn paced_as_one(&self, partition: Partition) -> bool {
        self.hosts
            .peek(partition, |h| {
                h.paces.as_ref().is_some_and(|p| p.has_wide())
            })
            .unwrap_or(false)
    }

    /// The pacing that decides for a host's route at `now`: the wider
    /// limit's, when the route met it, else the route's own; the pacings
    /// that have ended are dropped first.
    pub(super) fn pace<'h>(
        &self,
        h: &'h mut Host,
        route: Route,
        now: Instant,
    ) -> Option<&'h mut Pace> {
        let paces = h.paces.as_mut()?;
        let dropped = paces.prune(now);
        self.paced.fetch_sub(dropped, Ordering::Relaxed);
        if paces.count() == 0 {
            h.paces = None; // give the memory back
            return None;
        }
        h.paces.as_mut()?.decide(route)
    }

    /// Starts pacing a route.
    pub(super) fn begin_route(&self, h: &mut Host, route: Route, pace: Pace) {
        let paces = h.paces.get_or_insert_with(Box::default);
        if !paces.begin_route(route, pace) {
            self.paced.fetch_add(1, Ordering::Relaxed);
        }
    }
}
