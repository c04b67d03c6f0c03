-- The client's outbox: one row per operation, written (and fsynced) before
-- the operation is ever sent. Nothing here is shared with the server's schema.
CREATE TABLE operations (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    method          TEXT    NOT NULL CHECK (method IN ('POST', 'PATCH', 'DELETE')),
    -- `{order}` in the path stands for the id of the order `target_op` answered with.
    path            TEXT    NOT NULL,
    target_op       INTEGER REFERENCES operations (id),
    body            TEXT,
    idempotency_key TEXT    NOT NULL UNIQUE,
    -- Operations of one resource are sent in id order: `op:N` (the order
    -- operation N created) or `order:ID` (an order created elsewhere).
    resource        TEXT    NOT NULL,
    state           TEXT    NOT NULL CHECK (state IN ('pending', 'done', 'failed')),
    attempts        INTEGER NOT NULL DEFAULT 0,
    created_at      INTEGER NOT NULL,          -- Unix milliseconds, like every time here
    next_attempt_at INTEGER NOT NULL,
    lease_owner     TEXT,
    lease_until     INTEGER,
    response_status INTEGER,
    response_body   TEXT,
    last_error      TEXT
);
CREATE INDEX operations_pending ON operations (state, resource, id);
