//! PostgreSQL: the connection manager that drops a connection whose server
//! went away, and the settings every pooled session starts with.

use std::time::Duration;

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::r2d2::{self, ConnectionManager, CustomizeConnection, PooledConnection};
use diesel::result::{DatabaseErrorKind, Error as DieselError};

use super::lock::lock_wait;

/// PostgreSQL connections for r2d2, which also drops a connection on which
/// the thread that returns it saw the server go away.
///
/// diesel calls a `PgConnection` broken only when its transaction state is,
/// so a connection that lost its server between two transactions would go
/// back to the pool and fail every request that draws it ("no connection to
/// the server") until the process restarts. A ping on every checkout would
/// cost a round trip per request; instead [`drop_if_lost`] notes a lost
/// connection on the current thread, and the connection that thread returns
/// next is dropped (it is called before the connection that failed goes
/// back: both happen on the blocking thread that ran the query).
#[derive(Debug)]
pub struct PgManager(pub(crate) ConnectionManager<PgConnection>);

thread_local! {
    static CONNECTION_LOST: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// When `error` says the server went away, marks the PostgreSQL connection
/// this thread holds as lost, so that it is dropped, not pooled again, when
/// it goes back. Call it on the thread that holds the connection, before
/// the connection goes back.
pub fn drop_if_lost(error: &DieselError) {
    if let DieselError::DatabaseError(
        DatabaseErrorKind::ClosedConnection | DatabaseErrorKind::UnableToSendCommand,
        _,
    ) = error
    {
        CONNECTION_LOST.set(true);
    }
}

/// A connection from the pool, with this thread's lost-connection flag
/// cleared: it speaks of this connection only (a failure classified after an
/// earlier connection went back must not drop this one).
pub(crate) fn checked_out(
    pool: &r2d2::Pool<PgManager>,
) -> Result<PooledConnection<PgManager>, r2d2::PoolError> {
    let conn = pool.get()?;
    CONNECTION_LOST.set(false);
    Ok(conn)
}

impl r2d2::ManageConnection for PgManager {
    type Connection = PgConnection;
    type Error = r2d2::Error;

    fn connect(&self) -> Result<PgConnection, r2d2::Error> {
        self.0.connect()
    }

    fn is_valid(&self, conn: &mut PgConnection) -> Result<(), r2d2::Error> {
        self.0.is_valid(conn)
    }

    fn has_broken(&self, conn: &mut PgConnection) -> bool {
        CONNECTION_LOST.replace(false) | self.0.has_broken(conn)
    }
}

/// Per-connection PostgreSQL settings: READ COMMITTED, how long a statement
/// waits for a lock another transaction holds (a unit of writing sets the
/// same bound again for its own transaction, so that it reaches every node
/// of a distributed backend too), and the lease that bounds how long any
/// transaction may hold its key (a hung holder's session is ended by the
/// server, so its transaction can never commit late).
#[derive(Debug, Clone, Copy)]
pub(crate) struct PgSession {
    pub(crate) lease: Duration,
}

impl CustomizeConnection<PgConnection, r2d2::Error> for PgSession {
    fn on_acquire(&self, conn: &mut PgConnection) -> Result<(), r2d2::Error> {
        let lease_ms = self.lease.as_millis().max(1);
        let lock_ms = lock_wait(self.lease).as_millis();
        // READ COMMITTED whatever the database's default: under `repeatable
        // read` or `serializable` a race loser's `INSERT … ON CONFLICT`
        // fails with a serialization error instead of seeing the winner.
        // PostgreSQL 17+ also ends any transaction older than the lease
        // (`transaction_timeout`); before it, a dead host's transaction
        // lives at most one statement plus one idle moment: twice the lease.
        let (version, citus): (i64, bool) = diesel::select((
            diesel::dsl::sql::<diesel::sql_types::BigInt>(
                "current_setting('server_version_num')::bigint",
            ),
            diesel::dsl::sql::<diesel::sql_types::Bool>(
                "current_setting('citus.propagate_set_commands', true) IS NOT NULL",
            ),
        ))
        .get_result(conn)
        .map_err(r2d2::Error::QueryError)?;
        let transaction_timeout = if version >= 170_000 {
            format!("SET transaction_timeout = {lease_ms};")
        } else {
            String::new()
        };
        // On Citus (its library loaded), a transaction's `SET LOCAL` — a
        // unit's `lock_timeout` — is sent on to every worker the transaction
        // touches once the session asks for it.
        let propagate = if citus {
            "SET citus.propagate_set_commands = 'local';"
        } else {
            ""
        };
        conn.batch_execute(&format!(
            "SET TIME ZONE 'UTC';
             SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL READ COMMITTED;
             SET lock_timeout = {lock_ms};
             SET statement_timeout = {lease_ms};
             SET idle_in_transaction_session_timeout = {lease_ms};
             {propagate}
             {transaction_timeout}"
        ))
        .map_err(r2d2::Error::QueryError)
    }
}
