//! A pacing's holds: no release before a Retry-After or a spent quota's
//! reset.

use std::time::{Duration, Instant};

use super::{after, Pace};

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
