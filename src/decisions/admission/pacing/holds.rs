//! A pacing's holds: no release before a Retry-After or a spent quota's
//! reset; and its release slots: who goes when.
//!
//! A limiter counting from the last request it accepted (nginx's
//! `limit_req`) refuses a release sent an interval after one that reached
//! it late (a task woken late on a loaded machine): a refusal at the right
//! rate, each a call's attempt and a Retry-After's hold. The only release
//! in flight, answered later than the quickest answer, may have arrived as
//! much late: the next slot comes as much later (half an interval at
//! most), and its success proves only the rate of the time since the
//! release before it and that lateness. A release answered otherwise (a
//! 500, a reset, a timeout) is no longer in flight, though its time says
//! nothing. A call's last attempt never goes
//! in a step faster than the fastest rate that worked (the ramp's after a
//! hold, the search's): it waits for a slot at a rate that worked.

use std::time::{Duration, Instant};

use super::{after, Pace, MAX_LATE, RAMP_GROWTH, RAMP_POLL};

impl Pace {
    /// Holds every release until `until` from `now` (a Retry-After, a
    /// quota's reset); pacing goes on for [`CALM`](super::CALM) after it ends.
    pub(crate) fn hold(&mut self, now: Instant, until: Duration) {
        let year = Duration::from_secs(86_400 * 365);
        let at = after(now, until)
            .or_else(|| after(now, year))
            .unwrap_or(now);
        self.hold = Some(self.hold.map_or(at, |h| h.max(at)));
        self.quiet_since = self.quiet_since.max(at);
    }

    /// Holds every release, first attempts too, until `until` from `now`:
    /// the server said the route's quota is spent until then.
    pub(crate) fn hold_spent_quota(&mut self, now: Instant, until: Duration) {
        self.hold(now, until);
        let at = after(now, until).or(self.hold);
        self.quota_reset = self.quota_reset.max(at);
    }

    /// Holds as long as `other` holds (a route's, folded into its host's).
    pub(crate) fn take_holds_of(&mut self, other: &Pace) {
        self.hold = self.hold.max(other.hold);
        self.quota_reset = self.quota_reset.max(other.quota_reset);
        self.quiet_since = self.quiet_since.max(other.quiet_since);
    }

    /// Whether the route's quota is spent at `now` (its reset to come).
    pub(crate) fn quota_spent(&self, now: Instant) -> bool {
        self.quota_reset.is_some_and(|r| r > now) && self.hold.is_some()
    }
}

impl Pace {
    /// Takes the release slot if it is due at `now`, or says how long until
    /// it is (while ramping, until it would be, were the answers in flight
    /// accepted).
    pub(crate) fn release(&mut self, now: Instant) -> Result<(), Duration> {
        self.take_slot(now, false)
    }

    /// As [`Pace::release`], for a call's last attempt: never in a slot
    /// spaced by a rate faster than the fastest that worked (a ramp's step
    /// after a hold, the search's step up, a probe), which the server may
    /// well refuse; it waits for one spaced by a rate that worked. A cold
    /// wave's call refused at its first attempt and then at the ramp's
    /// step after the first hold is on its last attempt: a second step's
    /// refusal would fail it.
    pub(crate) fn release_last(&mut self, now: Instant) -> Result<(), Duration> {
        self.take_slot(now, true)
    }

    fn take_slot(&mut self, now: Instant, last: bool) -> Result<(), Duration> {
        let mut slot = self.next;
        if let Some(hold) = self.hold {
            if hold > now {
                slot = slot.max(hold);
            } else {
                self.hold = None;
                self.reopened = true;
            }
        }
        // The rate the slot is spaced by: the answer's subject.
        let mut spaced_by = self.spaced_by;
        if let Some(good) = self
            .good
            .filter(|g| last && spaced_by > *g && !self.reopened)
        {
            if let Some(safe) = after(self.last_release, self.spacing(good)) {
                slot = slot.max(safe);
                spaced_by = good;
            }
        }
        if slot > now {
            self.last_denied = Some(now);
            let wait = slot - now;
            if self.ramping && self.hold.is_none() {
                let sooner = after(self.last_release, self.spacing(self.rate * RAMP_GROWTH))
                    .map_or(RAMP_POLL, |s| s.saturating_duration_since(now))
                    .max(RAMP_POLL);
                return Err(wait.min(sooner));
            }
            return Err(wait);
        }
        self.after_hold = std::mem::take(&mut self.reopened);
        if self.after_hold {
            self.ramping = true;
            // Whatever was in flight before the hold has been answered
            // (or is lost): this one is the only one.
            self.in_flight = 0;
        }
        self.in_flight = self.in_flight.saturating_add(1);
        self.released_any = true;
        self.prev_release = self.last_release;
        self.last_release = now;
        // No catching up after a quiet spell: one request per slot.
        self.next = after(now, self.spacing(self.rate)).unwrap_or(now);
        self.slot_rate = spaced_by;
        self.spaced_by = self.rate;
        Ok(())
    }

    /// The answer at `now` to a released request: how much later than the
    /// quickest such answer it came, when it was the only release in
    /// flight (else which release it answers is not known: zero). That
    /// request may have reached the server as much later than it was sent
    /// (a task woken late on a loaded machine, a connection's first write).
    pub(super) fn lateness(&mut self, now: Instant) -> Duration {
        let alone = self.in_flight == 1;
        self.in_flight = self.in_flight.saturating_sub(1);
        if !alone {
            return Duration::ZERO;
        }
        let trip = now.saturating_duration_since(self.last_release);
        let quickest = self.quickest.map_or(trip, |q| q.min(trip));
        self.quickest = Some(quickest);
        trip.saturating_sub(quickest)
    }

    /// A release answered with neither a success nor a 429 (a 500, a
    /// reset, a timeout): no longer in flight, so the answers after it are
    /// each known alone again. Its time says nothing of when it reached
    /// the server (a reset comes at once, a timeout late): the quickest
    /// answer is left as it was.
    pub(crate) fn answered(&mut self) {
        self.in_flight = self.in_flight.saturating_sub(1);
    }

    /// The next slot `late` later than an interval after the last release
    /// (half an interval at most, [`MAX_LATE`] at most): else, the last
    /// release having reached the server late, the next, sent an interval
    /// after it, arrives less than an interval after it: refused, though
    /// the rate is right, which costs its call an attempt (its last,
    /// perhaps) and the queue a Retry-After's hold.
    pub(super) fn later_slot(&mut self, late: Duration) {
        let interval = self.spacing(self.spaced_by);
        let late = late.min(interval / 2).min(MAX_LATE);
        if let Some(later) = after(self.last_release, interval.saturating_add(late)) {
            self.next = self.next.max(later);
        }
    }
}

#[cfg(test)]
mod tests;
