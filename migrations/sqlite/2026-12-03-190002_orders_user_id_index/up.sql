-- The unique index on `(user_id, id)`, which serves every lookup by id (each
-- names its user) and replaces `UNIQUE (id)` in `…_keys_include_user_id`.
CREATE UNIQUE INDEX orders_user_id_key ON orders (user_id, id);
