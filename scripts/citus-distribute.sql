-- Distributes orders-api's tables on Citus, by user: docs/SCALING.md,
-- "Sharded by user on Citus", gives the whole recipe. Run it on the
-- coordinator, in the service's database, after `orders-api migrate`:
--
--   psql "postgres://ADMIN@COORDINATOR/orders" -v ON_ERROR_STOP=1 \
--        -f scripts/citus-distribute.sql
--
-- - `orders` and `idempotency_ledger`: distributed by `user_id`, colocated
--   (a user's orders and ledger entries in shards of the same worker, so a
--   request's transaction, which writes both, is on one node);
-- - `api_keys`: a reference table (a copy on every node; a token is looked
--   up by its hash, never by user).
--
-- Safe to run twice: a table is distributed only while `pg_dist_partition`
-- does not list it, and one that Citus lists another way (another
-- distribution column, not colocated, not a reference table) stops the
-- script with an error instead of being changed. Rows already in a table
-- are moved into its shards, and their local copy, no longer read, is
-- truncated.
\set ON_ERROR_STOP on

DO $check$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus') THEN
        RAISE EXCEPTION 'the citus extension is not installed in database %', current_database()
            USING HINT = 'CREATE EXTENSION citus; in this database, on the coordinator and on every worker';
    END IF;
    IF NOT citus_is_coordinator() THEN
        RAISE EXCEPTION 'this is not the Citus coordinator'
            USING HINT = 'run this script, orders-api migrate and every orders-api server against the coordinator';
    END IF;
    IF to_regclass('orders') IS NULL OR to_regclass('idempotency_ledger') IS NULL
       OR to_regclass('api_keys') IS NULL THEN
        RAISE EXCEPTION 'the tables of orders-api are missing in database %', current_database()
            USING HINT = 'run orders-api migrate against this database first';
    END IF;
END
$check$;

-- api_keys: a reference table.
DO $api_keys$
DECLARE
    layout pg_dist_partition%ROWTYPE;
BEGIN
    SELECT * INTO layout FROM pg_dist_partition WHERE logicalrelid = 'api_keys'::regclass;
    IF NOT FOUND THEN
        PERFORM create_reference_table('api_keys');
        PERFORM truncate_local_data_after_distributing_table('api_keys');
    ELSIF NOT (layout.partmethod = 'n' AND layout.repmodel = 't') THEN
        RAISE EXCEPTION 'api_keys is a Citus table already, but not a reference table';
    END IF;
END
$api_keys$;

-- orders: distributed by user_id.
DO $orders$
DECLARE
    layout pg_dist_partition%ROWTYPE;
BEGIN
    SELECT * INTO layout FROM pg_dist_partition WHERE logicalrelid = 'orders'::regclass;
    IF NOT FOUND THEN
        PERFORM create_distributed_table('orders', 'user_id');
        PERFORM truncate_local_data_after_distributing_table('orders');
    ELSIF layout.partmethod <> 'h'
          OR column_to_column_name(layout.logicalrelid, layout.partkey) <> 'user_id' THEN
        RAISE EXCEPTION 'orders is a Citus table already, but not distributed by user_id';
    END IF;
END
$orders$;

-- idempotency_ledger: distributed by user_id, in the shards of orders.
DO $ledger$
DECLARE
    layout pg_dist_partition%ROWTYPE;
BEGIN
    SELECT * INTO layout FROM pg_dist_partition WHERE logicalrelid = 'idempotency_ledger'::regclass;
    IF NOT FOUND THEN
        PERFORM create_distributed_table('idempotency_ledger', 'user_id', colocate_with => 'orders');
        PERFORM truncate_local_data_after_distributing_table('idempotency_ledger');
    ELSIF layout.partmethod <> 'h'
          OR column_to_column_name(layout.logicalrelid, layout.partkey) <> 'user_id'
          OR layout.colocationid <> (SELECT colocationid FROM pg_dist_partition
                                     WHERE logicalrelid = 'orders'::regclass) THEN
        RAISE EXCEPTION 'idempotency_ledger is a Citus table already, but not distributed by user_id with orders';
    END IF;
END
$ledger$;

-- What the tables are now.
SELECT logicalrelid AS "table",
       CASE WHEN partmethod = 'h'
            THEN 'distributed by ' || column_to_column_name(logicalrelid, partkey)
            ELSE 'reference' END AS layout,
       colocationid AS colocation
FROM pg_dist_partition
WHERE logicalrelid IN ('api_keys'::regclass, 'orders'::regclass, 'idempotency_ledger'::regclass)
ORDER BY 1;
