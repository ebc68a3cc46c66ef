//! What a PostgreSQL failure means to the layer: a [`StoreError`],
//! transient (retry later) or permanent. Uses only the store's error.

use crate::store::StoreError;

/// Whether retrying later may help: the connection or the pool failed, or
/// the server is restarting or overloaded. Anything else (a constraint, a
/// value PostgreSQL refuses, a missing table) is permanent.
fn is_transient(err: &sqlx::Error) -> bool {
    match err {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(db) => db.code().is_some_and(|code| {
            // 08: connection exception; 57P01-57P03: admin shutdown, crash
            // shutdown, cannot connect now; 53300: too many connections;
            // 40001/40P01: serialization failure, deadlock; 57014: query
            // cancelled (statement timeout).
            code.starts_with("08")
                || matches!(
                    code.as_ref(),
                    "57P01" | "57P02" | "57P03" | "53300" | "40001" | "40P01" | "57014"
                )
        }),
        _ => false,
    }
}

pub(crate) fn db_err(what: &'static str) -> impl FnOnce(sqlx::Error) -> StoreError {
    move |e| {
        let transient = is_transient(&e);
        let err = StoreError::with_source(what, e);
        if transient {
            err.transient()
        } else {
            err
        }
    }
}
