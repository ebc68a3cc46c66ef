//! Random bytes for fresh idempotency keys, without a system call per key
//! where the kernel allows it.
//!
//! ```
//! use reqwest_safe_retry::{IdempotencyKey, KeyGenerator};
//!
//! let a = IdempotencyKey::generate(KeyGenerator::UuidV4);
//! let b = IdempotencyKey::generate(KeyGenerator::UuidV4);
//! assert_ne!(a, b);
//! ```
//!
//! What the keys guarantee, and why the kernel's generator: see
//! [`KeyGenerator::UuidV4`](crate::KeyGenerator::UuidV4).

/// Fills `buf` from the kernel's generator: the vDSO where there is one,
/// else the `getrandom` system call.
pub(crate) fn fill(buf: &mut [u8; 16]) {
    #[cfg(all(target_os = "linux", feature = "vdso-keys"))]
    if vdso::fill(buf) {
        return;
    }
    *buf = uuid::Uuid::new_v4().into_bytes();
}

#[cfg(all(target_os = "linux", feature = "vdso-keys"))]
mod vdso {
    use std::cell::RefCell;
    use std::sync::OnceLock;

    use vdso_rng::{LocalState, Pool};

    /// The process's vDSO state blocks; `None` when the kernel has no vDSO
    /// `getrandom` (before 6.11, or an architecture without it), or when the
    /// process does not see the vDSO the kernel mapped.
    fn pool() -> Option<&'static Pool> {
        static POOL: OnceLock<Option<Pool>> = OnceLock::new();
        POOL.get_or_init(|| vdso_visible().then(|| Pool::new().ok()).flatten())
            .as_ref()
    }

    /// `AT_SYSINFO_EHDR`, the vDSO's address in the auxiliary vector.
    const AT_SYSINFO_EHDR: usize = 33;

    /// Whether this process sees a vDSO. `vdso_rng` asks the kernel where
    /// the vDSO is (`PR_GET_AUXV`); under valgrind, which hides the vDSO
    /// from the program it runs and fakes `/proc/self/auxv` to match, that
    /// address is not mapped and using it would crash. So the vDSO is used
    /// only when the process's own auxiliary vector names one.
    fn vdso_visible() -> bool {
        const WORD: usize = std::mem::size_of::<usize>();
        let Ok(auxv) = std::fs::read("/proc/self/auxv") else {
            return false;
        };
        let word = |bytes: &[u8]| {
            bytes
                .try_into()
                .map(usize::from_ne_bytes)
                .unwrap_or_default()
        };
        auxv.chunks_exact(2 * WORD)
            .map(|pair| (word(&pair[..WORD]), word(&pair[WORD..])))
            .take_while(|&(key, _)| key != 0)
            .any(|(key, value)| key == AT_SYSINFO_EHDR && value != 0)
    }

    thread_local! {
        /// This thread's state block, rented once and returned on exit.
        static STATE: RefCell<Option<LocalState<'static>>> = const { RefCell::new(None) };
    }

    /// Fills `buf`, or says it could not (the caller falls back to the
    /// system call): no vDSO, a thread being torn down, or an error.
    pub(super) fn fill(buf: &mut [u8]) -> bool {
        let Some(pool) = pool() else {
            return false;
        };
        STATE
            .try_with(|cell| {
                let Ok(mut state) = cell.try_borrow_mut() else {
                    return false;
                };
                if state.is_none() {
                    *state = LocalState::new(pool).ok();
                }
                state.as_mut().is_some_and(|s| s.fill(buf, 0).is_ok())
            })
            .unwrap_or(false)
    }
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

    /// On this kernel the vDSO path is the one taken (Linux ≥ 6.11): the
    /// system call is the fallback, not the rule.
    #[cfg(all(target_os = "linux", feature = "vdso-keys"))]
    #[test]
    fn the_vdso_is_used_where_the_kernel_has_it() {
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        let mut parts = release.trim().split(['.', '-']);
        let major: u32 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
        let minor: u32 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
        let has_vdso =
            (major, minor) >= (6, 11) && cfg!(any(target_arch = "x86_64", target_arch = "aarch64"));
        let mut buf = [0; 16];
        assert_eq!(vdso::fill(&mut buf), has_vdso, "kernel {}", release.trim());
    }
}
