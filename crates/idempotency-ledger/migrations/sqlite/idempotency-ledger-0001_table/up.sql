-- The idempotency ledger's table: one entry per (key, user), each written
-- with its response in the same transaction as the change it answers.
-- `IF NOT EXISTS`: a database whose own migrations already made it keeps it.
CREATE TABLE IF NOT EXISTS idempotency_ledger (
    idempotency_key     TEXT    NOT NULL,
    user_id             TEXT    NOT NULL,
    request_fingerprint TEXT    NOT NULL,
    response_status     INTEGER NOT NULL,
    response_headers    TEXT    NOT NULL,
    response_body       BLOB    NOT NULL,
    created_at          TEXT    NOT NULL,
    expires_at          TEXT    NOT NULL,
    PRIMARY KEY (idempotency_key, user_id)
);
CREATE INDEX IF NOT EXISTS idempotency_ledger_expires_at ON idempotency_ledger (expires_at);
