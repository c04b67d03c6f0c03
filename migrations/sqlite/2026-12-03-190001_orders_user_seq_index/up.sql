-- The first of three migrations after which every key of `orders` but
-- SQLite's own rowid includes `user_id`, as on PostgreSQL (where a table
-- distributed by `user_id` needs it): the unique index on `(user_id, seq)`.
-- (On PostgreSQL it is built concurrently, alone in its migration.)
CREATE UNIQUE INDEX orders_user_seq_key ON orders (user_id, seq);
