-- Every unique key of `orders` includes `user_id`, as on PostgreSQL:
--   orders_user_seq_key UNIQUE (user_id, seq)
--   orders_user_id_key UNIQUE (user_id, id)          in place of UNIQUE (id)
--   orders_user_idempotency_key UNIQUE (user_id, idempotency_key), as it was.
-- But for one: `seq` stays the INTEGER PRIMARY KEY AUTOINCREMENT, the rowid.
-- Only such a column is numbered by SQLite itself, increasing and never
-- reused (its high-water mark is kept in `sqlite_sequence`), and that is what
-- keeps the list's newest-first order exact; a composite primary key would
-- leave `seq` unnumbered. SQLite is never distributed, so this key costs
-- nothing; PostgreSQL's primary key is `(user_id, seq)`.
--
-- SQLite cannot drop a column's UNIQUE: the table is rebuilt (create the
-- new one, copy the rows with their `seq`, carry the high-water mark, drop
-- the old, rename, recreate the indexes). The index on `(user_id, seq DESC)`
-- goes with the old table: the list reads `(user_id, seq)` backwards.
CREATE TABLE orders_keyed (
    seq                 INTEGER PRIMARY KEY AUTOINCREMENT,
    id                  TEXT    NOT NULL,
    user_id             TEXT    NOT NULL,
    item                TEXT    NOT NULL CHECK (length(item) BETWEEN 1 AND 200),
    quantity            INTEGER NOT NULL CHECK (quantity BETWEEN 1 AND 1000000),
    price_cents         INTEGER NOT NULL CHECK (price_cents BETWEEN 0 AND 100000000000),
    status              TEXT    NOT NULL CHECK (status IN ('pending', 'cancelled')),
    idempotency_key     TEXT    NOT NULL,
    request_fingerprint TEXT    NOT NULL,
    created_at          TEXT    NOT NULL,
    updated_at          TEXT    NOT NULL,
    -- The second guard: outlives the ledger's retention.
    CONSTRAINT orders_user_idempotency_key UNIQUE (user_id, idempotency_key)
);
INSERT INTO orders_keyed
    (seq, id, user_id, item, quantity, price_cents, status, idempotency_key,
     request_fingerprint, created_at, updated_at)
SELECT seq, id, user_id, item, quantity, price_cents, status, idempotency_key,
       request_fingerprint, created_at, updated_at
FROM orders;
-- The next `seq` continues after every one ever given, not only after the
-- rows copied.
DELETE FROM sqlite_sequence WHERE name = 'orders_keyed';
INSERT INTO sqlite_sequence (name, seq)
SELECT 'orders_keyed', seq FROM sqlite_sequence WHERE name = 'orders';
DROP TABLE orders;
ALTER TABLE orders_keyed RENAME TO orders;
CREATE UNIQUE INDEX orders_user_seq_key ON orders (user_id, seq);
CREATE UNIQUE INDEX orders_user_id_key ON orders (user_id, id);
