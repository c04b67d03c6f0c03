-- API keys: only a SHA-256 hash of each token is stored.
CREATE TABLE api_keys (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    user_id      TEXT    NOT NULL CHECK (length(user_id) BETWEEN 1 AND 100),
    token_hash   TEXT    NOT NULL UNIQUE,
    token_prefix TEXT    NOT NULL,
    created_at   TEXT    NOT NULL,
    revoked_at   TEXT
);

-- Orders. `seq` gives an exact creation order for keyset pagination;
-- `id` is the public, opaque UUID. Money is integer cents.
CREATE TABLE orders (
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
    -- The second guard: outlives the ledger's retention.
    CONSTRAINT orders_user_idempotency_key UNIQUE (user_id, idempotency_key)
);
CREATE INDEX orders_user_seq ON orders (user_id, seq DESC);

-- The generic idempotency ledger: one row per (key, user), written in the
-- same transaction as the mutation it guards.
CREATE TABLE idempotency_ledger (
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
CREATE INDEX idempotency_ledger_expires_at ON idempotency_ledger (expires_at);
