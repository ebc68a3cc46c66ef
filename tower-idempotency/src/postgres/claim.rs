//! One key's row, on a connection the caller chooses (a pooled one, or
//! the transaction of the transactional mode, or the handler's own): claim
//! it (and take over a lease seen stale for a lock timeout), mark a stale
//! lease, read it, complete it.

use bytes::Bytes;
use sqlx::{Executor, PgConnection, Row};

use crate::store::{
    check_ids, headers_from_json, headers_to_json, ClaimOutcome, ClaimRequest, Fingerprint,
    LeaseToken, StoreError, StoredResponse,
};

use super::error::db_err;
use super::sql::{interval_secs, Lit, Template};
use super::PostgresStore;

/// `template` with `args` written in, as a simple query (see `sql.rs`).
pub(super) fn render(template: &Template, args: &[Lit<'_>]) -> Result<String, StoreError> {
    template.render(args).ok_or_else(|| {
        StoreError::msg("a scope or key holds a NUL character, which PostgreSQL cannot store")
    })
}

impl PostgresStore {
    /// Claims on `conn` (a pooled connection, or the transaction of the
    /// transactional mode, where the claim commits with the handler's
    /// writes). A claim that loses the insert race and then finds the row
    /// gone (it was released in between) tries again; a few rounds suffice.
    ///
    /// Does not mark a stale lease: `true` beside the outcome says the
    /// caller must, with [`PostgresStore::mark_stale`], on a connection
    /// whose work commits (never inside a transaction about to be rolled
    /// back, where the mark would vanish with it).
    ///
    /// `lease` is the token the claim writes; a row in progress under that
    /// very token counts as claimed (a claim repeated after one whose
    /// answer was lost with its connection).
    pub(crate) async fn claim_on(
        &self,
        conn: &mut PgConnection,
        req: ClaimRequest<'_>,
        lease: LeaseToken,
    ) -> Result<(ClaimOutcome, bool), StoreError> {
        check_ids(req.scope, req.key)?;
        self.maybe_sweep();
        let lease_text = lease.0.to_string();
        let sql = render(
            &self.queries.claim,
            &[
                Lit::Text(req.scope),
                Lit::Text(req.key),
                Lit::Bytes(req.fingerprint.as_bytes().as_slice()),
                Lit::Float(interval_secs(req.ttl)),
                Lit::Text(&lease_text),
                Lit::Float(interval_secs(req.lock_timeout)),
            ],
        )?;
        for _ in 0..8 {
            let claimed = (&mut *conn).fetch_optional(sql.as_str()).await;
            let claimed = match claimed {
                // The transactional mode waits on a row an open transaction
                // holds for at most its `lock_timeout` (55P03): that request
                // is in progress. So it is when a `statement_timeout` the
                // role or the database sets ends the wait first (57014):
                // the one wait a claim of one row by its key can have is on
                // a transaction holding that row.
                Err(sqlx::Error::Database(db))
                    if matches!(db.code().as_deref(), Some("55P03" | "57014")) =>
                {
                    let busy = ClaimOutcome::InProgress {
                        fingerprint_matches: true,
                    };
                    return Ok((busy, false));
                }
                other => other.map_err(db_err("claiming idempotency key"))?,
            };
            if let Some(row) = claimed {
                let epoch: i64 = row.try_get("epoch").map_err(db_err("decode"))?;
                // Never negative: at least 1, then only greater.
                let epoch = u64::try_from(epoch).unwrap_or(0);
                return Ok((ClaimOutcome::Claimed { lease, epoch }, false));
            }
            let Some(outcome) = self
                .read_on(conn, req.scope, req.key, req.fingerprint)
                .await?
            else {
                continue;
            };
            // Whatever the fingerprint: a corrected request may take over
            // the key of an owner that is provably gone.
            let mark = matches!(outcome, ClaimOutcome::InProgress { .. });
            return Ok((outcome, mark));
        }
        Err(StoreError::msg(
            "claiming idempotency key: the row kept changing, giving up",
        ))
    }

    /// Marks the lease of `req`'s key as seen stale if it is stale and not
    /// marked since its last extension: its owner gets a lock timeout to
    /// come back before a takeover. On `conn`, or on a kept connection.
    pub(crate) async fn mark_stale(
        &self,
        conn: Option<&mut PgConnection>,
        req: ClaimRequest<'_>,
    ) -> Result<(), StoreError> {
        match conn {
            Some(conn) => self.mark_stale_on(conn, req).await,
            None => on_kept!(self, conn => self.mark_stale_on(&mut conn, req)),
        }
    }

    async fn mark_stale_on(
        &self,
        conn: &mut PgConnection,
        req: ClaimRequest<'_>,
    ) -> Result<(), StoreError> {
        let sql = render(
            &self.queries.mark_stale,
            &[
                Lit::Text(req.scope),
                Lit::Text(req.key),
                Lit::Float(interval_secs(req.lock_timeout)),
            ],
        )?;
        conn.execute(sql.as_str())
            .await
            .map_err(db_err("marking a stale idempotency lease"))?;
        Ok(())
    }

    /// The live record of `(scope, key)` on `conn`, as a claim that did not
    /// win sees it.
    pub(super) async fn read_on(
        &self,
        conn: &mut PgConnection,
        scope: &str,
        key: &str,
        fingerprint: Fingerprint,
    ) -> Result<Option<ClaimOutcome>, StoreError> {
        let sql = render(&self.queries.select, &[Lit::Text(scope), Lit::Text(key)])?;
        let row = (&mut *conn)
            .fetch_optional(sql.as_str())
            .await
            .map_err(db_err("reading idempotency key"))?;
        let Some(row) = row else { return Ok(None) };
        let fp: Vec<u8> = row
            .try_get("request_fingerprint")
            .map_err(db_err("decode"))?;
        let fingerprint_matches = Fingerprint::from_slice(&fp) == Some(fingerprint);
        let status: String = row.try_get("status").map_err(db_err("decode"))?;
        if status != "completed" {
            return Ok(Some(ClaimOutcome::InProgress {
                fingerprint_matches,
            }));
        }
        let code: Option<i16> = row.try_get("response_code").map_err(db_err("decode"))?;
        let headers: Option<String> = row.try_get("headers").map_err(db_err("decode"))?;
        let body: Option<Vec<u8>> = row.try_get("body").map_err(db_err("decode"))?;
        let headers: Vec<(String, Bytes)> = match headers {
            Some(text) => headers_from_json(text.as_bytes())?,
            None => Vec::new(),
        };
        let status = code
            .and_then(|c| u16::try_from(c).ok())
            .ok_or_else(|| StoreError::msg("completed key without a valid response code"))?;
        Ok(Some(ClaimOutcome::Completed {
            response: StoredResponse {
                status,
                headers,
                body: Bytes::from(body.unwrap_or_default()),
            },
            fingerprint_matches,
        }))
    }

    pub(crate) async fn complete_on(
        &self,
        conn: &mut PgConnection,
        scope: &str,
        key: &str,
        lease: LeaseToken,
        response: &StoredResponse,
    ) -> Result<bool, StoreError> {
        let status = status_column(response)?;
        let (lease, headers) = (lease.0.to_string(), headers_to_json(&response.headers)?);
        let sql = render(
            &self.queries.complete,
            &[
                Lit::Text(scope),
                Lit::Text(key),
                Lit::Text(&lease),
                Lit::Int(status.into()),
                Lit::Text(&headers),
                Lit::Bytes(&response.body),
            ],
        )?;
        let result = conn
            .execute(sql.as_str())
            .await
            .map_err(db_err("completing idempotency key"))?;
        Ok(result.rows_affected() == 1)
    }
}

/// A stored response's status as its column holds it.
pub(super) fn status_column(response: &StoredResponse) -> Result<i16, StoreError> {
    i16::try_from(response.status).map_err(|_| StoreError::msg("status code out of range"))
}
