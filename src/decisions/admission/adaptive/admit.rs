//! The adaptive admission's answers: a first attempt counted, a retry
//! admitted, paced, told to wait or refused, an attempt's result learnt;
//! and its pacing: what an answer says about its route's rate, and a
//! paced route's answer.
//!
//! # The scope of a limit, learnt from the evidence
//!
//! Pacing starts per [`Route`]: a throttling answer proves something about
//! its path. Most public APIs, though, limit an account or a token across
//! every endpoint; each route paced as if alone sends its share at the
//! whole limit's rate, and the retries of twenty routes come back together
//! when their Retry-After ends. Throttling answers (429s, spent quotas)
//! from [`WIDER_AFTER`] routes within [`SCOPE_WINDOW`], no success on the
//! host since, prove a wider limit: the host is paced as one, for every
//! route, until calm (the pacing's `CALM`); then routes are paced on their
//! own again. One route throttled while others succeed paces it alone.

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
                return Self::release(pace, now);
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
            // A probe presumed lost (its caller dropped it before it
            // reported) frees its place after the longest wait, at most
            // PROBE_LEASE (an unbounded wait must not stop probing for
            // good), and never before the probe interval.
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
        self.host(partition, now, |h| match self.pace(h, route, now) {
            // A call already held keeps its place in the queue, so the
            // queue behind a reset goes out at the rate, not as one wave.
            Some(pace)
                if pace.governs(now)
                    && (pacing == FirstAttemptPacing::Always
                        || !waited.is_zero()
                        || pace.quota_spent(now)) =>
            {
                Self::release(pace, now)
            }
            _ => go,
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
    /// of them is worth its wait.
    pub(super) fn release(pace: &mut Pace, now: Instant) -> Admission {
        match pace.release(now) {
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
        if !attempt.was_throttled()
            && exhausted.is_none()
            && !(success && self.paced.load(Ordering::Relaxed) > 0)
        {
            return;
        }
        let released = attempt.grant().is_some_and(|g| g.is_paced());
        let quota_rate = attempt.rate_limit().and_then(|r| r.quota_rate());
        let max_rate = self.config.max_release_rate;
        let route = attempt.route();
        let throttling = attempt.was_too_fast() || exhausted.is_some();
        // The answer's hint, if it holds a pacing: a 429's Retry-After.
        let hint = attempt.retry_after().filter(|_| attempt.was_too_fast());
        self.host(partition, now, |h| {
            if success {
                self.no_wider(h);
            }
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
                && self.widen(
                    h,
                    route,
                    (Pace::begin(now, quota_rate, max_rate), hint),
                    now,
                );
            let released = released && !widened;
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
            }
        });
    }
}

/// The most routes of one host paced at once: past it, the route calm the
/// longest makes room (a host whose every object id is its own path must
/// not grow the table without bound).
const MAX_PACED_ROUTES: usize = 64;

/// Distinct routes throttled, none succeeding, that prove a limit wider
/// than a route.
const WIDER_AFTER: usize = 2;

/// How close together their throttling answers must be.
const SCOPE_WINDOW: Duration = Duration::from_secs(1);

/// A host's pacings (boxed once more, so that a host with none costs one
/// pointer).
#[derive(Debug, Default)]
pub(super) struct Paces {
    /// Per route, while a route throttles or its quota is spent.
    routes: Vec<(Route, Pace)>,
    /// The whole host's, once several routes were throttled together with
    /// none succeeding: it decides for every route while it lasts.
    host: Option<Pace>,
    /// Throttling answers since the host's last success: from which route
    /// and when (one entry per route, the latest).
    evidence: Vec<(Route, Instant)>,
}

impl AdaptiveAdmission {
    /// The rate, requests per second, at which a paced route's requests
    /// are released (the host's, while it is paced as one); `None` when
    /// the route is not paced.
    pub fn pace_rate(&self, partition: Partition, route: Route) -> Option<f64> {
        self.hosts
            .peek(partition, |h| {
                let paces = h.paces.as_ref()?;
                if let Some(host) = &paces.host {
                    return Some(host.rate());
                }
                paces
                    .routes
                    .iter()
                    .find(|(r, _)| *r == route)
                    .map(|(_, p)| p.rate())
            })
            .flatten()
    }

    /// Whether the host is paced as one (a limit wider than a route).
    pub fn paced_as_one(&self, partition: Partition) -> bool {
        self.hosts
            .peek(partition, |h| {
                h.paces.as_ref().is_some_and(|p| p.host.is_some())
            })
            .unwrap_or(false)
    }

    /// The pacing that decides for a host's route at `now`: the host's,
    /// while it is paced as one, else the route's; the pacings that have
    /// ended are dropped first.
    pub(super) fn pace<'h>(
        &self,
        h: &'h mut Host,
        route: Route,
        now: Instant,
    ) -> Option<&'h mut Pace> {
        let paces = h.paces.as_mut()?;
        let before = paces.routes.len() + usize::from(paces.host.is_some());
        paces.routes.retain(|(_, p)| !p.ended(now));
        if paces.host.as_ref().is_some_and(|p| p.ended(now)) {
            // Calm: narrowed back to the routes.
            paces.host = None;
        }
        let after = paces.routes.len() + usize::from(paces.host.is_some());
        self.paced.fetch_sub(before - after, Ordering::Relaxed);
        if after == 0 {
            h.paces = None; // give the memory back
            return None;
        }
        let paces = h.paces.as_mut()?;
        if let Some(host) = paces.host.as_mut() {
            return Some(host);
        }
        paces
            .routes
            .iter_mut()
            .find(|(r, _)| *r == route)
            .map(|(_, p)| p)
    }

    /// Starts pacing a route.
    pub(super) fn begin_route(&self, h: &mut Host, route: Route, pace: Pace) {
        let routes = &mut h.paces.get_or_insert_with(Box::default).routes;
        if routes.len() >= MAX_PACED_ROUTES {
            // The route calm the longest makes room.
            if let Some(i) = (0..routes.len()).min_by_key(|i| routes[*i].1.quiet_since()) {
                routes.swap_remove(i);
                self.paced.fetch_sub(1, Ordering::Relaxed);
            }
        }
        routes.push((route, pace));
        self.paced.fetch_add(1, Ordering::Relaxed);
    }

    /// A throttling answer from `route` at `now`, as evidence of the
    /// limit's scope: when it makes [`WIDER_AFTER`] routes throttled
    /// within [`SCOPE_WINDOW`] with none succeeding, the host is paced as
    /// one from `fresh`, held as long as the longest of its routes' holds
    /// and this answer's `hint`. Whether it was widened now.
    pub(super) fn widen(
        &self,
        h: &mut Host,
        route: Route,
        (fresh, hint): (Pace, Option<Duration>),
        now: Instant,
    ) -> bool {
        let Some(paces) = h.paces.as_mut() else {
            return false;
        };
        if paces.host.is_some() {
            return false;
        }
        let evidence = &mut paces.evidence;
        evidence
            .retain(|(r, at)| *r != route && now.saturating_duration_since(*at) <= SCOPE_WINDOW);
        evidence.push((route, now));
        if evidence.len() < WIDER_AFTER {
            return false;
        }
        let mut host = fresh;
        for (_, p) in &paces.routes {
            host.take_holds_of(p);
        }
        if let Some(hint) = hint {
            host.hold(now, hint);
        }
        paces.host = Some(host);
        paces.evidence.clear();
        self.paced.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// A success on the host: throttling so far proves no limit wider than
    /// a route.
    pub(super) fn no_wider(&self, h: &mut Host) {
        if let Some(paces) = h.paces.as_mut() {
            paces.evidence.clear();
        }
    }
}
