//! The scope of a limit: whose it is, learnt from the evidence, and which
//! routes a limit wider than one route holds.
//!
//! Pacing starts per [`Route`]: a throttling answer proves something about
//! its path, for its caller (a route is a path *for a credential*:
//! [`Route::for_caller`]). Most public APIs, though, limit an account or a
//! token across every endpoint; each route paced as if alone sends its
//! share at the whole limit's rate, and the retries of twenty routes come
//! back together when their Retry-After ends. Throttling answers (429s,
//! spent quotas) from [`WIDER_AFTER`] routes within [`SCOPE_WINDOW`], no
//! success on the host since, *of one owner*, prove a wider limit: those
//! routes are paced as one, until calm (the pacing's `CALM`).
//!
//! A limit belongs to whoever met it. Its owner is the caller (the
//! credential's digest) and the policy name the server gave it
//! (`RateLimit`'s member): answers of two callers, or of two differently
//! named policies, are two limits, never evidence of one. And the wider
//! pace holds only the routes that met it (its *members*): a route of the
//! host that throttled for that owner joins it with its answer; a route
//! that never did (an unlimited route succeeding beside the throttled
//! ones, another tenant's) is never held by it, so nothing waits that the
//! server did not refuse. A member's first attempts are held only by a
//! quota reported spent *to that member*: no route's reset is copied to
//! routes that never met it.

use std::time::{Duration, Instant};

use crate::vocabulary::Route;

use super::super::pacing::Pace;

/// The most routes of one host paced at once, and the most a wider pace
/// holds: past it, the route calm the longest makes room (a host whose
/// every object id is its own path must not grow the table without
/// bound); a route that finds the wider pace full is paced on its own.
const MAX_PACED_ROUTES: usize = 64;

/// Distinct routes throttled, none succeeding, that prove a limit wider
/// than a route.
const WIDER_AFTER: usize = 2;

/// How close together their throttling answers must be.
const SCOPE_WINDOW: Duration = Duration::from_secs(1);

/// Whose limit an answer speaks of: the caller's credential (its digest)
/// and the server's name for the policy, each when there is one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Owner {
    caller: Option<u64>,
    policy: Option<u64>,
}

impl Owner {
    /// The owner of a throttling answer on `route` that named `policy`.
    fn of(route: Route, policy: Option<u64>) -> Self {
        Owner {
            caller: route.caller(),
            policy,
        }
    }
}

/// A limit wider than a route: its owner's, its pace, and the routes that
/// met it, each with whether a spent quota was reported to it.
#[derive(Debug)]
struct Wide {
    owner: Owner,
    pace: Pace,
    members: Vec<(Route, bool)>,
}

/// A host's pacings (boxed once more, so that a host with none costs one
/// pointer).
#[derive(Debug, Default)]
pub(super) struct Paces {
    /// Per route, while a route throttles or its quota is spent.
    routes: Vec<(Route, Pace)>,
    /// One owner's limit across several routes, once several of its
    /// routes were throttled together with none succeeding: it decides
    /// for its members while it lasts.
    wide: Option<Wide>,
    /// Throttling answers since the host's last success: from which route,
    /// whose, and when (one entry per route, the latest).
    evidence: Vec<(Route, Owner, Instant)>,
}

impl Paces {
    /// Drops the pacings that have ended at `now` (a wider limit that has
    /// been calm narrows back to the routes); how many were dropped.
    pub(super) fn prune(&mut self, now: Instant) -> usize {
        let before = self.count();
        self.routes.retain(|(_, p)| !p.ended(now));
        if self.wide.as_ref().is_some_and(|w| w.pace.ended(now)) {
            self.wide = None;
        }
        before - self.count()
    }

    /// How many pacings there are: the routes', and the wider limit's.
    pub(super) fn count(&self) -> usize {
        self.routes.len() + usize::from(self.wide.is_some())
    }

    /// The pacing that decides for `route`: the wider limit's, when the
    /// route met it, else the route's own.
    pub(super) fn decide(&mut self, route: Route) -> Option<&mut Pace> {
        if let Some(wide) = self.wide.as_mut().filter(|w| w.holds(route)) {
            return Some(&mut wide.pace);
        }
        self.routes
            .iter_mut()
            .find(|(r, _)| *r == route)
            .map(|(_, p)| p)
    }

