//! The [`IdempotencyStore`] calls of a [`RedisStore`] and of a
//! [`RedisClusterStore`]: each one script (`scripts.rs`) on the keys of one
//! slot (`keys.rs`), its answer read back into the store's values.

use async_trait::async_trait;
use bytes::Bytes;
use redis::Value;

use crate::store::{
    check_ids, headers_from_json, headers_to_json, ClaimOutcome, ClaimRequest, Fingerprint,
    IdempotencyStore, LeaseToken, StoreError, StoredResponse,
};

use super::shared::{redis_err, Shared, SWEEP_BATCH};
use super::{RedisClusterStore, RedisStore};

/// Milliseconds, at least 1, for a script (durations past a century mean
/// "never" and are capped there, as the other stores cap them).
fn millis(d: std::time::Duration) -> u64 {
    const CENTURY_MS: u64 = 100 * 365 * 24 * 3600 * 1000;
    u64::try_from(d.as_millis())
        .unwrap_or(CENTURY_MS)
        .clamp(1, CENTURY_MS)
}

fn malformed(what: &str) -> StoreError {
    StoreError::msg(format!("Redis answered a malformed {what}"))
}

/// The bytes of a bulk string, or of a simple one.
fn bytes(value: &Value) -> Option<&[u8]> {
    match value {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.as_bytes()),
        _ => None,
    }
}

fn int(value: &Value) -> Option<i64> {
    match value {
        Value::Int(n) => Some(*n),
        other => std::str::from_utf8(bytes(other)?).ok()?.parse().ok(),
    }
}

/// A script's answer about a record.
#[derive(Debug, PartialEq)]
enum Answer {
    /// The claim won, with this epoch.
    Claimed(u64),
    /// The record's state as a claim that did not win sees it; `None`: no
    /// live record.
    Found(Option<ClaimOutcome>),
}

fn outcome(value: Value) -> Result<Answer, StoreError> {
    let items = match value {
        Value::Nil => return Ok(Answer::Found(None)),
        Value::Array(items) => items,
        // Lua's `false` arrives as nil (RESP2) or as a boolean (RESP3).
        Value::Boolean(false) => return Ok(Answer::Found(None)),
        _ => return Err(malformed("record")),
    };
    let tag = items
        .first()
        .and_then(bytes)
        .ok_or_else(|| malformed("record"))?;
    let matches = || items.get(1).and_then(int).map(|n| n == 1);
    match tag {
        b"claimed" => {
            let epoch = items
                .get(1)
                .and_then(int)
                .and_then(|e| u64::try_from(e).ok())
                .ok_or_else(|| malformed("epoch"))?;
            Ok(Answer::Claimed(epoch))
        }
        b"in_progress" => Ok(Answer::Found(Some(ClaimOutcome::InProgress {
            fingerprint_matches: matches().ok_or_else(|| malformed("record"))?,
        }))),
        b"completed" => {
            let status = items
                .get(2)
                .and_then(int)
                .and_then(|c| u16::try_from(c).ok())
                .ok_or_else(|| malformed("status code"))?;
            let headers = items.get(3).and_then(bytes).unwrap_or(b"[]");
            let headers = headers_from_json(headers)?;
            let body = items.get(4).and_then(bytes).unwrap_or_default();
            Ok(Answer::Found(Some(ClaimOutcome::Completed {
                response: StoredResponse {
                    status,
                    headers,
                    body: Bytes::copy_from_slice(body),
                },
                fingerprint_matches: matches().ok_or_else(|| malformed("record"))?,
            })))
        }
        _ => Err(malformed("record")),
    }
}

