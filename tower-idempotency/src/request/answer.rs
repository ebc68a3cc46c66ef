//! The answers a keyed request gets without its handler running: what the
//! store holds for the key (the replay, `409`, `422`) or why the store
//! failed (`503`, `500`).
//!
//! Both modes give them alike, so they sit below both: `run/` (two-phase)
//! and `transactional.rs` import this file, and it imports neither.

use bytes::Bytes;
use http::Response;

use crate::request::config::Config;
use crate::request::problem::{problem, ProblemKind};
use crate::request::replay::{retry_after_value, to_response};
use crate::store::{ClaimOutcome, LeaseToken};

/// The lease and its fencing epoch, or the answer when the key is not ours
/// to run.
pub(crate) fn answer_without_running<B: From<Bytes>>(
    claimed: Result<ClaimOutcome, crate::StoreError>,
    config: &Config,
) -> Result<(LeaseToken, u64), Response<B>> {
    match claimed {
        Ok(ClaimOutcome::Claimed { lease, epoch }) => Ok((lease, epoch)),
        Ok(ClaimOutcome::Completed {
            response,
            fingerprint_matches: true,
        }) => Err(to_response(response, true)),
        Ok(ClaimOutcome::InProgress {
            fingerprint_matches: true,
        }) => Err(problem(
            ProblemKind::InProgress,
            "a request with this idempotency key is still being processed",
            Some(retry_after_value(config.retry_after)),
        )),
        Ok(ClaimOutcome::Completed { .. } | ClaimOutcome::InProgress { .. }) => Err(problem(
            ProblemKind::KeyReused,
            "this idempotency key was already used with a different request",
            None,
        )),
        Err(err) => Err(store_error_answer(err, config)),
    }
}

/// `503` + `Retry-After` for a transient store error, `500` otherwise.
pub(crate) fn store_error_answer<B: From<Bytes>>(
    err: crate::StoreError,
    config: &Config,
) -> Response<B> {
    if err.is_transient() {
        tracing::error!(error = %err, "idempotency store unavailable");
        problem(
            ProblemKind::StoreUnavailable,
            "the idempotency store is unavailable; retry later",
            Some(retry_after_value(config.retry_after)),
        )
    } else {
        tracing::error!(error = %err, "idempotency store refused the request");
        problem(
            ProblemKind::StoreFailed,
            "the idempotency store refused this request; nothing was run",
            None,
        )
    }
}
