-- The order each done operation was answered with, read once from its
-- answer by the client (`stored::answered_order`) when it records the
-- answer. An operation on that order looks it up here, never in the
-- answer's text. Operations answered before this table existed are filled
-- in by the client, with the same reader, in the transaction that applies
-- this migration.
CREATE TABLE operation_orders (
    operation_id INTEGER PRIMARY KEY REFERENCES operations (id),
    order_id     TEXT    NOT NULL
);
CREATE INDEX operation_orders_order ON operation_orders (order_id);
