//! Sweeps of expired records: one sweep with its outcome logged, and, for
//! a store whose claims start its sweeps, when the next one is due.

#[cfg(any(feature = "postgres", feature = "redis"))]
use std::sync::Mutex;
#[cfg(any(feature = "postgres", feature = "redis"))]
use std::time::{Duration, Instant};

use super::IdempotencyStore;

/// One sweep of `store`, its outcome logged.
pub(crate) async fn sweep_logged(store: &dyn IdempotencyStore) {
    match store.sweep_expired().await {
        Ok(n) if n > 0 => tracing::debug!(swept = n, "swept expired idempotency keys"),
        Ok(_) => {}
        Err(err) => tracing::warn!(error = %err, "sweeping expired idempotency keys failed"),
    }
}

/// Sweeps `store` in a task of its own on the current tokio runtime (none:
/// no sweep).
#[cfg(any(feature = "postgres", feature = "redis"))]
pub(crate) fn spawn_sweep<S: IdempotencyStore>(store: S) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    drop(runtime.spawn(async move { sweep_logged(&store).await }));
}

/// When a store that sweeps by itself, its claims starting the sweeps,
/// sweeps next.
#[cfg(any(feature = "postgres", feature = "redis"))]
#[derive(Debug)]
pub(crate) struct SweepSchedule {
    /// `None`: never.
    every: Option<Duration>,
    /// `None`: never again (an interval past what an `Instant` holds).
    next: Mutex<Option<Instant>>,
}

#[cfg(any(feature = "postgres", feature = "redis"))]
impl SweepSchedule {
    /// A sweep every `every` (`None` or zero: never), the first one at most
    /// `first_within` from now.
    pub(crate) fn new(every: Option<Duration>, first_within: Duration) -> Self {
        let every = every.filter(|e| !e.is_zero());
        let next = every.and_then(|e| Instant::now().checked_add(e.min(first_within)));
        Self {
            every,
            next: Mutex::new(next),
        }
    }

    /// Whether a sweep is due now; if it is, the next one is an interval
    /// later.
    pub(crate) fn due(&self) -> bool {
        let Some(every) = self.every else {
            return false;
        };
        let now = Instant::now();
        let mut next = self.next.lock().unwrap_or_else(|p| p.into_inner());
        match *next {
            Some(at) if at <= now => {
                *next = now.checked_add(every);
                true
            }
            _ => false,
        }
    }
}
