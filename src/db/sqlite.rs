//! SQLite: the settings every connection starts with, and the pool of
//! readers beside the one writer.

use std::sync::Arc;
use std::time::Duration;

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::r2d2::{self, ConnectionManager, CustomizeConnection};
use diesel::result::Error as DieselError;

use super::writer::WriterSlot;

/// The least time a SQLite writer waits for the database lock before giving
/// up (pooled connections wait a little longer than the lease, see
/// [`SqliteSession`]).
pub(super) const SQLITE_BUSY_TIMEOUT: Duration = Duration::from_secs(5);

pub(super) type SqliteManager = ConnectionManager<SqliteConnection>;

/// SQLite: pooled connections for reads, and one
/// [`Writer`](super::writer::Writer) that commits every write of this
/// process in batches (started on the first write, so a command that only
/// reads never opens it).
#[derive(Clone)]
pub struct SqlitePool {
    pub(super) readers: r2d2::Pool<SqliteManager>,
    pub(super) writer: Arc<WriterSlot>,
}

/// Per-connection SQLite settings. `busy_timeout` comes first so that the
/// following pragmas already wait for a lock instead of failing.
///
/// SQLite has one write lock for the whole file, so a request with the same
/// idempotency key as a running one waits for that lock, whatever key the
/// holder has. A holder may keep it at most its lease (the ledger rolls back
/// a holder past its lease), so a writer waits a little longer than the
/// lease: a duplicate then replays the holder's answer instead of failing
/// with "database is locked" while the holder is still within its rights.
#[derive(Debug, Clone, Copy)]
pub(super) struct SqliteSession {
    pub(super) busy_timeout: Duration,
}

impl SqliteSession {
    pub(super) fn for_lease(lease: Duration) -> Self {
        Self {
            busy_timeout: (lease + Duration::from_secs(1)).max(SQLITE_BUSY_TIMEOUT),
        }
    }

    pub(super) fn apply(&self, conn: &mut SqliteConnection) -> Result<(), DieselError> {
        conn.batch_execute(&format!(
            "PRAGMA busy_timeout = {};
             PRAGMA journal_mode = WAL;
             PRAGMA synchronous = FULL;
             PRAGMA foreign_keys = ON;",
            self.busy_timeout.as_millis()
        ))
        .or_else(|e| match e.to_string().contains("readonly") {
            // A read-only file keeps its journal mode (switching is a write):
            // commands that only read (`keys list`) still work on it.
            true => conn.batch_execute("PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON;"),
            false => Err(e),
        })
    }
}

impl CustomizeConnection<SqliteConnection, r2d2::Error> for SqliteSession {
    fn on_acquire(&self, conn: &mut SqliteConnection) -> Result<(), r2d2::Error> {
        self.apply(conn).map_err(r2d2::Error::QueryError)
    }
}