    /// The release rate for `route`, if a pacing decides for it.
    pub(super) fn rate_for(&self, route: Route) -> Option<f64> {
        if let Some(wide) = self.wide.as_ref().filter(|w| w.holds(route)) {
            return Some(wide.pace.rate());
        }
        self.routes
            .iter()
            .find(|(r, _)| *r == route)
            .map(|(_, p)| p.rate())
    }

    /// Whether some routes are paced as one.
    pub(super) fn has_wide(&self) -> bool {
        self.wide.is_some()
    }

    /// Whether a spent quota the route's pacing knows of was reported to
    /// the route itself: always for a route's own pacing; for a wider
    /// limit, only when that member was told so.
    pub(super) fn own_quota(&self, route: Route) -> bool {
        let Some(wide) = &self.wide else {
            return true;
        };
        wide.members
            .iter()
            .find(|(r, _)| *r == route)
            .is_none_or(|(_, spent)| *spent)
    }

    /// Starts pacing a route; whether a route calm the longest made room
    /// for it (past [`MAX_PACED_ROUTES`]).
    pub(super) fn begin_route(&mut self, route: Route, pace: Pace) -> bool {
        let routes = &mut self.routes;
        let mut evicted = false;
        if routes.len() >= MAX_PACED_ROUTES {
            if let Some(i) = (0..routes.len()).min_by_key(|i| routes[*i].1.quiet_since()) {
                routes.swap_remove(i);
                evicted = true;
            }
        }
        routes.push((route, pace));
        evicted
    }

    /// A throttling answer from `route` naming `policy`, `spent` when it
    /// said the quota is spent: the route joins the wider limit of the
    /// same owner, if there is one. Whether it joined now (its request
    /// was not sent under that limit's release slot).
    pub(super) fn join(&mut self, route: Route, policy: Option<u64>, spent: bool) -> bool {
        let Some(wide) = self.wide.as_mut() else {
            return false;
        };
        if let Some(member) = wide.members.iter_mut().find(|(r, _)| *r == route) {
            member.1 |= spent;
            return false;
        }
        if wide.owner != Owner::of(route, policy) || wide.members.len() >= MAX_PACED_ROUTES {
            return false;
        }
        wide.members.push((route, spent));
        true
    }

    /// A throttling answer from `route` naming `policy` at `now`, as
    /// evidence of the limit's scope: when it makes [`WIDER_AFTER`] routes
    /// of one owner throttled within [`SCOPE_WINDOW`] with none succeeding,
    /// those routes are paced as one from `fresh`, held as long as the
    /// longest of their holds and this answer's `hint`. Whether it was
    /// widened now.
    pub(super) fn widen(
        &mut self,
        (route, policy, spent): (Route, Option<u64>, bool),
        (fresh, hint): (Pace, Option<Duration>),
        now: Instant,
    ) -> bool {
        if self.wide.is_some() {
            // One wider limit at a time; another owner's routes are paced
            // each on its own meanwhile.
            return false;
        }
        let owner = Owner::of(route, policy);
        let evidence = &mut self.evidence;
        evidence
            .retain(|(r, _, at)| *r != route && now.saturating_duration_since(*at) <= SCOPE_WINDOW);
        evidence.push((route, owner, now));
        let members: Vec<Route> = evidence
            .iter()
            .filter(|(_, o, _)| *o == owner)
            .map(|(r, _, _)| *r)
            .collect();
        if members.len() < WIDER_AFTER {
            return false;
        }
        let mut pace = fresh;
        let mut wide_members = Vec::with_capacity(members.len());
        for member in members {
            let mut spent = member == route && spent;
            if let Some((_, p)) = self.routes.iter().find(|(r, _)| *r == member) {
                pace.take_holds_of(p);
                spent |= p.quota_spent(now);
            }
            wide_members.push((member, spent));
        }
        if let Some(hint) = hint {
            pace.hold(now, hint);
        }
        self.wide = Some(Wide {
            owner,
            pace,
            members: wide_members,
        });
        self.evidence.retain(|(_, o, _)| *o != owner);
        true
    }

    /// A success on the host: throttling so far proves no limit wider than
    /// a route.
    pub(super) fn no_wider(&mut self) {
        self.evidence.clear();
    }
}

impl Wide {
    /// Whether the route met this limit.
    fn holds(&self, route: Route) -> bool {
        self.members.iter().any(|(r, _)| *r == route)
    }
}

#[cfg(test)]
mod tests;
