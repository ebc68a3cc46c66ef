//! [`StoreError`]: what a store reports when it fails, and whether trying
//! again may help. At the bottom of the store's files: uses nothing of the
//! crate.

use std::fmt;

/// Error reported by a store backend.
///
/// Either *transient* (the store could not be reached, a pool or a statement
/// timed out, the server is restarting: the same request may succeed later,
/// and the layer answers `503` with `Retry-After`) or *permanent* (anything
/// else: the layer answers `500`, without inviting a retry).
#[derive(Debug)]
pub struct StoreError {
    message: String,
    transient: bool,
    source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
}

impl StoreError {
    /// A permanent error with a message only.
    pub fn msg(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            transient: false,
            source: None,
        }
    }

    /// A permanent error wrapping a backend error.
    pub fn with_source(
        message: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Self {
            message: message.into(),
            transient: false,
            source: Some(Box::new(source)),
        }
    }

    /// Marks the error as transient: retrying later may succeed.
    pub fn transient(mut self) -> Self {
        self.transient = true;
        self
    }

    /// Whether retrying later may succeed (connection lost, pool exhausted,
    /// timeout, server restarting).
    pub fn is_transient(&self) -> bool {
        self.transient
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.source {
            Some(source) => write!(f, "{}: {}", self.message, source),
            None => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for StoreError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}
