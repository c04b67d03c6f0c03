//! What the benchmark reads and writes in the database directly: the
//! expired ledger backlog, and the counts that check each case.

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::sql_types::BigInt;
use orders_api::db::{self, Pool};

/// `count` ledger entries that expired an hour ago.
pub(crate) fn add_expired_backlog(pool: &Pool, count: i64) {
    let mut pooled = pool.get().expect("connection");
    match pooled.conn() {
        db::Conn::Sqlite(c) => c
            .batch_execute(&format!(
                "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {count})
                 INSERT INTO idempotency_ledger (idempotency_key, user_id, request_fingerprint,
                     response_status, response_headers, response_body, created_at, expires_at)
                 SELECT 'expired-' || i, 'bench', 'fp', 201, '[]', x'7b7d',
                        '2026-01-01 00:00:00.000000+00:00', '2026-01-02 00:00:00.000000+00:00' FROM n;"
            ))
            .expect("expired backlog"),
        db::Conn::Postgres(c) => c
            .batch_execute(&format!(
                "INSERT INTO idempotency_ledger (idempotency_key, user_id, request_fingerprint,
                     response_status, response_headers, response_body, created_at, expires_at)
                 SELECT 'expired-' || i, 'bench', 'fp', 201, '[]', '\\x7b7d',
                        now() - interval '2 days', now() - interval '1 day'
                 FROM generate_series(1, {count}) AS i;"
            ))
            .expect("expired backlog"),
    }
}

/// Orders in the database: after a create case, one more per create.
pub(crate) fn order_total(pool: &Pool) -> i64 {
    #[derive(QueryableByName)]
    struct Count {
        #[diesel(sql_type = BigInt)]
        n: i64,
    }
    let sql = "SELECT count(*) AS n FROM orders";
    let mut pooled = pool.get().expect("connection");
    let counted: QueryResult<Count> = match pooled.conn() {
        db::Conn::Sqlite(c) => diesel::sql_query(sql).get_result(c),
        db::Conn::Postgres(c) => diesel::sql_query(sql).get_result(c),
    };
    counted.map(|c| c.n).expect("count orders")
}

pub(crate) fn ledger_expired(pool: &Pool) -> i64 {
    let mut pooled = pool.get().expect("connection");
    let sql = "SELECT count(*) AS n FROM idempotency_ledger WHERE user_id = 'bench'";
    #[derive(QueryableByName)]
    struct Count {
        #[diesel(sql_type = BigInt)]
        n: i64,
    }
    let counted: QueryResult<Count> = match pooled.conn() {
        db::Conn::Sqlite(c) => diesel::sql_query(sql).get_result(c),
        db::Conn::Postgres(c) => diesel::sql_query(sql).get_result(c),
    };
    counted.map(|c| c.n).unwrap_or(-1)
}
