//! Pacing: after a route of a host throttles (429) or says its quota is
//! spent, its requests wait in admission and go out one at a time, at the
//! rate the route is seen to accept.
//!
//! # Why pace, and not only back off
//!
//! A burst against a rate-limited API is the most common retry storm. With
//! backoff alone the callers told the same `Retry-After` come back together,
//! one gets through, the rest are rejected again: three attempts spent in
//! three seconds. A server admitting five requests a second needs them
//! 200 ms apart. So a throttled route gets a *schedule*: release slots
//! `1 / rate` apart (a few ms more: [`SPACING_MARGIN`]), none before the
//! server's `Retry-After` (or its quota's reset), each taken by one waiting
//! request. A wait for a slot is not an attempt: nothing is spent.
//!
//! # What starts it, what a hold is, and how long
//!
//! Pacing is kept per [`crate::admission::Route`]: a throttling answer proves
//! something about its path, not about the host's other paths, until the
//! evidence says more (several routes throttled together, none succeeding,
//! pace the host as one: the admission's `adaptive/admit` module). Only
//! the server's word about the rate starts it: a 429 or a spent quota. A
//! 503 with Retry-After says "later", not "slower" (a balancer may answer
//! so to one request in five whatever the rate): that call's own floor,
//! and the outage admission's; it neither slows nor holds a paced route.
//! The circuit breaker, kept per host, never hears of a 429 (its module
//! says what it does beside the other features).
//!
//! A 429's Retry-After holds the route's releases until it has passed
//! (the 429 that began the pacing, and those to released requests: one to
//! a new call let through is that call's own floor, else the queue would
//! wait for the latest of many callers' hints), and so does a spent
//! quota's reset. Only the reset holds first attempts (unless the policy
//! paces them too): a first attempt is a call the caller would have made
//! with no retry layer, and only the server's own numbers say it cannot
//! succeed. The caller passes only holds the policy accepts.
//!
//! # The rate
//!
//! It starts at the quota's rate when the server published one
//! (`RateLimit-Policy`), else at [`START_RATE`], and searches between the
//! highest rate at which a release succeeded and the lowest at which one
//! was told "too many": ×[`DISCOVER_GROWTH`] a success until a release is
//! told so, then halfway towards the rate that failed, until the two are
//! within [`CONVERGED`] (each step up may cost a Retry-After's hold). A
//! 429 sets the rate back to the highest that worked below it, never below
//! the successes per second seen since the throttling began. A 429 at a
//! rate the route had already admitted contradicts the search; after
//! [`UNRELATED_AFTER`] of them the 429s are not about the rate (a
//! balancer's): the route is no longer paced or held by them, its retries
//! the outage admission's (their count forgotten after [`PROBE_RELEASES`]
//! accepted in a row). Each widens the spacing by a quarter of an
//! interval: a request that reaches the server late by a varying delay (a
//! loaded machine's task woken late) makes a rate that worked fail once. With no 429 (to any request of the route) for a
//! probe interval (1 s and [`PROBE_RELEASES`] releases, doubling each time
//! a probe is told "too many"), the search goes upward again (not above a
//! published quota).
//! This is the AWS SDKs' adaptive mode in spirit, kept per route.
//! A release answered late may have reached the server late, and a
//! call's last attempt is not sent in a step up: the `holds` module.
//!
//! # After a hold: the rate the server accepts now
//!
//! A hold says when, not how fast. Once it ends, the queue goes out one at
//! a time, and while no rate is known to be too fast every accepted
//! release grows the rate ×[`RAMP_GROWTH`] and brings the next slot in
//! (waiters ask again when it would come), until the queue is empty or a
//! 429 ends the ramp: 40 calls behind a server that now accepts all go in
//! a few hundred milliseconds. A 429 to the first release after a hold
//! says the server is still closed, not that the rate was too high: it
//! holds again and lowers nothing. A published window's average (`q / w`)
//! caps the rate only while the quota is reported spent; past the reset
//! the rate climbs, unless a faster release is refused: then the average
//! is the server's rate, and the cap for good. Pacing ends after [`CALM`]
//! with no throttling answer nor hold, and nobody held back for a second.

use std::time::{Duration, Instant};

/// The rate when nothing is known, requests per second.
pub(super) const START_RATE: f64 = 2.0;
/// The lowest rate, requests per second.
const MIN_RATE: f64 = 0.5;
/// Growth per successful release while searching upward.
pub(super) const DISCOVER_GROWTH: f64 = 1.5;
/// The search stops when the rate that failed is within this of one that works.
pub(super) const CONVERGED: f64 = 1.3;
/// The first wait after the last 429 before the search goes upward, and
/// the successful releases it also waits for (a slow route is not probed
/// every second); both double each time a probe is told "too many", at
/// most `MAX_PROBE_LEVEL` times.
const FIRST_PROBE: Duration = Duration::from_secs(1);
const PROBE_RELEASES: u32 = 20;
const MAX_PROBE_LEVEL: u32 = 6;
/// Released requests throttled, none succeeding since the throttling began,
/// after which the host looks down, not rate-limited: not paced till a success.
const DOWN_AFTER: u32 = 3;
/// No throttling answer nor hold for this long, nobody held back for 1 s: ended.
pub(super) const CALM: Duration = Duration::from_secs(5);
/// Growth per accepted release once a hold has ended, until a 429.
pub(super) const RAMP_GROWTH: f64 = 3.0;
/// While the rate ramps, a waiting request asks again at least this often.
const RAMP_POLL: Duration = Duration::from_millis(20);
/// The most a late answer moves the next slot: half an interval, and
/// never more than this.
const MAX_LATE: Duration = Duration::from_millis(100);

