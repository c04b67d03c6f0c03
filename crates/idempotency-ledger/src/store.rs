//! The `idempotency_ledger` table. Every function takes a connection, so it
//! runs inside the caller's transaction when there is one.
//!
//! Results are written `Result<T, DieselError>`, diesel's `QueryResult<T>`
//! spelled out, so that mutation testing can replace what each function
//! returns (`docs/MUTANTS.md`).

use chrono::{DateTime, Utc};
use diesel::pg::Pg;
use diesel::prelude::*;
use diesel::query_builder::{AstPass, Query, QueryFragment, QueryId};
use diesel::result::Error as DieselError;
use diesel::sql_types::{BigInt, Timestamptz, TimestamptzSqlite};

use crate::db::{Conn, PG_LOCK_WAIT};
use crate::response::{RecordedResponse, Unreplayable};
use crate::row::{self, Columns, Row, Source, Timestamp};

/// Runs `$body` once per backend, with `$c` bound to the concrete
/// connection and `$schema` to that backend's table definition.
macro_rules! dispatch {
    ($conn:expr, $c:ident, $schema:ident => $body:expr) => {
        match $conn {
            Conn::Sqlite(inner) => {
                use crate::schema::sqlite as $schema;
                let $c: &mut SqliteConnection = &mut **inner;
                $body
            }
            Conn::Postgres(inner) => {
                use crate::schema::pg as $schema;
                let $c: &mut PgConnection = &mut **inner;
                $body
            }
        }
    };
}

/// A ledger row as the decision needs it: every entry is complete (it is
/// written with its response, and the columns are `NOT NULL`).
#[derive(Debug, Clone)]
pub struct Entry {
    /// The fingerprint of the request that recorded it.
    pub fingerprint: String,
    /// The recorded response, or why it cannot be replayed.
    pub response: Result<RecordedResponse, Unreplayable>,
    /// When it may be purged.
    pub expires_at: DateTime<Utc>,
}

type Stored = (String, i32, String, Vec<u8>, DateTime<Utc>);

/// The key's entry, if it has one.
pub fn find(conn: &mut Conn<'_>, key: &str, user_id: &str) -> Result<Option<Entry>, DieselError> {
    // `get_result`, never `first`: `first` binds `LIMIT ?`, and the bundled
    // SQLite (built with `SQLITE_ENABLE_STAT4`) recompiles a cached
    // statement whose plan read a bound integer each time it is bound again.
    let row: Option<Stored> = dispatch!(conn, c, s => {
        use s::idempotency_ledger::dsl as l;
        l::idempotency_ledger
            .filter(l::idempotency_key.eq(key).and(l::user_id.eq(user_id)))
            .select((
                l::request_fingerprint,
                l::response_status,
                l::response_headers,
                l::response_body,
                l::expires_at,
            ))
            .get_result::<Stored>(c)
            .optional()
    })?;
    Ok(
        row.map(|(fingerprint, status, headers, body, expires_at)| Entry {
            fingerprint,
            response: RecordedResponse::from_stored(status, &headers, body),
            expires_at,
        }),
    )
}

/// A completed entry: the key, who sent it, the request's fingerprint and
/// the response recorded for it, described once as a [`Row`].
pub(crate) struct NewEntry {
    pub key: String,
    pub user_id: String,
    pub fingerprint: String,
    status: i32,
    headers: String,
    body: Vec<u8>,
    created_at: Timestamp,
    expires_at: Timestamp,
}

impl NewEntry {
    pub fn new(
        key: String,
        user_id: String,
        fingerprint: String,
        response: &RecordedResponse,
        created_at: DateTime<Utc>,
        expires_at: DateTime<Utc>,
    ) -> Self {
        Self {
            key,
            user_id,
            fingerprint,
            status: i32::from(response.status),
            headers: response.recorded_headers_json(),
            body: response.body.clone(),
            created_at: Timestamp::new(created_at),
            expires_at: Timestamp::new(expires_at),
        }
    }
}

