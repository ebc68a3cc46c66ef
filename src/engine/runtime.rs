//! The engine's view of time: a [`Sleeper`] and a [`Clock`], both injectable
//! so tests never sleep for real (with the `test-util` feature, a
//! `ManualClock`; or tokio's paused time, which the defaults follow).
//!
//! ```
//! use std::time::Duration;
//! use reqwest_safe_retry::time::{Clock, Sleeper, SystemClock, TokioSleeper};
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().start_paused(true).build().unwrap().block_on(async {
//! let start = SystemClock.now();
//! TokioSleeper.sleep(Duration::from_millis(250)).await; // paused: at once
//! assert_eq!(SystemClock.now() - start, Duration::from_millis(250));
//! # });
//! ```

#[cfg(any(test, feature = "test-util"))]
use std::fmt;
use std::future::Future;
use std::pin::Pin;
#[cfg(any(test, feature = "test-util"))]
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

#[cfg(any(test, feature = "test-util"))]
use crate::vocabulary::lock;

/// A boxed, sendable future, as the sleeper returns.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// Sleeps between attempts.
pub trait Sleeper: Send + Sync + 'static {
    /// A future that completes after `duration`.
    fn sleep(&self, duration: Duration) -> BoxFuture<()>;
}

/// Tells the time: monotonic for deadlines, wall-clock for HTTP-dates.
pub trait Clock: Send + Sync + 'static {
    /// Monotonic now, for deadlines and elapsed time.
    fn now(&self) -> Instant;
    /// Wall-clock now, only to read a Retry-After HTTP-date when the response
    /// has no `Date` header.
    fn wall(&self) -> SystemTime;
}

/// Sleeps on tokio's timer (so `tokio::time::pause` applies).
#[derive(Debug, Clone, Copy, Default)]
pub struct TokioSleeper;

impl Sleeper for TokioSleeper {
    fn sleep(&self, duration: Duration) -> BoxFuture<()> {
        Box::pin(tokio::time::sleep(duration))
    }
}

/// The real clocks: tokio's monotonic `Instant` (paused when tokio's clock is
/// paused) and `SystemTime`.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        tokio::time::Instant::now().into_std()
    }

    fn wall(&self) -> SystemTime {
        SystemTime::now()
    }
}

#[cfg(any(test, feature = "test-util"))]
/// The farthest a [`ManualClock`] moves: about 31 years, so that `now()` and
/// `wall()` can never overflow however long the sleeps asked of it.
const MANUAL_HORIZON: Duration = Duration::from_secs(1_000_000_000);

/// A clock that only moves when told to, and a sleeper that moves it: each
/// `sleep(d)` returns at once, advances the clock by `d` and is recorded.
///
/// For tests of code that retries: delays and deadlines are checked exactly,
/// with no real sleeping. Clones share the same time and record.
#[cfg(any(test, feature = "test-util"))]
#[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
#[derive(Clone)]
pub struct ManualClock {
    inner: Arc<Mutex<ManualState>>,
}

#[cfg(any(test, feature = "test-util"))]
struct ManualState {
    origin: Instant,
    offset: Duration,
    wall_origin: SystemTime,
    sleeps: Vec<Duration>,
}

#[cfg(any(test, feature = "test-util"))]
impl ManualClock {
    /// A clock starting now, with wall-clock time 2026-01-01T00:00:00Z.
    pub fn new() -> Self {
        ManualClock::with_wall(SystemTime::UNIX_EPOCH + Duration::from_secs(1_767_225_600))
    }

    /// A clock whose wall-clock time starts at `wall`.
    pub fn with_wall(wall: SystemTime) -> Self {
        ManualClock {
            inner: Arc::new(Mutex::new(ManualState {
                origin: Instant::now(),
                offset: Duration::ZERO,
                wall_origin: wall,
                sleeps: Vec::new(),
            })),
        }
    }

    /// Moves the clock forward without recording a sleep (at most about 31
    /// years in all).
    pub fn advance(&self, by: Duration) {
        let mut state = lock(&self.inner);
        state.offset = state.offset.saturating_add(by).min(MANUAL_HORIZON);
    }

    /// Every sleep taken so far, in order.
    pub fn sleeps(&self) -> Vec<Duration> {
        lock(&self.inner).sleeps.clone()
    }

    /// Time advanced since the clock was made.
    pub fn elapsed(&self) -> Duration {
        lock(&self.inner).offset
    }
}

#[cfg(any(test, feature = "test-util"))]
impl Default for ManualClock {
    fn default() -> Self {
        ManualClock::new()
    }
}

#[cfg(any(test, feature = "test-util"))]
impl fmt::Debug for ManualClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = lock(&self.inner);
        f.debug_struct("ManualClock")
            .field("elapsed", &state.offset)
            .field("sleeps", &state.sleeps.len())
            .finish()
    }
}

#[cfg(any(test, feature = "test-util"))]
impl Clock for ManualClock {
    fn now(&self) -> Instant {
        let state = lock(&self.inner);
        // The offset is capped at MANUAL_HORIZON; the fallback is unreachable
        // on any platform whose Instant spans 31 years.
        state
            .origin
            .checked_add(state.offset)
            .unwrap_or(state.origin)
    }

    fn wall(&self) -> SystemTime {
        let state = lock(&self.inner);
        // A wall-clock origin near the end of time stops there.
        state
            .wall_origin
            .checked_add(state.offset)
            .unwrap_or(state.wall_origin)
    }
}

#[cfg(any(test, feature = "test-util"))]
impl Sleeper for ManualClock {
    fn sleep(&self, duration: Duration) -> BoxFuture<()> {
        {
            let mut state = lock(&self.inner);
            state.offset = state.offset.saturating_add(duration).min(MANUAL_HORIZON);
            state.sleeps.push(duration);
        }
        Box::pin(std::future::ready(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_never_overflows() {
        let clock =
            ManualClock::with_wall(SystemTime::UNIX_EPOCH + Duration::from_secs(u64::MAX / 2));
        let start = clock.now();
        clock.advance(Duration::MAX);
        block_on(clock.sleep(Duration::MAX));
        assert_eq!(clock.now() - start, MANUAL_HORIZON);
        let _ = clock.wall();
        assert_eq!(clock.sleeps(), [Duration::MAX]);
    }

    fn block_on(f: BoxFuture<()>) {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(f)
    }
}