/// One route's pacing.
#[derive(Debug, Clone)]
pub(super) struct Pace {
    /// When the throttling began; successes, and releases throttled, since.
    began: Instant,
    successes: u32,
    throttled_releases: u32,
    /// Releases per second.
    rate: f64,
    /// The highest rate a release succeeded at, the lowest told "too many".
    good: Option<f64>,
    bad: Option<f64>,
    /// The rate is the server's published quota (`quota`): not searched above.
    published: bool,
    quota: Option<f64>,
    /// The quota's cap was lifted after its reset (and no 429 since).
    lifted: bool,
    /// Faster than the quota after its reset was refused: a cap for good.
    cap_kept: bool,
    /// The next release slot, the last release, the one before it, whether
    /// there was one.
    next: Instant,
    last_release: Instant,
    prev_release: Instant,
    released_any: bool,
    /// A hold has ended since the last release; the last release was the
    /// first after a hold (a 429 to it says the hold's reason lasts).
    reopened: bool,
    after_hold: bool,
    /// A hold has ended and no 429 to a release has come since; the rate
    /// of the first release after it, which got through.
    ramping: bool,
    ramp_base: Option<f64>,
    /// The rate that spaced `next`; the last release's (its answer's subject).
    spaced_by: f64,
    slot_rate: f64,
    /// No release before this (a Retry-After, a spent quota's reset).
    hold: Option<Instant>,
    /// When the last spent quota's reset comes: first attempts wait too.
    quota_reset: Option<Instant>,
    /// The later of the last throttling answer and the last hold's end.
    quiet_since: Instant,
    /// The last 429: the upward search waits from it.
    last_too_fast: Instant,
    /// How many times the wait before a probe has doubled; successful
    /// releases since the last 429; whether the search goes upward again.
    probe_level: u32,
    calm_releases: u32,
    probing: bool,
    last_denied: Option<Instant>, // the last request told to wait
    max_rate: f64,
    /// The highest rate a release ever succeeded at (`good` may forget it).
    peak: Option<f64>,
    /// 429s to releases at a rate the route had admitted; their spacing.
    contradictions: u32,
    slack: Duration,
    /// Releases sent and not yet answered; the shortest time from a
    /// release to its answer seen while it was the only one in flight.
    in_flight: u32,
    quickest: Option<Duration>,
    /// The 429s do not follow the rate: "failing anyway", as a 503's.
    unrelated: bool,
}

/// 429s at a rate the route had admitted after which its 429s are not about
/// the rate (a limiter's stop once the rate follows it down; a balancer's not).
const UNRELATED_AFTER: u32 = 3;

/// `now + d`, or `None` when not representable.
fn after(now: Instant, d: Duration) -> Option<Instant> {
    now.checked_add(d)
}

/// Releases are spaced this much wider than `1 / rate`: a request reaches
/// the server a few ms late, by a varying delay, and a limiter counting
/// from the last one it accepted (nginx's, in whole ms) refuses about half
/// of those sent `1 / rate` after it, each refusal a Retry-After's hold.
const SPACING_MARGIN: f64 = 1.03;

