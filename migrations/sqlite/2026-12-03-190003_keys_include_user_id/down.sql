-- The keys as they were: `UNIQUE (id)` again, and the index on
-- `(user_id, seq DESC)` in place of the two unique indexes.
CREATE TABLE orders_unkeyed (
    seq                 INTEGER PRIMARY KEY AUTOINCREMENT,
    id                  TEXT    NOT NULL UNIQUE,
    user_id             TEXT    NOT NULL,
    item                TEXT    NOT NULL CHECK (length(item) BETWEEN 1 AND 200),
    quantity            INTEGER NOT NULL CHECK (quantity BETWEEN 1 AND 1000000),
    price_cents         INTEGER NOT NULL CHECK (price_cents BETWEEN 0 AND 100000000000),
    status              TEXT    NOT NULL CHECK (status IN ('pending', 'cancelled')),
    idempotency_key     TEXT    NOT NULL,
    request_fingerprint TEXT    NOT NULL,
    created_at          TEXT    NOT NULL,
    updated_at          TEXT    NOT NULL,
    CONSTRAINT orders_user_idempotency_key UNIQUE (user_id, idempotency_key)
);
INSERT INTO orders_unkeyed
    (seq, id, user_id, item, quantity, price_cents, status, idempotency_key,
     request_fingerprint, created_at, updated_at)
SELECT seq, id, user_id, item, quantity, price_cents, status, idempotency_key,
       request_fingerprint, created_at, updated_at
FROM orders;
DELETE FROM sqlite_sequence WHERE name = 'orders_unkeyed';
INSERT INTO sqlite_sequence (name, seq)
SELECT 'orders_unkeyed', seq FROM sqlite_sequence WHERE name = 'orders';
DROP TABLE orders;
ALTER TABLE orders_unkeyed RENAME TO orders;
CREATE INDEX orders_user_seq ON orders (user_id, seq DESC);
