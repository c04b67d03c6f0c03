-- The idempotency ledger's table on SQLite: one entry per (key, user), each
-- written with its response in the same transaction as the change it
-- answers. Add it to the application's migrations.
CREATE TABLE idempotency_ledger (
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
CREATE INDEX idempotency_ledger_expires_at ON idempotency_ledger (expires_at);
