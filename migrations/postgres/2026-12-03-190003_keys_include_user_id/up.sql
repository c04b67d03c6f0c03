-- Every primary key and unique constraint of `orders` includes `user_id`:
--   PRIMARY KEY (user_id, seq)                      was PRIMARY KEY (seq)
--   orders_user_id_key UNIQUE (user_id, id)         was UNIQUE (id)
--   orders_user_idempotency_key UNIQUE (user_id, idempotency_key), as it was.
-- A table distributed by `user_id` (docs/SCALING.md, Citus) can then enforce
-- each on one shard. `seq` and `id` stay unique on their own (an identity
-- column and UUIDv7), so nothing the service reads or writes changes: every
-- statement already names the user. `idempotency_ledger`'s key,
-- `(idempotency_key, user_id)`, includes `user_id` already.
--
-- The two indexes were built concurrently by the migrations before this
-- one; this only makes them the constraints (a brief exclusive lock, no
-- scan) and drops the index the new primary key makes redundant: the list,
-- `WHERE user_id = $1 AND seq < $2 ORDER BY seq DESC`, reads
-- `(user_id, seq)` backwards.
ALTER TABLE orders
    DROP CONSTRAINT orders_pkey,
    ADD CONSTRAINT orders_pkey PRIMARY KEY USING INDEX orders_user_seq_key,
    DROP CONSTRAINT orders_id_key,
    ADD CONSTRAINT orders_user_id_key UNIQUE USING INDEX orders_user_id_key;

DROP INDEX orders_user_seq;