/// The interval between releases at `rate`, which is finite and positive.
fn spacing(rate: f64) -> Duration {
    Duration::try_from_secs_f64(SPACING_MARGIN / rate).unwrap_or(Duration::from_secs(2))
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
            // A published rate is where the search starts, converged.
            bad: published.map(|_| rate * CONVERGED),
            published: published.is_some(),
            quota: published.map(|_| rate),
            lifted: false,
            cap_kept: false,
            // One interval after the throttling answer (someone got in).
            next: after(now, spacing(rate)).unwrap_or(now),
            last_release: now,
            prev_release: now,
            released_any: false,
            reopened: false,
            after_hold: false,
            ramping: false,
            ramp_base: None,
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
            slack: Duration::ZERO,
            in_flight: 0,
            quickest: None,
            unrelated: false,
        }
    }

    /// The interval between releases at `rate`, widened by the slack.
    fn spacing(&self, rate: f64) -> Duration {
        spacing(rate).saturating_add(self.slack)
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
        // A 429's "later" holds the route: the one that began the pacing,
        // and those to released requests. Any other is its call's own floor
        // (a 503's, or a new call's: the queue asks the server itself).
        let first = !self.released_any && self.hold.is_none();
        if let Some(hint) = hint.filter(|_| too_fast && !self.unrelated && (released || first)) {
            self.hold(now, hint);
        }
        if too_fast && !self.unrelated {
            // The limit binds now (a new wave's first attempts told so):
            // no probe upward, whose 429 would hold the queue, yet.
            self.last_too_fast = self.last_too_fast.max(now);
            self.calm_releases = 0;
        }
        if !released {
            return;
        }
        let late = self.lateness(now);
        self.later_slot(late);
        self.throttled_releases = self.throttled_releases.saturating_add(1);
        if !too_fast || self.unrelated {
            // Failing anyway, whatever the rate: nothing to learn.
            return;
        }
        if self.after_hold {
            return; // sent as the hold ended: the server is still closed
        }
        let ramp_ended = std::mem::take(&mut self.ramping) && self.bad.is_none();
        if self.good.is_some_and(|g| self.slot_rate <= g) {
            self.contradictions += 1;
            // Perhaps a late arrival, not the rate: a wider spacing.
            self.slack = (spacing(self.slot_rate) / 8 * self.contradictions.pow(2)).max(self.slack);
            // Nor a sign the search may go up: a probe waits longer.
            self.probe_level = (self.probe_level + 1).min(MAX_PROBE_LEVEL);
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
        // A host that slowed down: what worked before no longer does. A
        // ramp's steps (×RAMP_GROWTH while no rate was told "too many")
        // may have got through by luck, arriving late: not its first.
        let good = if ramp_ended { self.ramp_base } else { None };
        self.good = good.or(self.good).filter(|g| *g < rate);
        self.rate = self
            .good
            .unwrap_or(rate / 2.0)
            .max(accepted)
            .min(rate)
            .clamp(MIN_RATE, self.max_rate.max(MIN_RATE));
        if let Some(quota) = self.quota.filter(|_| std::mem::take(&mut self.lifted)) {
            // Faster than the quota after its reset was refused: a cap.
            self.published = true;
            self.cap_kept = true;
            self.rate = quota;
            self.good = Some(quota);
            self.bad = Some(quota * CONVERGED);
        }
        // The next slot a full interval after this answer.
        if let Some(next) = after(now, self.spacing(self.rate)) {
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
            // A window's average caps only while the quota is spent.
            self.published = false;
            self.lifted = true;
            self.bad = None;
        }
        // A release answered late may have reached the server late: it
        // proves only the rate of the time since the release before it and
        // that lateness (a ramp's step that got through so, arriving late,
        // proved too fast a rate).
        let late = self.lateness(now);
        let since = self
            .last_release
            .saturating_duration_since(self.prev_release);
        let proven =
            if !self.after_hold && late > spacing(self.slot_rate).mul_f64(SPACING_MARGIN - 1.0) {
                (1.0 / since.saturating_add(late).as_secs_f64()).min(self.slot_rate)
            } else {
                self.slot_rate
            };
        if self.after_hold {
            self.ramp_base = Some(proven);
        }
        let good = self.good.map_or(proven, |g| g.max(proven));
        self.good = Some(good);
        self.peak = Some(self.peak.map_or(good, |p| p.max(good)));
        self.calm_releases = self.calm_releases.saturating_add(1);
        if self.calm_releases >= PROBE_RELEASES {
            self.contradictions = 0; // sparse: late arrivals'
        }
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
            // The release after a hold's first goes at a rate that worked:
            // its taker is most likely the call refused before the hold,
            // whose Retry-After ended with it (perhaps its last attempt).
            Some(_) if self.after_hold && !self.probing => good,
            Some(bad) if !self.probing && bad > good * CONVERGED => (good + bad) / 2.0,
            Some(_) if !self.probing => good,
            _ => self.rate.max(good * growth),
        };
        self.rate = next.min(self.max_rate.max(MIN_RATE));
        if self.ramping {
            // The next slot at the new rate, from the last release.
            if let Some(sooner) = after(self.last_release, self.spacing(self.rate)) {
                if sooner < self.next {
                    self.next = sooner;
                    self.spaced_by = self.rate;
                }
            }
        }
        self.later_slot(late);
    }

    /// Whether the pacing decides at `now`: always during a hold, and
    /// afterwards unless [`DOWN_AFTER`] released requests were throttled
    /// and none succeeded (down, not rate-limited: its retries are the
    /// outage admission's until it admits one), or its 429s are seen not
    /// to follow the rate ([`UNRELATED_AFTER`]).
    pub(super) fn governs(&self, now: Instant) -> bool {
        self.hold.is_some_and(|h| h > now)
            || (!self.unrelated && (self.successes > 0 || self.throttled_releases < DOWN_AFTER))
    }

    /// Whether pacing is over at `now`: no throttling answer nor hold for
    /// [`CALM`], nobody held back for a second.
    pub(super) fn ended(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.quiet_since) >= CALM
            && self
                .last_denied
                .is_none_or(|d| now.saturating_duration_since(d) >= Duration::from_secs(1))
    }
}

mod holds;
#[cfg(test)]
mod tests;
