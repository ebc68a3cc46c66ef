//! Pacing: after a route of a host throttles (429, or 503 with
//! Retry-After) or says its quota is spent, its requests wait in admission
//! and go out one at a time, at the rate the route is seen to accept.
//!
//! # Why pace, and not only back off
//!
//! A burst against a rate-limited API is the most common retry storm. With
//! backoff alone every rejected call sleeps on its own: the ones told the
//! same `Retry-After` come back together, one gets through, the rest are
//! rejected again, and three attempts are spent in three seconds. A server
//! that admits five requests a second needs them one per 200 ms, not
//! nineteen at once every second. So a throttled host gets a *schedule*:
//! release slots spaced `1 / rate` apart, none before the server's
//! `Retry-After` (or its quota's reset), each taken by one waiting request.
//! A wait for a slot is not an attempt: nothing is sent, nothing is spent.
//!
//! # What starts it, what a hold is, and how long
//!
//! Pacing is kept per [`crate::Route`] of a host: a throttling answer
//! proves something about the path it came from, not about the host's
//! other paths. Only the server's own word about the rate starts it: a 429
//! (too many requests) or a spent quota. A 503 with Retry-After says
//! "later", not "slower" (a balancer may answer so to one request in five
//! whatever the rate): it is that call's own floor, and the outage
//! admission caps the retries of a host that keeps answering so. On a
//! route already paced it neither drags the rate down nor holds anything.
//!
//! A 429's Retry-After holds the route's releases until it has passed, and
//! so does a spent quota's reset. Only the reset holds the route's first
//! attempts (unless the policy paces them too): a first attempt is a call
//! the caller would have made with no retry layer, and only the server's
//! own numbers say it cannot succeed; the calls held go out one per slot
//! after the reset. The caller passes only holds the policy accepts:
//! never longer than its `max_retry_after`, never one it refused.
//!
//! # The rate
//!
//! It starts at the quota's rate when the server published one
//! (`RateLimit-Policy`), else at [`START_RATE`], and then searches for the
//! route's rate between the highest rate at which a released request
//! succeeded and the lowest at which one was told "too many": ×[`DISCOVER_GROWTH`]
//! a success until a release is told so, then halfway towards the rate
//! that failed, until the two are within [`CONVERGED`]. Only a 429 says the
//! rate was too high: a 503, whatever the rate, drags nothing down. A 429
//! sets the rate back to the highest that worked below it, and never below
//! the successes per second seen since the throttling began. A 429 to a
//! release at a rate the route had already admitted contradicts the
//! search; after [`UNRELATED_AFTER`] of them the 429s are not about the
//! rate (a balancer answering one request in two so, whatever the rate):
//! the rate goes back to the best that worked and the route is no longer
//! paced or held by them, its retries the outage admission's. Once no 429
//! has come for a probe interval (1 s and [`PROBE_RELEASES`] releases,
//! both doubling each time the probe is told "too many", back when it is
//! not), the search goes upward again, so that a host that lifted its limit is followed within a few
//! releases (not above a published quota). This is the AWS SDKs' adaptive
//! mode in spirit (a client-side rate that follows throttling answers),
//! kept per route.
//!
//! # When it ends
//!
//! With no throttling answer for [`CALM`] after the last one and after the
//! last hold, and nobody held back for a second, the route is no longer
//! paced: the host accepts what is sent. A hold that ends therefore never
//! ends the pacing with it, and the queue behind it goes out at the rate.

use std::time::{Duration, Instant};

/// The rate when nothing is known, requests per second.
pub(super) const START_RATE: f64 = 2.0;
/// The lowest rate, requests per second.
const MIN_RATE: f64 = 0.5;
/// Growth per successful release while searching upward.
pub(super) const DISCOVER_GROWTH: f64 = 1.5;
/// The search stops when the rate that failed is within this factor of
/// the one that works.
pub(super) const CONVERGED: f64 = 1.3;
/// The first wait, after the last 429, before the search goes upward.
const FIRST_PROBE: Duration = Duration::from_secs(1);
/// And the successful releases since the last 429 it also waits for,
/// whatever the time: a slow route is not probed every second.
const PROBE_RELEASES: u32 = 20;
/// Both double each time a probe is told "too many", at most this many
/// times (to 64 s and 640 releases).
const MAX_PROBE_LEVEL: u32 = 6;
/// Released requests throttled, with no success since the throttling
/// began, after which the host looks down rather than rate-limited: it is
/// no longer paced (the outage admission takes over) until a success.
const DOWN_AFTER: u32 = 3;
/// With no throttling answer for this long after the last one and the
/// last hold, and nobody held back for a second, pacing ends.
pub(super) const CALM: Duration = Duration::from_secs(5);
/// Growth per accepted release once a hold has ended, until the server
/// throttles again: the queue behind a hold is released at the rate the
/// server accepts now, found in a few round trips.
pub(super) const RAMP_GROWTH: f64 = 3.0;
/// While the rate ramps, a waiting request asks again at least this often
/// (the next slot comes sooner with every accepted answer).
const RAMP_POLL: Duration = Duration::from_millis(20);

