//! The one random draw the floors share: a duration uniform between two
//! bounds, for backoff's jitter and the jitter on top of a Retry-After.

use std::time::Duration;

use rand::{Rng, RngExt};

/// A uniform draw from `[low, high]` at nanosecond resolution.
pub(crate) fn uniform<R: Rng + ?Sized>(rng: &mut R, low: Duration, high: Duration) -> Duration {
    if high <= low {
        return low;
    }
    let span = u64::try_from((high - low).as_nanos()).unwrap_or(u64::MAX);
    low + Duration::from_nanos(rng.random_range(0..=span))
}
