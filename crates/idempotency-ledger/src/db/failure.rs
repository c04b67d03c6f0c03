//! How a failed query should be answered, decided without reading English.
//!
//! PostgreSQL writes its messages in the server's `lc_messages`, which only
//! a superuser may change, and diesel hands over the SQLSTATE of a failure
//! only as a [`DatabaseErrorKind`] for a handful of codes (serialization
//! failure, read-only transaction, lost connection, constraint violations).
//! Those with a kind are classified by it: `25006` (a write reached a node
//! that cannot write now: a hot standby, or a primary fenced read-only
//! during a failover) and `40001` are unavailability, like a lost
//! connection (which is also what a server's `57P01`/`57P02` shutdown of
//! the session becomes: libpq sees the connection close). Two codes that decide
//! an answer have no kind: `55P03` (our `lock_timeout` fired: another
//! request holds the key, `409 IDEMPOTENCY_IN_PROGRESS`) and `57014` (our
//! `statement_timeout` fired: `503`). So when a pool is built, the service
//! makes the server say both once, in its own language ([`learn_wording`]),
//! and recognises them afterwards by that exact wording — whatever the
//! language, and as any role.
//!
//! SQLite's messages are the library's fixed strings (it has no
//! translations); diesel does not hand over its result codes, so `SQLITE_BUSY`
//! and `SQLITE_LOCKED` are recognised by the library's exact strings for them.

use std::sync::RwLock;

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::result::{DatabaseErrorKind, Error as DieselError};
use diesel::sql_types::BigInt;

/// How a failed query should be answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The database is unreachable, locked, shedding load or cannot write
    /// now (a standby, a fenced primary): `503`, retry.
    Unavailable,
    /// PostgreSQL's `lock_timeout` fired: another transaction holds the lock
    /// (in practice the advisory lock on an idempotency key).
    LockTimeout,
    /// Anything else: a defect, answered with an opaque `500`.
    Internal,
}

/// `sqlite3_errstr(SQLITE_BUSY)` and `sqlite3_errstr(SQLITE_LOCKED)`.
const SQLITE_BUSY_OR_LOCKED: [&str; 2] = ["database is locked", "database table is locked"];

/// Primary messages of PostgreSQL failures, as servers this process talks
/// to word them (one entry per language seen).
static PG_WORDING: RwLock<Vec<(String, Failure)>> = RwLock::new(Vec::new());

/// Classifies a diesel error by what the client can do about it.
///
/// A lost connection is also reported to the pool (see
/// [`PgManager`](super::PgManager)), so that the connection this thread holds is
/// dropped, not handed out again, when it goes back.
pub fn classify(error: &DieselError) -> Failure {
    match error {
        DieselError::DatabaseError(kind, info) => match kind {
            DatabaseErrorKind::ClosedConnection | DatabaseErrorKind::UnableToSendCommand => {
                super::pg::note_connection_lost();
                Failure::Unavailable
            }
            // 25006: this node cannot write now (a hot standby, or a primary
            // fenced with `default_transaction_read_only` while a failover
            // moves the primary elsewhere): the next node may.
            DatabaseErrorKind::SerializationFailure | DatabaseErrorKind::ReadOnlyTransaction => {
                Failure::Unavailable
            }
            _ => {
                let message = info.message();
                if SQLITE_BUSY_OR_LOCKED.contains(&message) {
                    return Failure::Unavailable;
                }
                PG_WORDING
                    .read()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .iter()
                    .find(|(wording, _)| wording == message)
                    .map_or(Failure::Internal, |(_, failure)| *failure)
            }
        },
        DieselError::BrokenTransactionManager => Failure::Unavailable,
        _ => Failure::Internal,
    }
}

/// Makes the PostgreSQL server at `url` fail once with `lock_timeout` and
/// once with `statement_timeout`, and remembers its wording of each, so that
/// [`classify`] knows them. Two short sessions, a few milliseconds.
pub fn learn_wording(url: &str) -> Result<(), DieselError> {
    let mut holder = PgConnection::establish(url).map_err(connection_lost)?;
    let mut waiter = PgConnection::establish(url).map_err(connection_lost)?;
    // A lock id nobody else uses: a random one.
    let lock_id = i64::from_ne_bytes(uuid::Uuid::new_v4().as_u64_pair().0.to_ne_bytes());
    let take = || diesel::sql_query("SELECT pg_advisory_xact_lock($1)").bind::<BigInt, _>(lock_id);

    holder.batch_execute("BEGIN")?;
    take().execute(&mut holder)?;
    waiter.batch_execute("BEGIN; SET LOCAL lock_timeout = 1")?;
    let lock_timeout = take().execute(&mut waiter).err();
    waiter.batch_execute("ROLLBACK")?;
    holder.batch_execute("ROLLBACK")?;

    waiter.batch_execute("BEGIN; SET LOCAL statement_timeout = 1")?;
    let statement_timeout = diesel::sql_query("SELECT pg_sleep(10)")
        .execute(&mut waiter)
        .err();
    waiter.batch_execute("ROLLBACK")?;

    for (error, failure) in [
        (lock_timeout, Failure::LockTimeout),
        (statement_timeout, Failure::Unavailable),
    ] {
        let Some(DieselError::DatabaseError(_, info)) = error else {
            return Err(DieselError::QueryBuilderError(
                "the server did not fail as asked while learning its wording".into(),
            ));
        };
        remember(info.message(), failure);
    }
    Ok(())
}

fn remember(wording: &str, failure: Failure) {
    let mut known = PG_WORDING
        .write()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if !known.iter().any(|(w, _)| w == wording) {
        known.push((wording.to_owned(), failure));
    }
}

fn connection_lost(e: diesel::ConnectionError) -> DieselError {
    DieselError::DatabaseError(DatabaseErrorKind::ClosedConnection, Box::new(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn database_error(kind: DatabaseErrorKind, message: &str) -> DieselError {
        DieselError::DatabaseError(kind, Box::new(message.to_owned()))
    }

    #[test]
    fn a_lost_connection_a_serialization_failure_or_a_read_only_node_is_unavailable() {
        for kind in [
            DatabaseErrorKind::ClosedConnection,
            DatabaseErrorKind::UnableToSendCommand,
            DatabaseErrorKind::SerializationFailure,
            DatabaseErrorKind::ReadOnlyTransaction,
        ] {
            assert_eq!(classify(&database_error(kind, "x")), Failure::Unavailable);
        }
        assert_eq!(
            classify(&DieselError::BrokenTransactionManager),
            Failure::Unavailable
        );
    }

    #[test]
    fn sqlite_busy_and_locked_are_unavailable() {
        for message in SQLITE_BUSY_OR_LOCKED {
            assert_eq!(
                classify(&database_error(DatabaseErrorKind::Unknown, message)),
                Failure::Unavailable
            );
        }
    }

    #[test]
    fn learned_wording_is_recognised_in_any_language_and_nothing_else_is() {
        let german = "storniere Anfrage wegen Zeitüberschreitung einer Sperre";
        let unknown = database_error(DatabaseErrorKind::Unknown, german);
        assert_eq!(classify(&unknown), Failure::Internal);
        remember(german, Failure::LockTimeout);
        assert_eq!(classify(&unknown), Failure::LockTimeout);
        // Only the exact wording: no guessing from English fragments.
        for other in ["canceling statement due to lock timeout", "syntax error"] {
            assert_eq!(
                classify(&database_error(DatabaseErrorKind::Unknown, other)),
                Failure::Internal,
                "{other}"
            );
        }
    }
}