/// One route's pacing.
#[derive(Debug, Clone)]
pub(super) struct Pace {
    /// When the throttling began.
    began: Instant,
    /// Successes on this route since then.
    successes: u32,
    /// Released requests throttled since then.
    throttled_releases: u32,
    /// Releases per second.
    rate: f64,
    /// The highest rate at which a released request succeeded.
    good: Option<f64>,
    /// The lowest rate at which a released request was told "too many".
    bad: Option<f64>,
    /// Whether the rate is the server's published quota: then it is not
    /// searched above.
    published: bool,
    /// The published quota's rate, if any.
    quota: Option<f64>,
    /// The quota's cap was lifted after its reset (and no 429 since).
    lifted: bool,
    /// A release faster than the quota after its reset was refused: the
    /// window's average is the rate, and the cap is kept.
    cap_kept: bool,

    /// The next release slot.
    next: Instant,
    /// When the last request was released.
    last_release: Instant,
    /// Whether a request has been released yet.
    released_any: bool,
    /// A hold has ended since the last release: the next one is sent into
    /// what the server said about the time, not about the rate.
    reopened: bool,
    /// Whether the last release was the first after a hold: a 429 to it
    /// says the hold's reason lasts, not that the rate was too high.
    after_hold: bool,
    /// A hold has ended and no 429 to a release has come since: each
    /// accepted release grows the rate ×[`RAMP_GROWTH`].
    ramping: bool,
    /// The rate that spaced `next` from the release before it.
    spaced_by: f64,
    /// The rate that spaced the last release from the one before: what its
    /// answer says something about.
    slot_rate: f64,
    /// No release before this (a Retry-After, a spent quota's reset);
    /// `None` once passed or never set.
    hold: Option<Instant>,
    /// When the last spent quota's reset comes: until then the route's
    /// first attempts are held too.
    quota_reset: Option<Instant>,
    /// The later of the last throttling answer and the last hold's end.
    quiet_since: Instant,
    /// The last 429: the upward search waits `probe_after` from it.
    last_too_fast: Instant,
    /// How many times the wait before a probe has doubled.
    probe_level: u32,
    /// Successful releases since the last 429.
    calm_releases: u32,
    /// Whether the rate is searched upward again after a calm spell.
    probing: bool,

    /// The last time a request was told to wait for its slot.
    last_denied: Option<Instant>,
    /// The highest rate.
    max_rate: f64,
    /// The highest rate at which a released request ever succeeded here
    /// (`good` forgets it when a 429 comes at or below it).
    peak: Option<f64>,
    /// 429s to releases sent at a rate the route had already admitted.
    contradictions: u32,
    /// Whether the 429s are seen not to follow the rate: then they say
    /// "failing anyway", as a 503 does, and neither pace nor hold.
    unrelated: bool,
}

/// 429s at a rate the route had already admitted, after which its 429s
/// are taken as not about the rate. A server that limits the rate admits
/// a rate that worked until it lowers its limit, and once the rate has
/// followed it down they stop; a balancer that answers one request in
/// two 429 whatever the rate contradicts every rate it admitted.
const UNRELATED_AFTER: u32 = 3;

/// `now + d`, or `None` when not representable.
fn after(now: Instant, d: Duration) -> Option<Instant> {
    now.checked_add(d)
}

/// The interval between releases at `rate`, which is finite and positive.
fn spacing(rate: f64) -> Duration {
    Duration::try_from_secs_f64(1.0 / rate).unwrap_or(Duration::from_secs(2))
}

impl Pace {
    /// Pacing that begins at `now`, at `rate` if the server published one.
    pub(super) fn begin(now: Instant, rate: Option<f64>, max_rate: f64) -> Self {
        let published = rate.filter(|r| r.is_finite() && *r > 0.0);
        let rate = published
            .unwrap_or(START_RATE)
            .clamp(MIN_RATE, max_rate.max(MIN_RATE));
        Pace {
            began: now,
            successes: 0,
            throttled_releases: 0,
            rate,
            good: None,
            // A published rate is where the search starts, converged: no
            // faster.
            bad: published.map(|_| rate * CONVERGED),
            published: published.is_some(),
            quota: published.map(|_| rate),
            lifted: false,
            cap_kept: false,

            // The first release one interval after the throttling answer:
            // the server has just admitted someone.
            next: after(now, spacing(rate)).unwrap_or(now),
            last_release: now,
            released_any: false,
            reopened: false,
            after_hold: false,
            ramping: false,
            spaced_by: rate,
            slot_rate: rate,
            hold: None,
            quota_reset: None,
            quiet_since: now,
            last_too_fast: now,
            probe_level: 0,
            calm_releases: 0,
            probing: false,

            last_denied: None,
            max_rate,
            peak: None,
            contradictions: 0,
            unrelated: false,
        }
    }

    /// The release rate, requests per second.
    pub(super) fn rate(&self) -> f64 {
        self.rate
    }

    /// When the route last throttled or its last hold ends.
    pub(super) fn quiet_since(&self) -> Instant {
        self.quiet_since
    }

