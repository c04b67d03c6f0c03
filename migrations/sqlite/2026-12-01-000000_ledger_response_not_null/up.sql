-- Every committed ledger entry is complete: the entry is written with its
-- response, after the change, in one transaction. So the response columns
-- become NOT NULL. SQLite cannot ALTER a column: the table is rebuilt.
--
-- A row without a response can only be one a claim-first version of the
-- service committed for a request still running or since died. Such a row
-- answers nothing (it only blocks its key until it expires), so it is
-- deleted as incomplete; the order, if one was made, still guards its key
-- through `orders_user_idempotency_key`.
DELETE FROM idempotency_ledger
WHERE response_status IS NULL OR response_headers IS NULL OR response_body IS NULL;

CREATE TABLE idempotency_ledger_complete (
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
INSERT INTO idempotency_ledger_complete
    (idempotency_key, user_id, request_fingerprint, response_status,
     response_headers, response_body, created_at, expires_at)
SELECT idempotency_key, user_id, request_fingerprint, response_status,
       response_headers, response_body, created_at, expires_at
FROM idempotency_ledger;
DROP TABLE idempotency_ledger;
ALTER TABLE idempotency_ledger_complete RENAME TO idempotency_ledger;
CREATE INDEX idempotency_ledger_expires_at ON idempotency_ledger (expires_at);
