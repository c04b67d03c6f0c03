//! The `idempotency_ledger` table. Every function takes a connection, so it
//! runs inside the caller's transaction when there is one.

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Timestamptz, TimestamptzSqlite};

use super::RecordedResponse;
use crate::db::{Conn, dispatch};

/// A ledger row as the decision needs it.
#[derive(Debug, Clone)]
pub struct Entry {
    pub fingerprint: String,
    /// `None` while the claim's transaction has not finished. Committed rows
    /// always carry their response, because the claim and the response are
    /// written in one transaction.
    pub response: Option<RecordedResponse>,
}

type Row = (String, Option<i32>, Option<String>, Option<Vec<u8>>);

pub fn find(conn: &mut Conn<'_>, key: &str, user_id: &str) -> QueryResult<Option<Entry>> {
    let row: Option<Row> = dispatch!(conn, c, s => {
        use s::idempotency_ledger::dsl as l;
        l::idempotency_ledger
            .filter(l::idempotency_key.eq(key).and(l::user_id.eq(user_id)))
            .select((l::request_fingerprint, l::response_status, l::response_headers, l::response_body))
            .get_result::<Row>(c)
            .optional()
    })?;
    Ok(row.map(|(fingerprint, status, headers, body)| Entry {
        fingerprint,
        response: match (status, headers, body) {
            (Some(status), Some(headers), Some(body)) => {
                RecordedResponse::from_stored(status, &headers, body)
            }
            _ => None,
        },
    }))
}

/// `INSERT … ON CONFLICT DO NOTHING`: `true` when this call took the key.
/// On PostgreSQL a concurrent, uncommitted claim of the same key makes this
/// wait (at most `lock_timeout`) for that transaction to end.
pub fn claim(
    conn: &mut Conn<'_>,
    key: &str,
    user_id: &str,
    fingerprint: &str,
    now: DateTime<Utc>,
    expires_at: DateTime<Utc>,
) -> QueryResult<bool> {
    let inserted = dispatch!(conn, c, s => {
        use s::idempotency_ledger::dsl as l;
        diesel::insert_into(l::idempotency_ledger)
            .values((
                l::idempotency_key.eq(key),
                l::user_id.eq(user_id),
                l::request_fingerprint.eq(fingerprint),
                l::created_at.eq(now),
                l::expires_at.eq(expires_at),
            ))
            .on_conflict_do_nothing()
            .execute(c)
    })?;
    Ok(inserted == 1)
}

/// Stores the response of the claim this transaction holds.
pub fn complete(
    conn: &mut Conn<'_>,
    key: &str,
    user_id: &str,
    response: &RecordedResponse,
) -> QueryResult<()> {
    let headers = response.headers_json();
    let status = i32::from(response.status);
    let updated = dispatch!(conn, c, s => {
        use s::idempotency_ledger::dsl as l;
        diesel::update(l::idempotency_ledger.filter(l::idempotency_key.eq(key).and(l::user_id.eq(user_id))))
            .set((
                l::response_status.eq(Some(status)),
                l::response_headers.eq(Some(&headers)),
                l::response_body.eq(Some(&response.body)),
            ))
            .execute(c)
    })?;
    if updated == 1 {
        Ok(())
    } else {
        Err(diesel::result::Error::NotFound)
    }
}

/// Deletes at most `limit` expired rows; returns how many went.
pub fn purge_batch(conn: &mut Conn<'_>, now: DateTime<Utc>, limit: i64) -> QueryResult<usize> {
    match conn {
        Conn::Sqlite(c) => purge_batch_sqlite(c, now, limit),
        Conn::Postgres(c) => purge_batch_pg(c, now, limit),
    }
}

/// SQLite has no `DELETE … LIMIT` in its default build: delete by rowid.
fn purge_batch_sqlite(
    c: &mut SqliteConnection,
    now: DateTime<Utc>,
    limit: i64,
) -> QueryResult<usize> {
    diesel::sql_query(
        "DELETE FROM idempotency_ledger WHERE rowid IN \
         (SELECT rowid FROM idempotency_ledger WHERE expires_at < ? LIMIT ?)",
    )
    .bind::<TimestamptzSqlite, _>(now)
    .bind::<BigInt, _>(limit)
    .execute(c)
}

/// PostgreSQL: delete by physical row id, skipping rows another purge holds.
fn purge_batch_pg(c: &mut PgConnection, now: DateTime<Utc>, limit: i64) -> QueryResult<usize> {
    diesel::sql_query(
        "DELETE FROM idempotency_ledger WHERE ctid = ANY(ARRAY( \
         SELECT ctid FROM idempotency_ledger WHERE expires_at < $1 LIMIT $2 FOR UPDATE SKIP LOCKED))",
    )
    .bind::<Timestamptz, _>(now)
    .bind::<BigInt, _>(limit)
    .execute(c)
}

pub fn count(conn: &mut Conn<'_>) -> QueryResult<i64> {
    dispatch!(conn, c, s => s::idempotency_ledger::table.count().get_result(c))
}
