//! Random bytes for fresh idempotency keys, from the kernel's generator.
//!
//! ```
//! use reqwest_safe_retry::IdempotencyKey;
//! use reqwest_safe_retry::keys::KeyGenerator;
//!
//! let a = IdempotencyKey::generate(KeyGenerator::UuidV4);
//! let b = IdempotencyKey::generate(KeyGenerator::UuidV4);
//! assert_ne!(a, b);
//! ```
//!
//! What the keys guarantee, and why the kernel's generator: see
//! [`KeyGenerator::UuidV4`](crate::keys::KeyGenerator::UuidV4).

/// Fills `buf` from the kernel's generator: one `getrandom` system call
/// (through `uuid`), which a `fork()` child or a restored snapshot cannot
/// repeat.
pub(crate) fn fill(buf: &mut [u8; 16]) {
    *buf = uuid::Uuid::new_v4().into_bytes();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_differ() {
        let mut seen = std::collections::HashSet::new();
        for _ in 0..10_000 {
            let mut buf = [0; 16];
            fill(&mut buf);
            assert!(seen.insert(buf), "a 128-bit draw repeated");
        }
    }
}
