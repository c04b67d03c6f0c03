//! The `idempotency_ledger` table. Every function takes a connection, so it
//! runs inside the caller's transaction when there is one.

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Timestamptz, TimestamptzSqlite};

use super::RecordedResponse;
use crate::db::{Conn, dispatch};

/// A ledger row as the decision needs it: every entry is complete (it is
/// written with its response, and the columns are `NOT NULL`).
#[derive(Debug, Clone)]
pub struct Entry {
    pub fingerprint: String,
    pub response: RecordedResponse,
}

type Row = (String, i32, String, Vec<u8>);

pub fn find(conn: &mut Conn<'_>, key: &str, user_id: &str) -> QueryResult<Option<Entry>> {
    let row: Option<Row> = dispatch!(conn, c, s => {
        use s::idempotency_ledger::dsl as l;
        l::idempotency_ledger
            .filter(l::idempotency_key.eq(key).and(l::user_id.eq(user_id)))
            .select((l::request_fingerprint, l::response_status, l::response_headers, l::response_body))
            .get_result::<Row>(c)
            .optional()
    })?;
    row.map(|(fingerprint, status, headers, body)| {
        let response = RecordedResponse::from_stored(status, &headers, body)?;
        Ok(Entry {
            fingerprint,
            response,
        })
    })
    .transpose()
}

diesel::define_sql_function! {
    /// PostgreSQL: takes a transaction-scoped advisory lock if it is free.
    fn pg_try_advisory_xact_lock(key: BigInt) -> diesel::sql_types::Bool;
}

/// The advisory-lock id of `(key, user_id)`: 64 bits of a SHA-256, so two
/// keys share a lock only by a chance of one in 2^64 (and then merely wait).
fn lock_id(key: &str, user_id: &str) -> i64 {
    use sha2::{Digest, Sha256};
    let digest = Sha256::new()
        .chain_update(user_id.as_bytes())
        .chain_update([0])
        .chain_update(key.as_bytes())
        .finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    i64::from_be_bytes(first)
}

/// Makes this unit the only one running for `(key, user_id)` until it ends:
/// `true` when no other unit held the key, `false` at once when one does
/// (the caller rolls back and looks again later, holding no connection
/// meanwhile). On PostgreSQL a transaction-scoped advisory lock, across
/// processes. On SQLite nothing to do: the writer (and `BEGIN IMMEDIATE`
/// across processes) runs one unit at a time.
pub fn lock_key(conn: &mut Conn<'_>, key: &str, user_id: &str) -> QueryResult<bool> {
    match conn {
        Conn::Sqlite(_) => Ok(true),
        Conn::Postgres(c) => {
            diesel::select(pg_try_advisory_xact_lock(lock_id(key, user_id))).get_result::<bool>(*c)
        }
    }
}

/// A completed entry, as [`record`] writes it.
pub struct NewEntry<'a> {
    pub key: &'a str,
    pub user_id: &'a str,
    pub fingerprint: &'a str,
    pub response: &'a RecordedResponse,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
}

/// Writes the key's entry with its response, `INSERT … ON CONFLICT DO
/// NOTHING`: `true` when this call wrote it, `false` when the key already
/// has an entry. On PostgreSQL a concurrent, uncommitted entry for the same
/// key makes this wait (at most `lock_timeout`) for that transaction to end.
pub fn record(conn: &mut Conn<'_>, entry: &NewEntry<'_>) -> QueryResult<bool> {
    let headers = entry.response.recorded_headers_json();
    let status = i32::from(entry.response.status);
    let inserted = dispatch!(conn, c, s => {
        use s::idempotency_ledger::dsl as l;
        diesel::insert_into(l::idempotency_ledger)
            .values((
                l::idempotency_key.eq(entry.key),
                l::user_id.eq(entry.user_id),
                l::request_fingerprint.eq(entry.fingerprint),
                l::response_status.eq(status),
                l::response_headers.eq(&headers),
                l::response_body.eq(&entry.response.body),
                l::created_at.eq(entry.created_at),
                l::expires_at.eq(entry.expires_at),
            ))
            .on_conflict_do_nothing()
            .execute(c)
    })?;
    Ok(inserted == 1)
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
