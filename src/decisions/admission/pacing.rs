//! Pacing: after a host throttles (429, or 503 with Retry-After) or says
//! its quota is spent, its requests wait in admission and go out one at a
//! time, at the rate the host is seen to accept.
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
//! # The rate
//!
//! It starts at the quota's rate when the server published one
//! (`RateLimit-Policy`), else at [`START_RATE`], and then searches for the
//! host's rate between the highest rate at which a released request
//! succeeded and the lowest at which one was throttled: ×[`DISCOVER_GROWTH`]
//! a success until a release is throttled, then halfway towards the rate
//! that failed, and once the two are within [`CONVERGED`], ×[`STEADY_GROWTH`]
//! every [`STEADY_EVERY`] successes, so that a host that speeds up is
//! followed (not above a published quota). A throttled release sets the rate back to the highest that
//! worked below it, and never below the successes per second seen since
//! the throttling began. This is the AWS SDKs' adaptive mode in spirit (a
//! client-side rate that follows throttling answers), kept per host, and
//! it costs a leaky-bucket server a handful of rejections to find its rate.
//! With no throttling for [`CALM`] and no request released for a second,
//! the host is no longer paced.

use std::time::{Duration, Instant};

/// The rate when nothing is known, requests per second.
pub(super) const START_RATE: f64 = 2.0;
/// The lowest rate, requests per second.
const MIN_RATE: f64 = 0.5;
/// Growth per successful release until a release is first throttled.
pub(super) const DISCOVER_GROWTH: f64 = 1.5;
/// The search stops when the rate that failed is within this factor of
/// the one that works.
pub(super) const CONVERGED: f64 = 1.03;
/// Once converged, growth every [`STEADY_EVERY`] successful releases.
pub(super) const STEADY_GROWTH: f64 = 1.02;
/// See [`STEADY_GROWTH`].
pub(super) const STEADY_EVERY: u32 = 20;
/// Released requests throttled, with no success since the throttling
/// began, after which the host looks down rather than rate-limited: it is
/// no longer paced (the outage admission takes over) until a success.
const DOWN_AFTER: u32 = 3;
/// With no throttling answer for this long, and no request released for a
/// second, pacing ends.
pub(super) const CALM: Duration = Duration::from_secs(5);

