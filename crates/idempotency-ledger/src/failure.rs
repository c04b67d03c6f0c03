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
//! makes the server say both once, in its own language (`pg/wording.rs`),
//! and recognises them afterwards by that exact wording — whatever the
//! language, and as any role.
//!
//! SQLite's messages are the library's fixed strings (it has no
//! translations); diesel does not hand over its result codes, so `SQLITE_BUSY`
//! and `SQLITE_LOCKED` are recognised by the library's exact strings for them.

use diesel::result::{DatabaseErrorKind, Error as DieselError};

pub use crate::conn::Failure;
use crate::pg::wording::{self, Wording};

/// `sqlite3_errstr(SQLITE_BUSY)` and `sqlite3_errstr(SQLITE_LOCKED)`.
const SQLITE_BUSY_OR_LOCKED: [&str; 2] = ["database is locked", "database table is locked"];

/// Classifies a diesel error by what the client can do about it. It only
/// looks: a connection that lost its server is dropped by
/// [`drop_if_lost`](crate::db::drop_if_lost), called where it is held.
pub fn classify(error: &DieselError) -> Failure {
    match error {
        DieselError::DatabaseError(kind, info) => match kind {
            DatabaseErrorKind::ClosedConnection | DatabaseErrorKind::UnableToSendCommand => {
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
                match wording::recognise(message) {
                    Some(Wording::LockTimeout) => Failure::LockTimeout,
                    Some(Wording::StatementTimeout) => Failure::Unavailable,
                    None => Failure::Internal,
                }
            }
        },
        DieselError::BrokenTransactionManager => Failure::Unavailable,
        _ => Failure::Internal,
    }
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
        wording::remember(german, Wording::LockTimeout);
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
