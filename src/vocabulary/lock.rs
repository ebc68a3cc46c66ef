//! A mutex's guard, whether or not another thread panicked holding it.

use std::sync::Mutex;

/// Locks a mutex, recovering the data if a panicking thread poisoned it: the
/// state guarded here stays consistent after every statement.
pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
