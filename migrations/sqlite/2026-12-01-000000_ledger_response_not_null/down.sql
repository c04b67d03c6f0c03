-- The response columns nullable again (the rows deleted as incomplete do
-- not come back).
CREATE TABLE idempotency_ledger_nullable (
    idempotency_key     TEXT    NOT NULL,
    user_id             TEXT    NOT NULL,
    request_fingerprint TEXT    NOT NULL,
    response_status     INTEGER,
    response_headers    TEXT,
    response_body       BLOB,
    created_at          TEXT    NOT NULL,
    expires_at          TEXT    NOT NULL,
    PRIMARY KEY (idempotency_key, user_id)
);
INSERT INTO idempotency_ledger_nullable
    (idempotency_key, user_id, request_fingerprint, response_status,
     response_headers, response_body, created_at, expires_at)
SELECT idempotency_key, user_id, request_fingerprint, response_status,
       response_headers, response_body, created_at, expires_at
FROM idempotency_ledger;
DROP TABLE idempotency_ledger;
ALTER TABLE idempotency_ledger_nullable RENAME TO idempotency_ledger;
CREATE INDEX idempotency_ledger_expires_at ON idempotency_ledger (expires_at);
