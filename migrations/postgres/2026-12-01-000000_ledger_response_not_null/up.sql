-- Every committed ledger entry is complete: the entry is written with its
-- response, after the change, in one transaction. So the response columns
-- become NOT NULL.
--
-- A row without a response can only be one a claim-first version of the
-- service committed for a request still running or since died. Such a row
-- answers nothing (it only blocks its key until it expires), so it is
-- deleted as incomplete; the order, if one was made, still guards its key
-- through `orders_user_idempotency_key`.
--
-- `SET NOT NULL` reads the whole table once under an exclusive lock; the
-- ledger holds only the entries of one retention period, and the binaries
-- that may still run during a rolling upgrade write every column already.
DELETE FROM idempotency_ledger
WHERE response_status IS NULL OR response_headers IS NULL OR response_body IS NULL;

ALTER TABLE idempotency_ledger
    ALTER COLUMN response_status SET NOT NULL,
    ALTER COLUMN response_headers SET NOT NULL,
    ALTER COLUMN response_body SET NOT NULL;
