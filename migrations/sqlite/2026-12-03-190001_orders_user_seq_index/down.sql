DROP INDEX IF EXISTS orders_user_seq_key;