    /// A throttling answer at `now`: `released` when the request was sent
    /// under a release slot, `too_fast` for a 429 (only those say the rate
    /// is too high), with the server's hint, one the policy accepts.
    pub(super) fn throttled(
        &mut self,
        now: Instant,
        released: bool,
        too_fast: bool,
        hint: Option<Duration>,
    ) {
        self.quiet_since = self.quiet_since.max(now);
        // A 429's "later" holds the route: the answer that began the
        // pacing, and those to released requests. A 503's is that call's
        // own floor: a 503 now and then would otherwise hold the route for
        // ever; and so is a 429's once they are seen not to follow the
        // rate, and one to a request the pacing did not send (a new call
        // let through) once a hold was set: its caller sleeps it, and the
        // queue's next release asks the server itself, rather than wait
        // for the latest of many callers' hints after the server has
        // recovered.
        let first = !self.released_any && self.hold.is_none();
        if let Some(hint) = hint.filter(|_| too_fast && !self.unrelated && (released || first)) {
            self.hold(now, hint);
        }
        if !released {
            return;
        }
        self.throttled_releases = self.throttled_releases.saturating_add(1);
        if !too_fast || self.unrelated {
            // Failing anyway, whatever the rate: nothing to learn.
            return;
        }
        if self.after_hold {
            // Sent as the hold ended, spaced by the hold: the server is
            // still closed, whatever the rate.
            return;
        }
        self.ramping = false;
        if self.good.is_some_and(|g| self.slot_rate <= g) {
            self.contradictions += 1;
            if self.contradictions >= UNRELATED_AFTER {
                // Back to the best rate that worked, and no longer paced.
                self.unrelated = true;
                self.hold = None;
                self.rate = self.rate.max(self.peak.unwrap_or(START_RATE));
                return;
            }
        }
        if self.probing {
            self.probe_level = (self.probe_level + 1).min(MAX_PROBE_LEVEL);
            self.probing = false;
        }
        self.last_too_fast = self.last_too_fast.max(now);
        self.calm_releases = 0;
        let seen = now.saturating_duration_since(self.began).as_secs_f64();
        let accepted = if seen >= 1.0 {
            f64::from(self.successes) / seen
        } else {
            0.0
        };
        let rate = self.slot_rate;
        self.bad = Some(self.bad.map_or(rate, |b| b.min(rate)));
        // A host that slowed down: what worked before no longer does.
        self.good = self.good.filter(|g| *g < rate);
        self.rate = self
            .good
            .unwrap_or(rate / 2.0)
            .max(accepted)
            .min(rate)
            .clamp(MIN_RATE, self.max_rate.max(MIN_RATE));
        if let Some(quota) = self.quota.filter(|_| std::mem::take(&mut self.lifted)) {
            // Faster than the quota after its reset was refused: its
            // average is the rate after all, a cap from now on.
            self.published = true;
            self.cap_kept = true;
            self.rate = quota;
            self.good = Some(quota);
            self.bad = Some(quota * CONVERGED);
        }
        // The next slot a full interval after this answer.
        if let Some(next) = after(now, spacing(self.rate)) {
            self.next = self.next.max(next);
            self.spaced_by = self.rate;
        }
    }

    /// A success at `now`; `released` when sent under a release slot.
    pub(super) fn succeeded(&mut self, now: Instant, released: bool) {
        self.successes = self.successes.saturating_add(1);
        if !released {
            return;
        }
        if self.published && !self.cap_kept && !self.quota_spent(now) && self.quota_reset.is_some()
        {
            // A window's average is a cap only while the quota is spent:
            // past its reset the server says what it accepts by answering.
            self.published = false;
            self.lifted = true;
            self.bad = None;
        }
        let good = self.good.map_or(self.slot_rate, |g| g.max(self.slot_rate));
        self.good = Some(good);
        self.peak = Some(self.peak.map_or(good, |p| p.max(good)));
        self.calm_releases = self.calm_releases.saturating_add(1);
        if self.bad.is_some_and(|b| good >= b) {
            // Through at a rate that was told "too many": the limit lifted.
            self.bad = None;
            self.probe_level = 0;
        }
        if !self.published
            && self.bad.is_some()
            && self.calm_releases >= PROBE_RELEASES << self.probe_level
            && now.saturating_duration_since(self.last_too_fast)
                >= FIRST_PROBE * (1 << self.probe_level)
        {
            // No "too many" for a probe interval: try faster.
            self.probing = true;
        }
        let growth = if self.ramping && !self.probing {
            RAMP_GROWTH
        } else {
            DISCOVER_GROWTH
        };
        let next = match self.bad {
            Some(bad) if !self.probing && bad > good * CONVERGED => (good + bad) / 2.0,
            Some(_) if !self.probing => good,
            _ => self.rate.max(good * growth),
        };
        self.rate = next.min(self.max_rate.max(MIN_RATE));
        if self.ramping {
            // The next slot at the new rate, from the last release: the
            // queue need not wait out a spacing the server has outgrown.
            if let Some(sooner) = after(self.last_release, spacing(self.rate)) {
                if sooner < self.next {
                    self.next = sooner;
                    self.spaced_by = self.rate;
                }
            }
        }
    }
}

mod release;
#[cfg(test)]
mod tests;
