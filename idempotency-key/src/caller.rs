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
#[derive(Clone)]
pub struct CallerScope(Repr);

#[derive(Clone)]
enum Repr {
    /// Set once, by whichever clone sets it first.
    Shared(Arc<OnceLock<String>>),
    /// Set when made ([`CallerScope::of_static`]): no clone can set it
    /// again, so its clones need not share anything, and making it
    /// allocates nothing (the idempotency layer makes one per request).
    Fixed(&'static str),
}

impl Default for CallerScope {
    fn default() -> Self {
        Self(Repr::Shared(Arc::default()))
    }
}

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

    /// A scope already set to `scope`, as [`of`](Self::of) makes it,
    /// without allocating.
    ///
    /// ```
    /// use idempotency_key::CallerScope;
    ///
    /// let scope = CallerScope::of_static("anonymous");
    /// assert!(!scope.clone().set("mallory"), "set once");
    /// assert_eq!(scope.get(), Some("anonymous"));
    /// ```
    pub fn of_static(scope: &'static str) -> Self {
        Self(Repr::Fixed(scope))
    }

    /// Sets the scope, for this value and every clone of it; `false` (and
    /// nothing changed) if it was set already.
    pub fn set(&self, scope: impl Into<String>) -> bool {
        match &self.0 {
            Repr::Shared(cell) => cell.set(scope.into()).is_ok(),
            Repr::Fixed(_) => false,
        }
    }

    /// The scope, once set.
    pub fn get(&self) -> Option<&str> {
        match &self.0 {
            Repr::Shared(cell) => cell.get().map(String::as_str),
            Repr::Fixed(scope) => Some(scope),
        }
    }
}

impl fmt::Debug for CallerScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("CallerScope").field(&self.get()).finish()
    }
}
