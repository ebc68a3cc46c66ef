-- tower-idempotency 0.1, failover fencing: a takeover waits a lock timeout
-- after a claim first found the lease stale (stale_seen_at), and each lease
-- extension renews the record's time to live (ttl). Safe to run again.
ALTER TABLE idempotency_keys ADD COLUMN IF NOT EXISTS stale_seen_at timestamptz;
ALTER TABLE idempotency_keys ADD COLUMN IF NOT EXISTS ttl interval;
