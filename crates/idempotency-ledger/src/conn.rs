//! What every layer shares: a connection of either backend, and why
//! storage could not answer.

use std::future::Future;
use std::time::Duration;

use diesel::result::Error as DieselError;
use diesel::{PgConnection, SqliteConnection};

/// How long past the lease a unit's caller waits for its answer at most,
/// on either backend; on SQLite also how long past the lease a batch may
/// spend in its `COMMIT`, and writing may stay impossible, before the
/// writer gives up on it (see [`write_bound`]).
pub const COMMIT_GRACE: Duration = Duration::from_secs(5);

/// The lease plus [`COMMIT_GRACE`]: within it of handing a unit over, its
/// caller is answered.
pub fn write_bound(lease: Duration) -> Duration {
    lease.saturating_add(COMMIT_GRACE)
}

/// `answer`, or at [`write_bound`] the words that say the outcome is
/// unknown (a `COMMIT` may still go through).
pub(crate) async fn answered_in_time<T>(
    lease: Duration,
    answer: impl Future<Output = T>,
) -> Result<T, String> {
    tokio::time::timeout(write_bound(lease), answer)
        .await
        .map_err(|_| {
            format!(
                "no answer within the lease plus {} s: the outcome is unknown",
                COMMIT_GRACE.as_secs()
            )
        })
}

/// A borrowed connection of either backend: what every storage function
/// takes, so that the same function runs inside or outside a transaction.
pub enum Conn<'a> {
    /// SQLite.
    Sqlite(&'a mut SqliteConnection),
    /// PostgreSQL.
    Postgres(&'a mut PgConnection),
}

/// Why a unit of writing's outcome is not known to have persisted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WriteError {
    /// The unit could not be committed (or its transaction was lost, or no
    /// connection could be had); none of its work persisted — except when
    /// the words say the outcome is unknown (no answer within the lease
    /// plus the commit grace). Safe to retry.
    #[error("the write could not be committed: {0}")]
    Unavailable(String),
    /// The queue is full: the writer is behind. Safe to retry later.
    #[error("the writer's queue is full")]
    Overloaded,
    /// The unit panicked; it was rolled back.
    #[error("the unit of work panicked: {0}")]
    Panicked(String),
}

/// Why a connection could not be checked out at request time.
#[derive(Debug, thiserror::Error)]
#[error("no database connection available: {0}")]
pub struct Unavailable(pub(crate) String);

/// A read's answer, or unavailable at `bound`: a read that does not come
/// back (a frozen file system, a server that stopped answering) keeps its
/// blocking thread and its connection until it returns, but its caller is
/// answered.
pub(crate) async fn read_in_time<T>(
    bound: Duration,
    read: tokio::task::JoinHandle<Result<T, StorageError>>,
) -> Result<T, StorageError> {
    match tokio::time::timeout(bound, read).await {
        Ok(Ok(found)) => found,
        Ok(Err(lost)) => Err(StorageError::Internal(lost.to_string())),
        Err(_) => Err(StorageError::Unavailable(format!(
            "the read of the key had no answer within {} s",
            bound.as_secs()
        ))),
    }
}

/// Why a read (or a backend's one-statement create) could not answer.
#[derive(Debug)]
pub enum StorageError {
    /// No connection, or no answer in time: the words say which.
    Unavailable(String),
    /// The query failed (classified by the caller).
    Database(DieselError),
    /// A defect of the ledger's own (a task lost).
    Internal(String),
}

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

/// How a backend's one-go create (`Storage::create`) ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Created {
    /// The row and the entry are committed.
    Written,
    /// Nothing was written: the unit decides.
    Undecided,
    /// Another transaction holds a lock of the key's past its lock wait.
    InProgress,
}
