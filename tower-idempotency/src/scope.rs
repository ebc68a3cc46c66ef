//! Whose key is it: the scope a request's key is stored under.
//!
//! The store never sees a credential or a caller-chosen string: it sees a
//! SHA-256 digest (64 hexadecimal characters), so a scope has a fixed size
//! and a leaked table reveals no secret. Each rule hashes under its own
//! domain tag, so the anonymous scope, a credential's scope and a custom
//! scope can never coincide.

use std::borrow::Cow;
use std::fmt;
use std::sync::{Arc, LazyLock};

use http::header::AUTHORIZATION;
use http::request::Parts;
use sha2::{Digest, Sha256};

type ScopeFn = Arc<dyn Fn(&Parts) -> String + Send + Sync>;

/// How a request's scope is derived.
#[derive(Clone)]
pub(crate) enum ScopeRule {
    /// A digest of the `Authorization` header values; one anonymous scope
    /// for requests without any.
    Authorization,
    /// A digest of what the function returns.
    Custom(ScopeFn),
}

impl fmt::Debug for ScopeRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Authorization => f.write_str("Authorization"),
            Self::Custom(_) => f.write_str("Custom(<fn>)"),
        }
    }
}

fn field(hasher: &mut Sha256, bytes: &[u8]) {
    hasher.update((bytes.len() as u64).to_be_bytes());
    hasher.update(bytes);
}

impl ScopeRule {
    /// The scope the store sees for this request. Borrowed for every
    /// request without credentials (the one anonymous digest, computed
    /// once), so those cost no allocation.
    pub(crate) fn stored_scope(&self, parts: &Parts) -> Cow<'static, str> {
        let mut hasher = Sha256::new();
        match self {
            Self::Authorization => {
                let mut values = parts.headers.get_all(AUTHORIZATION).iter().peekable();
                if values.peek().is_none() {
                    // The same digest for every anonymous request: computed
                    // once, not hashed per request.
                    return Cow::Borrowed(ANONYMOUS.as_str());
                }
                field(&mut hasher, b"tower-idempotency/authorization");
                for value in values {
                    field(&mut hasher, value.as_bytes());
                }
            }
            Self::Custom(scope) => {
                field(&mut hasher, b"tower-idempotency/custom");
                field(&mut hasher, scope(parts).as_bytes());
            }
        }
        Cow::Owned(hex(&hasher.finalize()))
    }
}

/// The scope of every request without an `Authorization` header.
static ANONYMOUS: LazyLock<String> = LazyLock::new(|| {
    let mut hasher = Sha256::new();
    field(&mut hasher, b"tower-idempotency/anonymous");
    hex(&hasher.finalize())
});

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0xf)]));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(auth: &[&[u8]]) -> Parts {
        let mut builder = http::Request::post("/p");
        for value in auth {
            builder = builder.header(AUTHORIZATION, *value);
        }
        builder.body(()).unwrap().into_parts().0
    }

    #[test]
    fn credentials_get_distinct_fixed_size_scopes_without_the_secret() {
        let rule = ScopeRule::Authorization;
        let a = rule.stored_scope(&parts(&[b"Bearer secret-a"]));
        let b = rule.stored_scope(&parts(&[b"Bearer secret-b"]));
        let anonymous = rule.stored_scope(&parts(&[]));
        assert_ne!(a, b);
        assert_ne!(a, anonymous);
        assert_eq!(a, rule.stored_scope(&parts(&[b"Bearer secret-a"])));
        assert_eq!(a.len(), 64);
        assert!(!a.contains("secret"));
        // Non-UTF-8 credentials are credentials too, not the anonymous scope.
        assert_ne!(rule.stored_scope(&parts(&[b"\xff\xfe"])), anonymous);
        // A credential spelled like the anonymous tag is still a credential.
        assert_ne!(
            rule.stored_scope(&parts(&[b"tower-idempotency/anonymous"])),
            anonymous
        );
    }

    /// The digest computed once is the one every release stored (keys
    /// claimed before an upgrade keep their scope).
    #[test]
    fn the_anonymous_scope_is_stable() {
        let anonymous = ScopeRule::Authorization.stored_scope(&parts(&[]));
        assert_eq!(
            anonymous,
            "30e2b499e0f040147379bf042e161306072dd66249c526c2a02cc3c85c8aa8c4"
        );
    }

    #[test]
    fn custom_scopes_never_meet_the_default_ones() {
        let custom = ScopeRule::Custom(Arc::new(|_| String::new()));
        let p = parts(&[]);
        assert_ne!(
            custom.stored_scope(&p),
            ScopeRule::Authorization.stored_scope(&p)
        );
        let long = ScopeRule::Custom(Arc::new(|_| "x".repeat(4000)));
        assert_eq!(long.stored_scope(&p).len(), 64);
    }
}
