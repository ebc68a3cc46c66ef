//! The checks of `reqwest-safe-retry`: its integration tests (`tests/`),
//! benchmarks (`benches/`) and experiments (`examples/`), in a package of
//! their own so that their dependencies are built only for them. Nothing
//! here is published; this library holds only the README's examples, which
//! compile as doctests with the dependencies a reader's project would have.

/// The README's examples compile as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
struct ReadmeDoctests;
