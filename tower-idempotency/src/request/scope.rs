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
use idempotency_key::CallerScope;
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
                let mut canonical = Vec::new();
                for value in values {
                    field(
                        &mut hasher,
                        canonical_credentials(value.as_bytes(), &mut canonical),
                    );
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

/// The credentials in one canonical spelling, so that spellings RFC 9110
/// §11 makes equal share a scope: the auth-scheme is case-insensitive
/// (written with its first letter upper case and the rest lower case:
/// `Bearer`, `Basic`, the common spelling, whose scopes are unchanged), one
/// space separates it from the credentials however many were sent, and
/// spaces and tabs around the value do not count. The credentials
/// themselves (a token68 or auth-params) are compared byte for byte.
/// Borrowed when the value is already canonical.
fn canonical_credentials<'a>(value: &'a [u8], buffer: &'a mut Vec<u8>) -> &'a [u8] {
    let trimmed = value.trim_ascii();
    let (scheme, rest) = match trimmed.iter().position(|&b| b == b' ' || b == b'\t') {
        Some(at) => (&trimmed[..at], trimmed[at..].trim_ascii_start()),
        None => (trimmed, &[][..]),
    };
    let canonical_scheme = scheme.iter().enumerate().all(|(i, b)| {
        if i == 0 {
            !b.is_ascii_lowercase()
        } else {
            !b.is_ascii_uppercase()
        }
    });
    let one_space = rest.is_empty() || trimmed.len() == scheme.len() + 1 + rest.len();
    if canonical_scheme && one_space && trimmed.get(scheme.len()).is_none_or(|&b| b == b' ') {
        return trimmed;
    }
    buffer.clear();
    for (i, b) in scheme.iter().enumerate() {
        buffer.push(if i == 0 {
            b.to_ascii_uppercase()
        } else {
            b.to_ascii_lowercase()
        });
    }
    if !rest.is_empty() {
        buffer.push(b' ');
        buffer.extend_from_slice(rest);
    }
    buffer
}

/// Tells the layers around this one which caller the request's key was
/// scoped to: sets the [`CallerScope`] an outer layer put in the request's
/// extensions, or puts one there for the layers inside. The scope is the
/// stored one (a digest, never the credential), so the keys a handler
/// derives for its own calls follow the server's notion of the caller.
// A `Cow`, not a `&str`: a borrowed scope is a static one, handed over
// without a copy.
#[allow(clippy::ptr_arg)]
pub(crate) fn announce(extensions: &mut http::Extensions, scope: &Cow<'static, str>) {
    match extensions.get::<CallerScope>() {
        Some(outer) => {
            outer.set(&**scope);
        }
        // The anonymous scope (a static digest) is handed over as it is,
        // without copying it: one allocation (the extension's) instead of
        // three.
        None => {
            extensions.insert(match scope {
                Cow::Borrowed(scope) => CallerScope::of_static(scope),
                Cow::Owned(scope) => CallerScope::of(scope.as_str()),
            });
        }
    }
}

/// The scope of every request without an `Authorization` header.
static ANONYMOUS: LazyLock<String> = LazyLock::new(|| {
    let mut hasher = Sha256::new();
    field(&mut hasher, b"tower-idempotency/anonymous");
    hex(&hasher.finalize())
});

fn hex(digest: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    // A SHA-256 digest, written as bytes into a buffer of its size, then
    // checked once: pushing each digit as a `char` encoded it as UTF-8 one
    // at a time, ~700 instructions a digest (every request with
    // credentials makes one).
    let mut out = [0; 64];
    for (pair, b) in out.chunks_exact_mut(2).zip(digest) {
        pair[0] = DIGITS[usize::from(b >> 4)];
        pair[1] = DIGITS[usize::from(b & 0xf)];
    }
    let written = digest.len().min(32) * 2;
    // Only ASCII digits were written, so the check cannot fail.
    String::from_utf8(out[..written].to_vec()).unwrap_or_default()
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

    /// Spellings of one credential that RFC 9110 makes equal share a
    /// scope; the common spelling's scope is the one earlier releases
    /// stored; the credentials themselves stay case-sensitive.
    #[test]
    fn equal_spellings_of_a_credential_share_a_scope() {
        let rule = ScopeRule::Authorization;
        let common = rule.stored_scope(&parts(&[b"Bearer tok"]));
        for spelling in [
            &b"bearer tok"[..],
            b"BEARER tok",
            b"Bearer  tok",
            b"Bearer\ttok",
            b" Bearer tok\t",
        ] {
            assert_eq!(
                rule.stored_scope(&parts(&[spelling])),
                common,
                "{:?}",
                String::from_utf8_lossy(spelling)
            );
        }
        assert_ne!(rule.stored_scope(&parts(&[b"Bearer TOK"])), common);
        // The digest of the common spelling, as every earlier release
        // computed it.
        let mut hasher = Sha256::new();
        field(&mut hasher, b"tower-idempotency/authorization");
        field(&mut hasher, b"Bearer tok");
        assert_eq!(common, hex(&hasher.finalize()));
    }

    /// Every `Authorization` value counts, not only the first.
    #[test]
    fn every_authorization_value_counts() {
        let rule = ScopeRule::Authorization;
        assert_ne!(
            rule.stored_scope(&parts(&[b"Bearer a", b"Bearer b"])),
            rule.stored_scope(&parts(&[b"Bearer a", b"Bearer c"]))
        );
        assert_ne!(
            rule.stored_scope(&parts(&[b"Bearer a", b"Bearer b"])),
            rule.stored_scope(&parts(&[b"Bearer a"]))
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
