-- The keys as they were. The indexes of `…_orders_user_seq_index` and
-- `…_orders_user_id_index` go with the constraints; their own down
-- migrations then find nothing to drop.
CREATE INDEX orders_user_seq ON orders (user_id, seq DESC);

ALTER TABLE orders
    DROP CONSTRAINT orders_pkey,
    ADD CONSTRAINT orders_pkey PRIMARY KEY (seq),
    DROP CONSTRAINT orders_user_id_key,
    ADD CONSTRAINT orders_id_key UNIQUE (id);
