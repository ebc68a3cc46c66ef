-- tower-idempotency: one row per (scope, key).
-- PostgresStore::migrate() runs this file (with the table name substituted when
-- PostgresStore::with_table is used). It is idempotent and may be run again.
CREATE TABLE IF NOT EXISTS idempotency_keys (
    scope               text        NOT NULL,
    key                 text        NOT NULL,
    request_fingerprint bytea       NOT NULL,
    status              text        NOT NULL CHECK (status IN ('in_progress', 'completed')),
    response_code       smallint,
    headers             jsonb,
    body                bytea,
    created_at          timestamptz NOT NULL,
    locked_at           timestamptz,
    lock_token          uuid,
    expires_at          timestamptz NOT NULL,
    PRIMARY KEY (scope, key)
);

CREATE INDEX IF NOT EXISTS idempotency_keys_expires_at_idx ON idempotency_keys (expires_at);
