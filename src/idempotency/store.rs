//! The `idempotency_ledger` table. Every function takes a connection, so it
//! runs inside the caller's transaction when there is one.

use chrono::{DateTime, Utc};
use diesel::pg::Pg;
use diesel::prelude::*;
use diesel::query_builder::{AstPass, Query, QueryFragment, QueryId};
use diesel::sql_types::{BigInt, Timestamptz, TimestamptzSqlite};
use diesel::sql_types::{Binary, Integer, Text};
use diesel::sqlite::Sqlite;

use super::RecordedResponse;
use crate::db::{Conn, dispatch, timestamp_text};

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

/// The name of the relation a `RecordedInsert`'s change reads its values
/// from: it has one row when the statement took the key's advisory lock and
/// none when another unit holds it, so the change never runs without the
/// lock, and never waits for it.
pub const HELD: &str = "held";

/// PostgreSQL: the key's advisory lock, a mutation's one `INSERT` and the
/// key's entry as one statement, which commits by itself (autocommit): one
/// round trip for the whole unit of writing.
///
/// ```sql
/// WITH held AS MATERIALIZED (SELECT 1 WHERE pg_try_advisory_xact_lock($1)),
///      change AS (<the change: INSERT … SELECT … FROM held … RETURNING 1>),
///      entry AS (INSERT INTO idempotency_ledger (…) SELECT $…, … FROM change)
/// SELECT count(*) FROM change
/// ```
///
/// The change's rows come from `held`, which has its row only when the
/// lock was free: a key another unit holds makes the change write nothing
/// (nobody waits on the lock), and the request goes the general way, which
/// waits for that unit without a connection. The entry's row comes from the
/// change's, so the entry is written exactly when the change wrote
/// something. The entry's `INSERT` has no `ON CONFLICT`: an entry recorded
/// by another request since the read fails the whole statement with a unique
/// violation, and nothing of it persists. The count says whether the change
/// (and with it the entry) was written: `0` leaves the decision to the
/// general path. The statement's work runs under the session's
/// `statement_timeout` (the lease), so it cannot run on past the lease; its
/// commit comes after PostgreSQL disarms that timeout, so a wait for a
/// synchronous standby is never cut short into a local-only commit.
pub struct RecordedInsert<'a, C> {
    lock: i64,
    change: &'a C,
    entry: &'a NewEntry<'a>,
    status: i32,
    headers: String,
}

impl<'a, C> RecordedInsert<'a, C> {
    pub fn new(change: &'a C, entry: &'a NewEntry<'a>) -> Self {
        Self {
            lock: lock_id(entry.key, entry.user_id),
            change,
            entry,
            status: i32::from(entry.response.status),
            headers: entry.response.recorded_headers_json(),
        }
    }
}

/// The statement's identity for diesel's prepared-statement cache: its SQL
/// text depends only on the change's (every value is a bind parameter).
pub struct RecordedInsertId<C>(std::marker::PhantomData<C>);

impl<C: QueryId> QueryId for RecordedInsert<'_, C> {
    type QueryId = RecordedInsertId<C::QueryId>;
    const HAS_STATIC_QUERY_ID: bool = C::HAS_STATIC_QUERY_ID;
}

impl<C: QueryFragment<Pg>> QueryFragment<Pg> for RecordedInsert<'_, C> {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        out.push_sql("WITH ");
        out.push_sql(HELD);
        out.push_sql(" AS MATERIALIZED (SELECT 1 WHERE pg_try_advisory_xact_lock(");
        out.push_bind_param::<BigInt, _>(&self.lock)?;
        out.push_sql(")), change AS (");
        self.change.walk_ast(out.reborrow())?;
        out.push_sql(
            "), entry AS (INSERT INTO idempotency_ledger (idempotency_key, user_id, \
             request_fingerprint, response_status, response_headers, response_body, \
             created_at, expires_at) SELECT ",
        );
        out.push_bind_param::<Text, str>(self.entry.key)?;
        out.push_sql(", ");
        out.push_bind_param::<Text, str>(self.entry.user_id)?;
        out.push_sql(", ");
        out.push_bind_param::<Text, str>(self.entry.fingerprint)?;
        out.push_sql(", ");
        out.push_bind_param::<Integer, _>(&self.status)?;
        out.push_sql(", ");
        out.push_bind_param::<Text, _>(&self.headers)?;
        out.push_sql(", ");
        out.push_bind_param::<Binary, _>(&self.entry.response.body)?;
        out.push_sql(", ");
        out.push_bind_param::<Timestamptz, _>(&self.entry.created_at)?;
        out.push_sql(", ");
        out.push_bind_param::<Timestamptz, _>(&self.entry.expires_at)?;
        out.push_sql(" FROM change) SELECT count(*) FROM change");
        Ok(())
    }
}

impl<C> Query for RecordedInsert<'_, C> {
    type SqlType = BigInt;
}

impl<C> RunQueryDsl<PgConnection> for RecordedInsert<'_, C> {}

/// Runs a [`RecordedInsert`] on its own (autocommit): `true` when the change
/// and the entry were written and committed.
pub fn insert_recorded<C>(
    conn: &mut PgConnection,
    change: &C,
    entry: &NewEntry<'_>,
) -> QueryResult<bool>
where
    C: QueryFragment<Pg> + QueryId,
{
    let written: i64 = RecordedInsert::new(change, entry).get_result(conn)?;
    Ok(written > 0)
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
    if let Conn::Sqlite(c) = conn {
        let statement = SqliteRecord {
            entry,
            status,
            headers: &headers,
            created_at: timestamp_text(&entry.created_at),
            expires_at: timestamp_text(&entry.expires_at),
        };
        return Ok(statement.execute(*c)? == 1);
    }
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

/// SQLite: the statement of [`record`], written out so that diesel finds its
/// prepared statement by type instead of building the SQL text of its DSL
/// insert on every call to look it up (this runs on the single writer).
struct SqliteRecord<'a> {
    entry: &'a NewEntry<'a>,
    status: i32,
    headers: &'a str,
    /// The timestamps as the text diesel's `TimestamptzSqlite` would write.
    created_at: String,
    expires_at: String,
}

impl QueryId for SqliteRecord<'_> {
    type QueryId = SqliteRecord<'static>;
    const HAS_STATIC_QUERY_ID: bool = true;
}

impl QueryFragment<Sqlite> for SqliteRecord<'_> {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Sqlite>) -> QueryResult<()> {
        let e = self.entry;
        out.push_sql(
            "INSERT INTO idempotency_ledger (idempotency_key, user_id, request_fingerprint, \
             response_status, response_headers, response_body, created_at, expires_at) \
             VALUES (",
        );
        out.push_bind_param::<Text, str>(e.key)?;
        out.push_sql(", ");
        out.push_bind_param::<Text, str>(e.user_id)?;
        out.push_sql(", ");
        out.push_bind_param::<Text, str>(e.fingerprint)?;
        out.push_sql(", ");
        out.push_bind_param::<Integer, _>(&self.status)?;
        out.push_sql(", ");
        out.push_bind_param::<Text, str>(self.headers)?;
        out.push_sql(", ");
        out.push_bind_param::<Binary, _>(&e.response.body)?;
        out.push_sql(", ");
        out.push_bind_param::<Text, _>(&self.created_at)?;
        out.push_sql(", ");
        out.push_bind_param::<Text, _>(&self.expires_at)?;
        out.push_sql(") ON CONFLICT DO NOTHING");
        Ok(())
    }
}

impl RunQueryDsl<SqliteConnection> for SqliteRecord<'_> {}

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
