//! The request path, the floor between the stores and the layer: what
//! happens to one keyed request once the layer has let it through.
//!
//! May use: `store`, `memory`, `postgres`.
//!
//! Bottom up: the names and the context a handler finds in its request
//! and the settings (`context.rs`, `config.rs`); the request's key and
//! fingerprint (`key.rs`) and its caller's scope (`scope.rs`); problem
//! answers (`problem.rs`) and replays of a stored response (`replay.rs`,
//! `answer.rs`); collecting a body (`body.rs`) and running a future in
//! place, catching its panics (`inline.rs`); the lease keeper that extends
//! leases while handlers run and retries what a store failed to take
//! (`keeper.rs`). Above them the path itself: claim, run, complete
//! (`run/`), and the transactional mode's (`transactional.rs`), with the
//! two completions a handler makes in its own transaction
//! (`in_tx.rs`, `PostgresStore::complete_in_tx` and `commit_completed`).

pub(crate) mod answer;
pub(crate) mod body;
pub(crate) mod config;
pub(crate) mod context;
#[cfg(feature = "postgres")]
mod in_tx;
pub(crate) mod inline;
pub(crate) mod keeper;
pub(crate) mod key;
pub(crate) mod problem;
pub(crate) mod replay;
pub(crate) mod run;
pub(crate) mod scope;
#[cfg(feature = "postgres")]
pub(crate) mod transactional;
