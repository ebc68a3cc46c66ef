//! The SQL the store runs: the crate's migrations, and every statement on
//! the table, with the table's name in it. Plain text: uses nothing of the
//! crate.
//!
//! Every statement is sent as a simple query, its values written into it
//! as literals ([`Template::render`]): one message, one round trip, and no
//! prepared statement. A named prepared statement lives on one server
//! connection, which a transaction-mode pooler (PgBouncer's
//! `pool_mode = transaction`) hands to another client after each
//! transaction (`prepared statement "sqlx_s_3" does not exist`); an unnamed
//! one is parsed and executed in two exchanges, which that pooler may send
//! to two servers. A simple query is carried whole by any pooler, and on a
//! new connection it costs no `PREPARE` round trip either.

use std::time::Duration;

/// The SQL of the crate's migrations, in order, for the default table
/// `idempotency_keys`.
pub const MIGRATION_SQL: &str = concat!(
    include_str!("../../migrations/0001_create_idempotency_keys.sql"),
    include_str!("../../migrations/0002_lease_fencing.sql"),
    include_str!("../../migrations/0003_fencing_epoch.sql"),
);

pub(super) const DEFAULT_TABLE: &str = "idempotency_keys";

/// Durations are bound as seconds; longer ones mean "never" and are capped
/// here so that `now() + interval` cannot overflow.
const MAX_INTERVAL_SECS: f64 = 100.0 * 365.0 * 24.0 * 3600.0;

pub(super) fn interval_secs(d: Duration) -> f64 {
    d.as_secs_f64().min(MAX_INTERVAL_SECS)
}

