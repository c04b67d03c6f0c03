DROP INDEX IF EXISTS orders_user_id_key;
