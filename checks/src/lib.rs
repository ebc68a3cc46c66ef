//! The checks of `reqwest-safe-retry`: its integration tests (`tests/`),
//! benchmarks (`benches/`) and experiments (`examples/`), in a package of
//! their own so that their dependencies are built only for them. Nothing
//! here is published; this library holds only the README's examples, which
//! compile as doctests with the dependencies a reader's project would have.

/// The README's examples compile as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
struct ReadmeDoctests;

/// The guide's pages (rendered on docs.rs as `reqwest_safe_retry::_guide`)
/// compile as doctests here, with the dependencies their examples use.
#[cfg(doctest)]
#[doc = include_str!("../../docs/using.md")]
#[doc = include_str!("../../docs/production.md")]
#[doc = include_str!("../../docs/migrating.md")]
#[doc = include_str!("../../docs/observability.md")]
#[doc = include_str!("../../docs/testing.md")]
#[doc = include_str!("../../docs/call.md")]
#[doc = include_str!("../../docs/layout.md")]
struct GuideDoctests;