#[async_trait]
impl<C> IdempotencyStore for Shared<C>
where
    C: redis::aio::ConnectionLike + Clone + Send + Sync + 'static,
{
    async fn claim(&self, req: ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError> {
        check_ids(req.scope, req.key)?;
        self.maybe_sweep();
        let lease = LeaseToken::new_random();
        let bucket = self.keys.bucket(req.scope, req.key);
        let answer: Value = self
            .scripts
            .claim
            .key(self.keys.record(req.scope, req.key))
            .key(self.keys.epoch(bucket))
            .key(self.keys.index(bucket))
            .arg(req.fingerprint.as_bytes().as_slice())
            .arg(lease.to_string())
            .arg(millis(req.lock_timeout))
            .arg(millis(req.ttl))
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(redis_err("claiming idempotency key"))?;
        match outcome(answer)? {
            Answer::Claimed(epoch) => Ok(ClaimOutcome::Claimed { lease, epoch }),
            Answer::Found(Some(state)) => Ok(state),
            Answer::Found(None) => Err(malformed("claim")),
        }
    }

    async fn lookup(
        &self,
        scope: &str,
        key: &str,
        fingerprint: Fingerprint,
    ) -> Result<Option<ClaimOutcome>, StoreError> {
        let answer: Value = self
            .scripts
            .lookup
            .key(self.keys.record(scope, key))
            .arg(fingerprint.as_bytes().as_slice())
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(redis_err("reading idempotency key"))?;
        match outcome(answer)? {
            Answer::Claimed(_) => Err(malformed("lookup")),
            Answer::Found(found) => Ok(found),
        }
    }

    async fn complete(
        &self,
        scope: &str,
        key: &str,
        lease: LeaseToken,
        response: &StoredResponse,
    ) -> Result<bool, StoreError> {
        let headers = headers_to_json(&response.headers)?;
        let stored: i64 = self
            .scripts
            .complete
            .key(self.keys.record(scope, key))
            .key(self.keys.index(self.keys.bucket(scope, key)))
            .arg(lease.to_string())
            .arg(response.status)
            .arg(headers)
            .arg(response.body.as_ref())
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(redis_err("completing idempotency key"))?;
        Ok(stored == 1)
    }

    async fn extend_lease(
        &self,
        scope: &str,
        key: &str,
        lease: LeaseToken,
    ) -> Result<bool, StoreError> {
        let extended: i64 = self
            .scripts
            .extend
            .key(self.keys.record(scope, key))
            .arg(lease.to_string())
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(redis_err("extending an idempotency lease"))?;
        Ok(extended == 1)
    }

    async fn release(&self, scope: &str, key: &str, lease: LeaseToken) -> Result<bool, StoreError> {
        let released: i64 = self
            .scripts
            .release
            .key(self.keys.record(scope, key))
            .key(self.keys.index(self.keys.bucket(scope, key)))
            .arg(lease.to_string())
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(redis_err("releasing idempotency key"))?;
        Ok(released == 1)
    }

    /// Marks or deletes the expired records in progress, in batches, one
    /// bucket after the other (see [`RedisStore`]); Redis deletes completed
    /// ones by itself.
    async fn sweep_expired(&self) -> Result<u64, StoreError> {
        let mut deleted = 0;
        for bucket in self.keys.buckets() {
            loop {
                let (gone, looked_at): (u64, usize) = self
                    .scripts
                    .sweep
                    .key(self.keys.index(bucket))
                    .arg(SWEEP_BATCH)
                    .invoke_async(&mut self.conn.clone())
                    .await
                    .map_err(redis_err("sweeping expired idempotency keys"))?;
                deleted += gone;
                if looked_at < SWEEP_BATCH {
                    break;
                }
            }
        }
        Ok(deleted)
    }
}

/// The store trait of a public store, each call passed to its [`Shared`]
/// core.
macro_rules! through_shared {
    ($store:ty) => {
        #[async_trait]
        impl IdempotencyStore for $store {
            async fn claim(&self, req: ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError> {
                self.inner.claim(req).await
            }

            async fn lookup(
                &self,
                scope: &str,
                key: &str,
                fingerprint: Fingerprint,
            ) -> Result<Option<ClaimOutcome>, StoreError> {
                self.inner.lookup(scope, key, fingerprint).await
            }

            async fn complete(
                &self,
                scope: &str,
                key: &str,
                lease: LeaseToken,
                response: &StoredResponse,
            ) -> Result<bool, StoreError> {
                self.inner.complete(scope, key, lease, response).await
            }

            async fn extend_lease(
                &self,
                scope: &str,
                key: &str,
                lease: LeaseToken,
            ) -> Result<bool, StoreError> {
                self.inner.extend_lease(scope, key, lease).await
            }

            async fn release(
                &self,
                scope: &str,
                key: &str,
                lease: LeaseToken,
            ) -> Result<bool, StoreError> {
                self.inner.release(scope, key, lease).await
            }

            async fn sweep_expired(&self) -> Result<u64, StoreError> {
                self.inner.sweep_expired().await
            }
        }
    };
}

through_shared!(RedisStore);
through_shared!(RedisClusterStore);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_become_milliseconds_within_a_century() {
        use std::time::Duration;
        assert_eq!(millis(Duration::from_millis(1500)), 1500);
        assert_eq!(millis(Duration::ZERO), 1);
        assert_eq!(millis(Duration::MAX), 100 * 365 * 24 * 3600 * 1000);
    }

    #[test]
    fn a_malformed_answer_is_an_error_not_a_panic() {
        for value in [
            Value::Int(3),
            Value::Array(vec![]),
            Value::Array(vec![Value::BulkString(b"what".to_vec())]),
            Value::Array(vec![Value::BulkString(b"claimed".to_vec())]),
            Value::Array(vec![
                Value::BulkString(b"completed".to_vec()),
                Value::Int(1),
                Value::BulkString(b"99999".to_vec()),
            ]),
        ] {
            assert!(outcome(value.clone()).is_err(), "{value:?}");
        }
        assert_eq!(outcome(Value::Nil).unwrap(), Answer::Found(None));
    }
}
