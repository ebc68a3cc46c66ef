//! A host's pacings, and the scope of a limit learnt from the evidence.
//!
//! A throttling answer proves something about the route it came from, so
//! pacing starts per [`Route`]. Most public APIs, though, limit an account
//! or a token across every endpoint: then each route paced as if it were
//! alone sends its share at the whole limit's rate, and the retries of
//! twenty routes come back together when their Retry-After ends. The
//! evidence of a wider limit is throttling answers (429s, spent quotas)
//! from [`WIDER_AFTER`] routes of the host within [`SCOPE_WINDOW`] of each
//! other with no success from any of its routes since: then the host is
//! paced as one, every route's retries (and the first attempts a pacing
//! holds) taking its slots, until it has been calm for the pacing's
//! `CALM` and the pacing ends; routes are then paced on their own again.
//! One route throttled while the others succeed is that route's limit,
//! and paces it alone.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::vocabulary::{Partition, Route};

use super::super::pacing::Pace;
use super::{AdaptiveAdmission, Host};

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
