-- tower-idempotency 0.1, fencing epochs: each claim of a key gets a number
-- greater than every earlier claim's (the database's time in microseconds,
-- or one more than the key's last epoch), handed to the handler so that
-- the systems its effects land in can refuse a stale owner. Safe to run
-- again.
ALTER TABLE idempotency_keys ADD COLUMN IF NOT EXISTS epoch bigint NOT NULL DEFAULT 0;
