CREATE TABLE bookings (
    id                  TEXT    PRIMARY KEY,
    guest               TEXT    NOT NULL,
    idempotency_key     TEXT    NOT NULL,
    request_fingerprint TEXT    NOT NULL,
    room                TEXT    NOT NULL,
    nights              INTEGER NOT NULL,
    status              TEXT    NOT NULL,
    UNIQUE (guest, idempotency_key)
);
