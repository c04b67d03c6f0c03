DROP TABLE idempotency_ledger;
DROP TABLE orders;
DROP TABLE api_keys;
