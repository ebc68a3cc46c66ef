//! The vocabulary's errors: a setting that cannot work, a key that cannot
//! be sent. Small, opaque, with lowercase messages.

use std::fmt;

/// A setting that cannot work, reported by a builder's `build()` or a
/// validating constructor. It names the setting.
///
/// ```
/// use std::time::Duration;
/// use reqwest_safe_retry::RetryPolicy;
///
/// let err = RetryPolicy::builder()
///     .deadline(Duration::from_millis(50))
///     .min_attempt_window(Duration::from_millis(100))
///     .build()
///     .unwrap_err();
/// assert_eq!(err.setting(), "deadline");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    setting: &'static str,
    message: &'static str,
}

impl ConfigError {
    /// An error that names no setting (a standalone constructor).
    pub(crate) fn new(message: &'static str) -> Self {
        ConfigError {
            setting: "",
            message,
        }
    }

    /// An error about `setting`.
    pub(crate) fn named(setting: &'static str, message: &'static str) -> Self {
        ConfigError { setting, message }
    }

    /// The same error, naming `setting` when it named none.
    pub(crate) fn in_setting(mut self, setting: &'static str) -> Self {
        if self.setting.is_empty() {
            self.setting = setting;
        }
        self
    }

    /// The builder setting (or config field) that was wrong, such as
    /// `max_attempts` or `budget.capacity`; empty when a standalone
    /// constructor was called.
    pub fn setting(&self) -> &'static str {
        self.setting
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.setting.is_empty() {
            write!(f, "invalid retry configuration: {}", self.message)
        } else {
            write!(
                f,
                "invalid retry configuration: {}: {}",
                self.setting, self.message
            )
        }
    }
}

impl std::error::Error for ConfigError {}

/// An idempotency key that cannot be sent: empty, longer than 255
/// characters, holding characters an HTTP header cannot carry, or a
/// request carrying its key header more than once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyError {
    reason: &'static str,
}

impl KeyError {
    pub(crate) fn new(reason: &'static str) -> Self {
        KeyError { reason }
    }
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid idempotency key: {}", self.reason)
    }
}

impl std::error::Error for KeyError {}