/// A value written into a statement as a literal.
#[derive(Debug, Clone, Copy)]
pub(super) enum Lit<'a> {
    /// A string (`E'...'`, escaped).
    Text(&'a str),
    /// A `bytea` (`decode('<hex>', 'hex')`).
    Bytes(&'a [u8]),
    /// A number of seconds, or any other float.
    Float(f64),
    /// An integer.
    Int(i64),
}

/// A statement with placeholders `$1`, `$2`, ... split out, rendered into
/// a simple query with its values as literals.
#[derive(Debug)]
pub(super) struct Template {
    /// Text, then the index of the value that follows it (0-based), ...;
    /// the last piece has none.
    pieces: Vec<(String, Option<usize>)>,
}

impl Template {
    fn new(sql: String) -> Self {
        let mut pieces = Vec::new();
        let mut text = String::new();
        let mut chars = sql.chars().peekable();
        while let Some(c) = chars.next() {
            let mut digits = String::new();
            while c == '$' && chars.peek().is_some_and(char::is_ascii_digit) {
                digits.extend(chars.next());
            }
            match digits.parse::<usize>() {
                Ok(n) if n > 0 => pieces.push((std::mem::take(&mut text), Some(n - 1))),
                _ => text.push(c),
            }
        }
        pieces.push((text, None));
        Self { pieces }
    }

    /// The statement with `args` written in (`$1` is `args[0]`). `None`
    /// when a string holds a NUL character (which neither a simple query
    /// nor a `text` column can carry) or a placeholder has no value.
    pub(super) fn render(&self, args: &[Lit<'_>]) -> Option<String> {
        let mut sql = String::with_capacity(512);
        for (text, arg) in &self.pieces {
            sql.push_str(text);
            if let Some(i) = arg {
                push_literal(&mut sql, *args.get(*i)?)?;
            }
        }
        Some(sql)
    }
}

/// Writes `lit` into `sql`; `None` for a string with a NUL character.
fn push_literal(sql: &mut String, lit: Lit<'_>) -> Option<()> {
    use std::fmt::Write;
    match lit {
        Lit::Text(text) if text.contains('\0') => return None,
        Lit::Text(text) => {
            sql.push_str("E'");
            sql.push_str(&escaped(text));
            sql.push('\'');
        }
        Lit::Bytes(bytes) => {
            sql.push_str("decode('");
            push_hex(sql, bytes);
            sql.push_str("', 'hex')");
        }
        // Display never writes an exponent; written like this, the
        // literal is a `numeric`, cast by the statement.
        Lit::Float(value) => write!(sql, "{value}").ok()?,
        Lit::Int(value) => write!(sql, "{value}").ok()?,
    }
    Some(())
}

/// `bytes` as hexadecimal digits.
fn push_hex(out: &mut String, bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    out.reserve(bytes.len() * 2);
    for byte in bytes {
        out.push(char::from(DIGITS[usize::from(byte >> 4)]));
        out.push(char::from(DIGITS[usize::from(byte & 0xf)]));
    }
}

#[derive(Debug)]
pub(super) struct Queries {
    pub(super) table: String,
    pub(super) claim: Template,
    pub(super) select: Template,
    pub(super) mark_stale: Template,
    pub(super) complete: Template,
    /// [`complete`](Self::complete) with bind parameters, for a body too
    /// large to write into the query (inside a transaction only: see the
    /// module's docs).
    pub(super) complete_bound: String,
    pub(super) extend: Template,
    pub(super) release: Template,
    pub(super) sweep: Template,
}

impl Queries {
    pub(super) fn new(t: &str) -> Self {
        let complete = format!(
            "UPDATE {t} SET status = 'completed', response_code = $4, headers = $5::jsonb, \
             body = $6, locked_at = NULL, lock_token = NULL \
             WHERE scope = $1 AND key = $2 AND status = 'in_progress' \
             AND lock_token = $3::uuid"
        );
        Self {
            table: t.to_owned(),
            complete: Template::new(complete.clone()),
            complete_bound: complete,
            // $4: ttl in seconds, $5: lease, $6: lock timeout in seconds.
            // A row in progress under the lease $5 is this claim's own,
            // repeated after its answer was lost: claimed again.
            claim: Template::new(format!(
                "INSERT INTO {t} AS t (scope, key, request_fingerprint, status, created_at, \
                 locked_at, lock_token, expires_at, ttl, epoch) \
                 VALUES ($1, $2, $3, 'in_progress', now(), now(), $5::uuid, \
                 now() + make_interval(secs => $4::float8), make_interval(secs => $4::float8), \
                 GREATEST(1, floor(extract(epoch FROM now()) * 1000000)::bigint)) \
                 ON CONFLICT (scope, key) DO UPDATE SET \
                 request_fingerprint = EXCLUDED.request_fingerprint, status = 'in_progress', \
                 response_code = NULL, headers = NULL, body = NULL, \
                 created_at = EXCLUDED.created_at, locked_at = EXCLUDED.locked_at, \
                 lock_token = EXCLUDED.lock_token, expires_at = EXCLUDED.expires_at, \
                 ttl = EXCLUDED.ttl, stale_seen_at = NULL, \
                 epoch = GREATEST(EXCLUDED.epoch, t.epoch + 1) \
                 WHERE (t.expires_at <= now() AND t.status <> 'in_progress') \
                 OR (t.status = 'in_progress' AND t.lock_token = $5::uuid) \
                 OR (t.status = 'in_progress' \
                     AND t.locked_at <= now() - make_interval(secs => $6::float8) \
                     AND t.stale_seen_at > t.locked_at \
                     AND t.stale_seen_at <= now() - make_interval(secs => $6::float8)) \
                 RETURNING epoch"
            )),
            select: Template::new(format!(
                "SELECT request_fingerprint, status, response_code, headers::text AS headers, body \
                 FROM {t} WHERE scope = $1 AND key = $2 \
                 AND (expires_at > now() OR status = 'in_progress')"
            )),
            // First sight of a stale lease, whatever its fingerprint ($3:
            // the lock timeout in seconds): a takeover waits a lock
            // timeout after it.
            mark_stale: Template::new(format!(
                "UPDATE {t} SET stale_seen_at = now() \
                 WHERE scope = $1 AND key = $2 AND status = 'in_progress' \
                 AND locked_at <= now() - make_interval(secs => $3::float8) \
                 AND (stale_seen_at IS NULL OR stale_seen_at <= locked_at)"
            )),
            extend: Template::new(format!(
                "UPDATE {t} SET locked_at = now(), \
                 expires_at = GREATEST(expires_at, now() + ttl) \
                 WHERE scope = $1 AND key = $2 AND status = 'in_progress' \
                 AND lock_token = $3::uuid"
            )),
            release: Template::new(format!(
                "DELETE FROM {t} WHERE scope = $1 AND key = $2 AND status = 'in_progress' \
                 AND lock_token = $3::uuid"
            )),
            // One bounded batch ($1 rows); replicas sweeping at once skip
            // each other's rows instead of waiting on them. An expired row
            // in progress may still have an owner cut off from the database
            // for longer than its expiry: the takeover's two steps, as a
            // claim takes them. The first sweep marks it seen stale; one a
            // time to live later, with no extension since, deletes it.
            sweep: Template::new(format!(
                "WITH marked AS (UPDATE {t} SET stale_seen_at = now() WHERE ctid IN \
                 (SELECT ctid FROM {t} WHERE expires_at <= now() AND status = 'in_progress' \
                 AND (stale_seen_at IS NULL OR stale_seen_at <= locked_at) \
                 LIMIT $1 FOR UPDATE SKIP LOCKED)) \
                 DELETE FROM {t} WHERE ctid IN (SELECT ctid FROM {t} WHERE expires_at <= now() \
                 AND (status <> 'in_progress' \
                 OR (stale_seen_at > locked_at AND stale_seen_at <= now() - ttl)) \
                 LIMIT $1 FOR UPDATE SKIP LOCKED)"
            )),
        }
    }
}

/// The largest body written into a completion sent with its `COMMIT`: as
/// hexadecimal digits it doubles in the query and is parsed as text, where
/// a bound parameter travels as it is; a larger body is stored with bind
/// parameters in an unnamed statement, then committed (three round trips:
/// parse, execute, commit; no copy of its size).
pub(super) const INLINE_BODY_LIMIT: usize = 16 * 1024;

/// The completion of `(scope, key)` under the lease `lease`, then `COMMIT`,
/// then `BEGIN`, as one simple query (one round trip), every value written
/// into it: an `UPDATE` by primary key is cheap to plan. When the lease is
/// not current the `UPDATE` changes no row and the `SELECT` around it
/// divides by zero (22012): the transaction is aborted and the `COMMIT`
/// never runs. The `BEGIN` after it leaves the connection in an empty
/// transaction, as the caller's `Transaction` still believes it is: its
/// `ROLLBACK` then ends that one, not a transaction that is no more.
/// `None` when a value holds a NUL character, which a simple query cannot
/// carry, or when the body is over [`INLINE_BODY_LIMIT`].
pub(super) fn complete_and_commit(
    table: &str,
    scope: &str,
    key: &str,
    lease: &str,
    status: i16,
    headers: &str,
    body: &[u8],
) -> Option<String> {
    if body.len() > INLINE_BODY_LIMIT || [scope, key, headers].iter().any(|t| t.contains('\0')) {
        return None;
    }
    let mut hex = String::new();
    push_hex(&mut hex, body);
    let (scope, key, headers) = (escaped(scope), escaped(key), escaped(headers));
    Some(format!(
        "WITH done AS (UPDATE {table} SET status = 'completed', response_code = {status}, \
         headers = E'{headers}'::jsonb, body = decode('{hex}', 'hex'), locked_at = NULL, \
         lock_token = NULL WHERE scope = E'{scope}' AND key = E'{key}' \
         AND status = 'in_progress' AND lock_token = '{lease}'::uuid RETURNING 1) \
         SELECT 1 / count(*)::int FROM done; COMMIT; BEGIN"
    ))
}

/// `text` for the inside of an `E'...'` literal, whose meaning does not
/// depend on `standard_conforming_strings`.
fn escaped(text: &str) -> String {
    text.replace('\\', "\\\\").replace('\'', "''")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sql(body: &[u8], headers: &str) -> Option<String> {
        complete_and_commit(
            "t",
            "s",
            "k",
            "00000000-0000-0000-0000-000000000000",
            201,
            headers,
            body,
        )
    }

    #[test]
    fn a_template_takes_its_values_as_escaped_literals() {
        let t = Template::new("SELECT $1, $2::float8, $3, $10 FROM t WHERE a = $1".to_owned());
        let fp = [0xab, 1];
        let args = [Lit::Text("it's \\"), Lit::Float(0.5), Lit::Bytes(&fp)];
        assert_eq!(t.render(&args), None, "$10 has no value");
        let t = Template::new("SELECT $1, $2::float8, $3, $4 WHERE a = $1".to_owned());
        let args = [args[0], args[1], args[2], Lit::Int(-3)];
        assert_eq!(
            t.render(&args).unwrap(),
            r"SELECT E'it''s \\', 0.5::float8, decode('ab01', 'hex'), -3 WHERE a = E'it''s \\'"
        );
        assert_eq!(
            t.render(&[Lit::Text("a\0"), args[1], args[2], args[3]]),
            None
        );
        let big = Template::new("$1".to_owned()).render(&[Lit::Float(3_153_600_000.0)]);
        assert_eq!(big.as_deref(), Some("3153600000"));
    }

    #[test]
    fn a_body_over_the_inline_limit_is_bound_not_written_into_the_query() {
        assert!(sql(&[7; INLINE_BODY_LIMIT], "[]").is_some());
        assert!(sql(&[7; INLINE_BODY_LIMIT + 1], "[]").is_none());
    }

    #[test]
    fn values_are_written_escaped_and_the_body_as_hex() {
        let query = sql(b"\x01\xab", r#"[["x-a","it's \\ ok"]]"#).expect("inline");
        assert!(query.contains("decode('01ab', 'hex')"), "{query}");
        assert!(query.contains(r#"E'[["x-a","it''s \\\\ ok"]]'"#), "{query}");
        assert!(
            sql(b"", "[\"\0\"]").is_none(),
            "a NUL goes by bind parameters"
        );
    }
}
