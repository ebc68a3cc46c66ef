//! The adaptive admission's pacing, per route: what an answer says about
//! its route's rate, and a paced route's answer.

use std::sync::atomic::Ordering;
use std::time::Instant;

use crate::vocabulary::{Partition, Route};

use super::super::pacing::Pace;
use super::super::{Admission, AttemptRecord, AttemptResult, Grant, GrantSource};
use super::{AdaptiveAdmission, Host};

/// The most routes of one host paced at once: past it, the route calm the
/// longest makes room (a host whose every object id is its own path must
/// not grow the table without bound).
const MAX_PACED_ROUTES: usize = 64;

impl AdaptiveAdmission {
    /// The rate, requests per second, at which a paced route's requests
    /// are released; `None` when the route is not paced.
    pub fn pace_rate(&self, partition: Partition, route: Route) -> Option<f64> {
        self.hosts
            .peek(partition, |h| {
                h.paces
                    .as_ref()?
                    .0
                    .iter()
                    .find(|(r, _)| *r == route)
                    .map(|(_, p)| p.rate())
            })
            .flatten()
    }

    /// The pacing of a host's route at `now`; the host's pacings that have
    /// ended are dropped first.
    pub(super) fn pace<'h>(
        &self,
        h: &'h mut Host,
        route: Route,
        now: Instant,
    ) -> Option<&'h mut Pace> {
        let paces = &mut h.paces.as_mut()?.0;
        let before = paces.len();
        paces.retain(|(_, p)| !p.ended(now));
        self.paced
            .fetch_sub(before - paces.len(), Ordering::Relaxed);
        if paces.is_empty() {
            h.paces = None; // give the memory back
            return None;
        }
        h.paces
            .as_mut()?
            .0
            .iter_mut()
            .find(|(r, _)| *r == route)
            .map(|(_, p)| p)
    }

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
        let exhausted = attempt.rate_limit().filter(|r| r.exhausted());
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
        self.host(partition, now, |h| {
            // Pacings that have ended are dropped here too, so that a
            // host's successes stop taking this lock once it is calm.
            if self.pace(h, route, now).is_none() {
                // Only the server's word about the rate starts a pacing.
                if !attempt.was_too_fast() && exhausted.is_none() {
                    return;
                }
                let paces = &mut h.paces.get_or_insert_with(Box::default).0;
                if paces.len() >= MAX_PACED_ROUTES {
                    // The route calm the longest makes room.
                    if let Some(i) = (0..paces.len()).min_by_key(|i| paces[*i].1.quiet_since()) {
                        paces.swap_remove(i);
                        self.paced.fetch_sub(1, Ordering::Relaxed);
                    }
                }
                paces.push((route, Pace::begin(now, quota_rate, max_rate)));
                self.paced.fetch_add(1, Ordering::Relaxed);
            }
            let Some(pace) = self.pace(h, route, now) else {
                return;
            };
            if let Some(reset) = exhausted.and_then(|r| r.reset) {
                pace.hold(now, reset);
            }
            if attempt.was_throttled() {
                pace.throttled(now, released, attempt.was_too_fast(), attempt.retry_after());
            } else if success {
                pace.succeeded(now, released);
            }
        });
    }
}
