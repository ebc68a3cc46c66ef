//! Holds and releases: what the server said about the time (a
//! Retry-After, a spent quota's reset), and the release slots that spread
//! the queue behind it.

use std::time::{Duration, Instant};

use super::{after, spacing, Pace, CALM, DOWN_AFTER, RAMP_GROWTH, RAMP_POLL};

impl Pace {
    /// Holds every release until `until` from `now` (a Retry-After, a
    /// quota's reset the policy accepted); pacing goes on for [`CALM`]
    /// after it ends.
    pub(in crate::decisions::admission) fn hold(&mut self, now: Instant, until: Duration) {
        let year = Duration::from_secs(86_400 * 365);
        let at = after(now, until)
            .or_else(|| after(now, year))
            .unwrap_or(now);
        self.hold = Some(self.hold.map_or(at, |h| h.max(at)));
        self.quiet_since = self.quiet_since.max(at);
    }

    /// Holds every release until `until` from `now` because the server
    /// said the route's quota is spent until then: first attempts too.
    pub(in crate::decisions::admission) fn hold_spent_quota(
        &mut self,
        now: Instant,
        until: Duration,
    ) {
        self.hold(now, until);
        let at = after(now, until).or(self.hold);
        self.quota_reset = self.quota_reset.max(at);
    }

    /// Holds as long as `other` holds (a route's pacing folded into its
    /// host's).
    pub(in crate::decisions::admission) fn take_holds_of(&mut self, other: &Pace) {
        self.hold = self.hold.max(other.hold);
        self.quota_reset = self.quota_reset.max(other.quota_reset);
        self.quiet_since = self.quiet_since.max(other.quiet_since);
    }

    /// Whether the server said at `now` that the route's quota is spent
    /// (its reset has not come yet).
    pub(in crate::decisions::admission) fn quota_spent(&self, now: Instant) -> bool {
        self.quota_reset.is_some_and(|r| r > now) && self.hold.is_some()
    }

    /// Whether the pacing decides at `now`: always during a hold (a
    /// Retry-After, a spent quota), and afterwards unless every released
    /// request has been throttled, [`DOWN_AFTER`] of them: a route that
    /// admits nothing, answering 503 with Retry-After after its 429s, is
    /// down, not rate-limited; its new calls are not held, and its retries
    /// are the outage admission's (bucket, probes, release) until it
    /// admits one. Nor once its 429s are seen not to follow the rate
    /// ([`UNRELATED_AFTER`]), but for a spent quota's hold.
    pub(in crate::decisions::admission) fn governs(&self, now: Instant) -> bool {
        self.hold.is_some_and(|h| h > now)
            || (!self.unrelated && (self.successes > 0 || self.throttled_releases < DOWN_AFTER))
    }

    /// Whether pacing is over at `now`: no throttling answer for [`CALM`]
    /// since the last one and since the last hold ended, nobody held back
    /// for a second.
    pub(in crate::decisions::admission) fn ended(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.quiet_since) >= CALM
            && self
                .last_denied
                .is_none_or(|d| now.saturating_duration_since(d) >= Duration::from_secs(1))
    }

    /// Takes the release slot if it is due at `now`, or says how long until
    /// it is.
    pub(in crate::decisions::admission) fn release(
        &mut self,
        now: Instant,
    ) -> Result<(), Duration> {
        let mut slot = self.next;
        if let Some(hold) = self.hold {
            if hold > now {
                slot = slot.max(hold);
            } else {
                self.hold = None;
                self.reopened = true;
            }
        }
        if slot > now {
            self.last_denied = Some(now);
            let wait = slot - now;
            if self.ramping && self.hold.is_none() {
                // The slot comes sooner if the answers in flight are
                // accepted: ask again when it would, or soon.
                let sooner = after(self.last_release, spacing(self.rate * RAMP_GROWTH))
                    .map_or(RAMP_POLL, |s| s.saturating_duration_since(now))
                    .max(RAMP_POLL);
                return Err(wait.min(sooner));
            }
            return Err(wait);
        }
        self.after_hold = std::mem::take(&mut self.reopened);
        if self.after_hold {
            self.ramping = true;
        }
        self.released_any = true;
        self.last_release = now;
        // No catching up after a quiet spell: one request per slot.
        self.next = after(now, spacing(self.rate)).unwrap_or(now);
        self.slot_rate = self.spaced_by;
        self.spaced_by = self.rate;
        Ok(())
    }
}
