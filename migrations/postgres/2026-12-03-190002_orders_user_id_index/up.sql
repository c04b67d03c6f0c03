-- The index of the unique key to be, `(user_id, id)`, built without
-- blocking writes (see `…_orders_user_seq_index`); a lookup by id names its
-- user, so this index serves it. `…_keys_include_user_id` makes it the key
-- in place of `UNIQUE (id)`.
CREATE UNIQUE INDEX CONCURRENTLY orders_user_id_key ON orders (user_id, id);
