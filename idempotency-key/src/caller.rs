//! [`CallerScope`]: who the server's idempotency layer decided a request's
//! caller is, handed to the layers around it in the request's extensions.

use std::fmt;
use std::sync::{Arc, OnceLock};

/// The caller a server's idempotency layer scoped a request's key to, as a
/// request extension, so that the keys a handler derives for its own calls
/// follow the server's notion of the caller, not the raw credential bytes
/// (a refreshed token, or another spelling of one credential, is the same
/// caller to the server and must derive the same keys).
///
/// One value is shared by every clone: a layer outside the idempotency
/// layer inserts an empty one before the request goes in, and the
/// idempotency layer [sets](Self::set) it once it has scoped the request;
/// a layer inside it finds it already set. `tower-idempotency` sets it to
/// the request's stored scope (a digest of the scope function's value, or
/// of the normalized credentials); `reqwest-safe-retry`'s
/// `InheritDeadlineLayer` reads it. Neither crate depends on the other.
///
/// ```
/// use idempotency_key::CallerScope;
///
/// let outer = CallerScope::new();
/// let inner = outer.clone(); // what the request's extensions carry in
/// assert_eq!(outer.get(), None);
/// assert!(inner.set("alice"));
/// assert!(!inner.set("mallory"), "set once");
/// assert_eq!(outer.get(), Some("alice"));
/// ```
#[derive(Clone, Default)]
pub struct CallerScope(Arc<OnceLock<String>>);

impl CallerScope {
    /// A scope not set yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// A scope already set to `scope`.
    pub fn of(scope: impl Into<String>) -> Self {
        let this = Self::new();
        this.set(scope);
        this
    }

    /// Sets the scope, for this value and every clone of it; `false` (and
    /// nothing changed) if it was set already.
    pub fn set(&self, scope: impl Into<String>) -> bool {
        self.0.set(scope.into()).is_ok()
    }

    /// The scope, once set.
    pub fn get(&self) -> Option<&str> {
        self.0.get().map(String::as_str)
    }
}

impl fmt::Debug for CallerScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("CallerScope").field(&self.get()).finish()
    }
}