/// One host's pacing.
#[derive(Debug, Clone)]
pub(super) struct Pace {
    /// When the throttling began.
    began: Instant,
    /// Successes at this host since then.
    successes: u32,
    /// Released requests throttled since then.
    throttled_releases: u32,
    /// Releases per second.
    rate: f64,
    /// The highest rate at which a released request succeeded.
    good: Option<f64>,
    /// The lowest rate at which a released request was throttled.
    bad: Option<f64>,
    /// Successful releases since the search converged or last grew.
    streak: u32,
    /// Whether the rate is the server's published quota: then it is not
    /// searched above.
    published: bool,
    /// The next release slot.
    next: Instant,
    /// The rate that spaced `next` from the release before it.
    spaced_by: f64,
    /// The rate that spaced the last release from the one before: what its
    /// answer says something about.
    slot_rate: f64,
    /// No release before this (a Retry-After when the throttling began, a
    /// spent quota's reset); `None` once passed or never set.
    hold: Option<Instant>,
    last_throttle: Instant,
    last_release: Option<Instant>,
    /// The highest rate.
    max_rate: f64,
}

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
            // faster but for the occasional step up.
            bad: published.map(|_| rate * CONVERGED),
            streak: 0,
            published: published.is_some(),
            // The first release one interval after the throttling answer:
            // the server has just admitted someone.
            next: after(now, spacing(rate)).unwrap_or(now),
            spaced_by: rate,
            slot_rate: rate,
            hold: None,
            last_throttle: now,
            last_release: None,
            max_rate,
        }
    }

    /// The release rate, requests per second.
    pub(super) fn rate(&self) -> f64 {
        self.rate
    }

    /// Holds every release until `until` from `now` (a Retry-After, a
    /// quota's reset); an instant too far to represent holds until the
    /// waiters' own bounds end them.
    pub(super) fn hold(&mut self, now: Instant, until: Duration) {
        let year = Duration::from_secs(86_400 * 365);
        let at = after(now, until)
            .or_else(|| after(now, year))
            .unwrap_or(now);
        self.hold = Some(self.hold.map_or(at, |h| h.max(at)));
    }

    /// A throttling answer at `now`; `released` when the request was sent
    /// under a release slot (only those say the rate is too high), with the
    /// server's hint.
    pub(super) fn throttled(&mut self, now: Instant, released: bool, hint: Option<Duration>) {
        self.last_throttle = self.last_throttle.max(now);
        if !released {
            // Requests already in flight when the pacing began: their hint
            // holds the first release, nothing more.
            if self.last_release.is_none() {
                if let Some(hint) = hint {
                    self.hold(now, hint);
                }
            }
            return;
        }
        self.throttled_releases = self.throttled_releases.saturating_add(1);
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
        self.streak = 0;
        self.rate = self
            .good
            .unwrap_or(rate / 2.0)
            .max(accepted)
            .min(rate)
            .clamp(MIN_RATE, self.max_rate.max(MIN_RATE));
        // The next slot a full interval after this answer.
        if let Some(next) = after(now, spacing(self.rate)) {
            self.next = self.next.max(next);
            self.spaced_by = self.rate;
        }
    }

    /// A success; `released` when sent under a release slot.
    pub(super) fn succeeded(&mut self, released: bool) {
        self.successes = self.successes.saturating_add(1);
        if !released {
            return;
        }
        let good = self.good.map_or(self.slot_rate, |g| g.max(self.slot_rate));
        self.good = Some(good);
        let next = match self.bad {
            None => self.rate.max(good * DISCOVER_GROWTH),
            Some(bad) if bad > good * CONVERGED => (good + bad) / 2.0,
            Some(_) => {
                self.streak += 1;
                if self.streak >= STEADY_EVERY && !self.published {
                    // Try a little faster: the host may have sped up.
                    self.streak = 0;
                    self.bad = Some(good * STEADY_GROWTH * CONVERGED);
                    good * STEADY_GROWTH
                } else {
                    good
                }
            }
        };
        self.rate = next.min(self.max_rate.max(MIN_RATE));
    }

    /// Whether the pacing decides at `now`: always during a hold (a
    /// Retry-After, a spent quota), and afterwards unless every released
    /// request has been throttled, [`DOWN_AFTER`] of them: a host that
    /// admits nothing, answering 503 with Retry-After, is down, not
    /// rate-limited; its new calls are not held, and its retries are the
    /// outage admission's (bucket, probes, release) until it admits one.
    pub(super) fn governs(&self, now: Instant) -> bool {
        self.hold.is_some_and(|h| h > now)
            || self.successes > 0
            || self.throttled_releases < DOWN_AFTER
    }

    /// Whether pacing is over at `now`: no throttling for [`CALM`], no
    /// release for a second, no hold ahead.
    pub(super) fn ended(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.last_throttle) >= CALM
            && self.hold.is_none_or(|h| h <= now)
            && self
                .last_release
                .is_none_or(|r| now.saturating_duration_since(r) >= Duration::from_secs(1))
    }

    /// Takes the release slot if it is due at `now`, or says how long until
    /// it is.
    pub(super) fn release(&mut self, now: Instant) -> Result<(), Duration> {
        let mut slot = self.next;
        if let Some(hold) = self.hold {
            if hold > now {
                slot = slot.max(hold);
            } else {
                self.hold = None;
            }
        }
        if slot > now {
            return Err(slot - now);
        }
        // No catching up after a quiet spell: one request per slot.
        self.next = after(now, spacing(self.rate)).unwrap_or(now);
        self.slot_rate = self.spaced_by;
        self.spaced_by = self.rate;
        self.last_release = Some(now);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn releases_are_spread_and_none_comes_before_the_hold() {
        let t0 = Instant::now();
        let mut p = Pace::begin(t0, Some(5.0), 10_000.0);
        p.hold(t0, Duration::from_secs(1));
        assert_eq!(p.release(t0), Err(Duration::from_secs(1)));
        let t1 = t0 + Duration::from_secs(1);
        assert_eq!(p.release(t1), Ok(()));
        // Everyone else waits a slot each, not one wave.
        assert_eq!(p.release(t1), Err(ms(200)));
        assert_eq!(p.release(t1 + ms(200)), Ok(()));
    }

    /// Releases `n` requests to a leaky bucket that admits one per
    /// `1 / per_second` and throttles the rest; returns the rejections.
    fn against_a_leaky_bucket(p: &mut Pace, t0: Instant, per_second: f64, n: u32) -> u32 {
        let interval = Duration::from_secs_f64(1.0 / per_second);
        let (mut now, mut last, mut rejected) = (t0, None::<Instant>, 0);
        for _ in 0..n {
            if let Err(wait) = p.release(now) {
                now += wait;
                p.release(now).unwrap();
            }
            if last.is_none_or(|l| now - l >= interval) {
                last = Some(now);
                p.succeeded(true);
            } else {
                rejected += 1;
                p.throttled(now, true, None);
            }
        }
        rejected
    }

    #[test]
    fn the_search_finds_a_leaky_buckets_rate_from_below_in_a_few_rejections() {
        for per_second in [1.0, 5.0, 20.0, 333.0] {
            let t0 = Instant::now();
            let mut p = Pace::begin(t0, None, 10_000.0);
            let rejected = against_a_leaky_bucket(&mut p, t0, per_second, 60);
            assert!(rejected <= 8, "{per_second}/s: {rejected} rejected");
            let rate = p.rate();
            assert!(
                rate <= per_second * STEADY_GROWTH * 1.001 && rate >= per_second * 0.9,
                "{per_second}/s: settled at {rate}"
            );
            // Settled: the next 100 go through but for the occasional
            // step up that follows a host that sped up.
            let rejected =
                against_a_leaky_bucket(&mut p, t0 + Duration::from_secs(600), per_second, 100);
            assert!(
                rejected <= 6,
                "{per_second}/s: {rejected} rejected once settled"
            );
        }
        // A published quota is the starting rate: nothing is rejected.
        let t0 = Instant::now();
        let mut p = Pace::begin(t0, Some(5.0), 10_000.0);
        assert_eq!(against_a_leaky_bucket(&mut p, t0, 5.0, 100), 0);
    }

    #[test]
    fn throttles_of_requests_sent_before_the_pacing_only_hold_it() {
        let t0 = Instant::now();
        let mut p = Pace::begin(t0, None, 10_000.0);
        p.throttled(t0, false, Some(Duration::from_secs(9)));
        assert_eq!(p.rate(), START_RATE);
        assert_eq!(p.release(t0 + ms(1)), Err(Duration::from_secs(9) - ms(1)));
    }

    #[test]
    fn a_host_that_admits_nothing_is_not_paced_after_its_hold() {
        let t0 = Instant::now();
        let mut p = Pace::begin(t0, None, 10_000.0);
        p.hold(t0, Duration::from_secs(1));
        assert!(p.governs(t0));
        let t1 = t0 + Duration::from_secs(2);
        for i in 0..DOWN_AFTER {
            assert!(p.governs(t1), "after {i} throttled releases");
            p.throttled(t1, true, None);
        }
        assert!(!p.governs(t1));
        // One success: it is rate-limited after all.
        p.succeeded(true);
        assert!(p.governs(t1));
    }

    #[test]
    fn hostile_holds_and_rates_never_overflow() {
        let t0 = Instant::now();
        let mut p = Pace::begin(t0, Some(f64::INFINITY), f64::MAX);
        p.hold(t0, Duration::MAX);
        assert!(p.release(t0).is_err());
        let mut p = Pace::begin(t0, Some(1e300), 1e300);
        for _ in 0..10_000 {
            p.succeeded(true);
        }
        assert!(p.release(t0).is_ok());
        assert!(p.release(t0).is_ok() || p.release(t0).is_err());
    }
}
