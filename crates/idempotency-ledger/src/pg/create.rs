//! PostgreSQL's one-statement create: for a change that is inserting one
//! row, the key's lock, the row and the entry go as one autocommitted
//! statement after the read — one round trip for a fresh key. Whatever it
//! cannot decide (the key busy, the row there already) goes the general
//! way, as a unit.

use std::sync::Arc;
use std::time::Duration;

use diesel::pg::Pg;
use diesel::prelude::*;
use diesel::query_builder::{AstPass, Query, QueryFragment, QueryId};
use diesel::r2d2;
use diesel::result::{DatabaseErrorKind, Error as DieselError};
use diesel::sql_types::BigInt;

use super::lock::lock_id;
use super::session::{PgManager, checked_out, drop_if_lost};
use super::wording::{Wording, recognise};
use crate::conn::{Created, StorageError, answered_in_time};
use crate::entry::NewEntry;
use crate::row::{self, Row, Source};

/// Runs the create for `row` with the entry `entry` makes.
///
/// Bounded like a unit: no answer within the lease plus the commit grace
/// is unavailable, the outcome unknown. The statement's own work is cut at
/// the lease (`statement_timeout`), but not its commit (a wait for a
/// synchronous standby), nor a server that stops answering; the blocking
/// thread then still waits with its connection, and a retry finds the key
/// recorded (a replay) or free (it runs).
pub(crate) async fn create<R: Row>(
    connections: &r2d2::Pool<PgManager>,
    lease: Duration,
    row: Arc<R>,
    entry: NewEntry,
) -> Result<Created, StorageError> {
    let connections = connections.clone();
    let statement = tokio::task::spawn_blocking(move || {
        let mut conn = checked_out(&connections)
            .map_err(|e| format!("no database connection available: {e}"))?;
        let written = run_statement(&mut conn, &*row, &entry);
        // While the connection is held: one that lost its server is
        // dropped instead of going back to the pool.
        if let Err(e) = &written {
            drop_if_lost(e);
        }
        #[cfg(feature = "fault-points")]
        crate::fault::pass_blocking(crate::fault::Point::AfterOneStatement, &entry.key)
            .map_err(|e| e.to_string())?;
        drop(conn);
        Ok::<_, String>(written)
    });
    let written = answered_in_time(lease, statement)
        .await
        .map_err(StorageError::Unavailable)?
        .map_err(|e| StorageError::Internal(e.to_string()))?
        .map_err(StorageError::Unavailable)?;
    match written {
        Ok(true) => Ok(Created::Written),
        // The effect exists already, or another unit holds the key: the
        // general way finds out which.
        Ok(false) => Ok(Created::Undecided),
        // Another request recorded the key since the read; nothing of this
        // statement persisted.
        Err(DieselError::DatabaseError(DatabaseErrorKind::UniqueViolation, _)) => {
            Ok(Created::Undecided)
        }
        // Our `lock_timeout`: another transaction holds a row of the key's.
        Err(DieselError::DatabaseError(_, info))
            if recognise(info.message()) == Some(Wording::LockTimeout) =>
        {
            Ok(Created::InProgress)
        }
        Err(e) => Err(StorageError::Database(e)),
    }
}

/// The name of the relation the create's change reads its values
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
struct CreateStatement<'a, R> {
    lock: i64,
    change: &'a R,
    entry: &'a NewEntry,
}

impl<R: Row> QueryId for CreateStatement<'_, R> {
    type QueryId = CreateStatement<'static, R>;
    const HAS_STATIC_QUERY_ID: bool = true;
}

impl<R: Row> QueryFragment<Pg> for CreateStatement<'_, R> {
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

impl<R> Query for CreateStatement<'_, R> {
    type SqlType = BigInt;
}

impl<R> RunQueryDsl<PgConnection> for CreateStatement<'_, R> {}

/// Runs the [`CreateStatement`] on its own (autocommit): `true` when the
/// change and the entry were written and committed.
fn run_statement<R: Row>(
    conn: &mut PgConnection,
    change: &R,
    entry: &NewEntry,
) -> Result<bool, DieselError> {
    let statement = CreateStatement {
        lock: lock_id(&entry.key, &entry.user_id),
        change,
        entry,
    };
    let written: i64 = statement.get_result(conn)?;
    Ok(written > 0)
}