impl Row for NewEntry {
    const TABLE: &'static str = "idempotency_ledger";
    const UNIQUE: &'static [&'static str] = &["idempotency_key", "user_id"];

    fn columns<'b, C: Columns<'b>>(&'b self, c: &mut C) -> Result<(), DieselError> {
        c.column("idempotency_key", self.key.as_str())?;
        c.column("user_id", self.user_id.as_str())?;
        c.column("request_fingerprint", self.fingerprint.as_str())?;
        c.column("response_status", &self.status)?;
        c.column("response_headers", self.headers.as_str())?;
        c.column("response_body", self.body.as_slice())?;
        c.column("created_at", &self.created_at)?;
        c.column("expires_at", &self.expires_at)
    }
}

/// Writes the key's entry with its response, `INSERT … ON CONFLICT DO
/// NOTHING`: `true` when this call wrote it, `false` when the key already
/// has an entry.
pub(crate) fn record(conn: &mut Conn<'_>, entry: &NewEntry) -> Result<bool, DieselError> {
    row::insert(conn, entry)
}

diesel::define_sql_function! {
    /// PostgreSQL: takes a transaction-scoped advisory lock if it is free.
    fn pg_try_advisory_xact_lock(key: BigInt) -> diesel::sql_types::Bool;
}

/// The name of the relation a [`RecordedInsert`]'s change reads its values
/// from: it has one row when the statement took the key's advisory lock and
/// none when another unit holds it, so the change never runs without the
/// lock, and never waits for it.
const HELD: &str = "held";

/// PostgreSQL: the key's advisory lock, a mutation's one `INSERT` and the
/// key's entry as one statement, which commits by itself (autocommit): one
/// round trip for the whole unit of writing.
///
/// ```sql
/// WITH held AS MATERIALIZED (SELECT 1 WHERE pg_try_advisory_xact_lock($1)),
///      change AS (INSERT INTO t (…) SELECT $…, … FROM held
///                 ON CONFLICT (…) DO NOTHING RETURNING 1),
///      entry AS (INSERT INTO idempotency_ledger (…) SELECT $…, … FROM change)
/// SELECT count(*) FROM change
/// ```
///
/// Both inserts are built from their [`Row`]s. The change's row comes from
/// `held`, which has its row only when the lock was free: a key another
/// unit holds makes the change write nothing (nobody waits on the lock),
/// and the request goes the general way, which waits for that unit without
/// a connection. The entry's row comes from the change's, so the entry is
/// written exactly when the change wrote something. The entry's `INSERT`
/// has no `ON CONFLICT`: an entry recorded by another request since the
/// read fails the whole statement with a unique violation, and nothing of
/// it persists. The count says whether the change (and with it the entry)
/// was written: `0` leaves the decision to the general path. The
/// statement's work runs under the session's `statement_timeout` (the
/// lease), so it cannot run on past the lease; its commit comes after
/// PostgreSQL disarms that timeout, so a wait for a synchronous standby is
/// never cut short into a local-only commit.
struct RecordedInsert<'a, R> {
    lock: i64,
    change: &'a R,
    entry: &'a NewEntry,
}

impl<R: Row> QueryId for RecordedInsert<'_, R> {
    type QueryId = RecordedInsert<'static, R>;
    const HAS_STATIC_QUERY_ID: bool = true;
}

impl<R: Row> QueryFragment<Pg> for RecordedInsert<'_, R> {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Pg>) -> Result<(), DieselError> {
        out.push_sql("WITH ");
        out.push_sql(HELD);
        out.push_sql(" AS MATERIALIZED (SELECT 1 WHERE pg_try_advisory_xact_lock(");
        out.push_bind_param::<BigInt, _>(&self.lock)?;
        out.push_sql(")), change AS (");
        row::walk_insert(self.change, Source::SelectFrom(HELD), &mut out)?;
        row::walk_on_conflict_do_nothing::<R, _>(&mut out)?;
        out.push_sql(" RETURNING 1), entry AS (");
        row::walk_insert(self.entry, Source::SelectFrom("change"), &mut out)?;
        out.push_sql(") SELECT count(*) FROM change");
        Ok(())
    }
}

