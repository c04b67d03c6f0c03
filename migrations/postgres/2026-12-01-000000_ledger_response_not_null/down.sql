-- The response columns nullable again (the rows deleted as incomplete do
-- not come back).
ALTER TABLE idempotency_ledger
    ALTER COLUMN response_status DROP NOT NULL,
    ALTER COLUMN response_headers DROP NOT NULL,
    ALTER COLUMN response_body DROP NOT NULL;