impl<R> Query for RecordedInsert<'_, R> {
    type SqlType = BigInt;
}

impl<R> RunQueryDsl<PgConnection> for RecordedInsert<'_, R> {}

/// Runs a [`RecordedInsert`] on its own (autocommit): `true` when the change
/// and the entry were written and committed.
pub(crate) fn insert_recorded<R: Row>(
    conn: &mut PgConnection,
    change: &R,
    entry: &NewEntry,
) -> Result<bool, DieselError> {
    let statement = RecordedInsert {
        lock: lock_id(&entry.key, &entry.user_id),
        change,
        entry,
    };
    let written: i64 = statement.get_result(conn)?;
    Ok(written > 0)
}

/// The advisory-lock id of `(key, user_id)` on PostgreSQL, which a unit of
/// writing holds for its transaction: 64 bits of a SHA-256, so two keys
/// share a lock only by a chance of one in 2^64 (and then merely wait).
/// Public so that an operator or a test can see, or take, a key's lock
/// (`pg_locks`, `pg_advisory_lock`).
pub fn lock_id(key: &str, user_id: &str) -> i64 {
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
pub(crate) fn lock_key(conn: &mut Conn<'_>, key: &str, user_id: &str) -> Result<bool, DieselError> {
    match conn {
        Conn::Sqlite(_) => Ok(true),
        Conn::Postgres(c) => {
            diesel::select(pg_try_advisory_xact_lock(lock_id(key, user_id))).get_result::<bool>(*c)
        }
    }
}

/// Bounds how long each statement of the current transaction waits for a
/// lock another transaction holds, to `wait`: `SET LOCAL lock_timeout`,
/// the transaction's own setting. Every PostgreSQL session has the same
/// bound already, but a distributed PostgreSQL (Citus) runs a transaction's
/// statements in the sessions the coordinator holds on its workers, which
/// the service's session settings never reach; a `SET LOCAL` does: Citus
/// sends it to every worker the transaction touches (with
/// `citus.propagate_set_commands = 'local'`, which every session of the
/// pool sets where Citus is loaded). Call it first in a transaction. SQLite: nothing to bound
/// (the writer runs one unit at a time).
pub(crate) fn bound_lock_waits(
    conn: &mut Conn<'_>,
    wait: std::time::Duration,
) -> Result<(), DieselError> {
    use diesel::connection::SimpleConnection;
    match conn {
        Conn::Sqlite(_) => Ok(()),
        Conn::Postgres(c) => c.batch_execute(&format!(
            "SET LOCAL lock_timeout = {}",
            wait.as_millis().max(1)
        )),
    }
}

/// Deletes at most `limit` expired entries, the oldest first; returns how
/// many went. Run it inside a transaction (as [`Ledger::purge_expired`]
/// does, one short transaction per batch): on PostgreSQL it bounds that
/// transaction's lock waits first.
///
/// [`Ledger::purge_expired`]: crate::Ledger::purge_expired
pub fn purge_batch(
    conn: &mut Conn<'_>,
    now: DateTime<Utc>,
    limit: i64,
) -> Result<usize, DieselError> {
    match conn {
        Conn::Sqlite(c) => purge_batch_sqlite(c, now, limit),
        Conn::Postgres(c) => purge_batch_pg(c, now, limit),
    }
}

/// SQLite has no `DELETE … LIMIT` in its default build: delete by rowid
/// (SQLite is never distributed, and its writer runs one unit at a time).
fn purge_batch_sqlite(
    c: &mut SqliteConnection,
    now: DateTime<Utc>,
    limit: i64,
) -> Result<usize, DieselError> {
    diesel::sql_query(
        "DELETE FROM idempotency_ledger WHERE rowid IN \
         (SELECT rowid FROM idempotency_ledger WHERE expires_at < ? ORDER BY expires_at LIMIT ?)",
    )
    .bind::<TimestamptzSqlite, _>(now)
    .bind::<BigInt, _>(limit)
    .execute(c)
}

/// The purge's statement on PostgreSQL: `$1` is now, `$2` the batch's size.
///
/// It deletes by the ledger's key the `$2` entries that expired first (the
/// `expires_at` index serves the selection, the primary key each
/// deletion). No `ctid` and no row lock: a table distributed by `user_id`
/// (Citus) refuses both in a statement that spans shards. There it runs in
/// two steps, the selection first, across shards, then the deletion of the
/// selected rows on every shard; an entry recorded for one of those keys in
/// between (after another purge removed the old one) was created later, so
/// matching `created_at` too keeps it.
///
/// The deletion matches the selected rows by key and `created_at`, a column
/// no index covers, so the only way to them is the primary key: by a range
/// of `expires_at` (`WHERE expires_at < $1 AND …`), or by `expires_at`
/// itself, the planner could reach them through the `expires_at` index
/// instead, and with a backlog inserted since the last `ANALYZE` (the
/// statistics saying almost nothing has expired) it did: once per selected
/// entry, over a backlog whose entries all expire at the same instant (one
/// batch of a 1,000,000-entry backlog: 30 s, and 469 s with the range).
/// `the_purges_plan_reads_the_backlog_only_as_far_as_one_batch_whatever_the_statistics_say`
/// checks the plan.
pub const PURGE_POSTGRES: &str = "DELETE FROM idempotency_ledger \
     WHERE (user_id, idempotency_key, created_at) IN (SELECT user_id, idempotency_key, created_at \
     FROM idempotency_ledger WHERE expires_at < $1 ORDER BY expires_at LIMIT $2)";

/// PostgreSQL: [`PURGE_POSTGRES`], planned for this batch's values each time
/// (diesel prepares it once per connection, and a generic plan, which knows
/// neither the batch's size nor how much has expired, reads the whole
/// table), with the transaction's lock waits bounded first. On a single
/// PostgreSQL it is one statement and one snapshot; two purges at once
/// select the same entries, the second waits for the first's row locks (a
/// batch is one short transaction) and then deletes what is left. A live
/// write never waits on a purge: an expired entry still answers its key's
/// read, so nothing writes a key whose entry is being purged.
fn purge_batch_pg(
    c: &mut PgConnection,
    now: DateTime<Utc>,
    limit: i64,
) -> Result<usize, DieselError> {
    use diesel::connection::SimpleConnection;
    c.batch_execute(&format!(
        "SET LOCAL lock_timeout = {}; SET LOCAL plan_cache_mode = force_custom_plan",
        PG_LOCK_WAIT.as_millis()
    ))?;
    diesel::sql_query(PURGE_POSTGRES)
        .bind::<Timestamptz, _>(now)
        .bind::<BigInt, _>(limit)
        .execute(c)
}

/// How many entries the ledger holds.
pub fn count(conn: &mut Conn<'_>) -> Result<i64, DieselError> {
    dispatch!(conn, c, s => s::idempotency_ledger::table.count().get_result(c))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each `(key, user)` has its own advisory lock: a unit never waits for
    /// another key's, nor for the same key of another user.
    #[test]
    fn each_key_of_each_user_has_its_own_lock_and_keeps_it() {
        let ids = [
            lock_id("k-1", "alice"),
            lock_id("k-2", "alice"),
            lock_id("k-1", "bob"),
            // Not the same bytes run together: the two parts are kept apart.
            lock_id("1", "alicek-"),
            lock_id("alicek-1", ""),
        ];
        for (i, a) in ids.iter().enumerate() {
            for b in &ids[i + 1..] {
                assert_ne!(a, b, "{ids:?}");
            }
        }
        assert_eq!(
            lock_id("k-1", "alice"),
            ids[0],
            "the same key, the same lock"
        );
    }
}
