#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

#[cfg(not(any(feature = "sqlite", feature = "postgres")))]
compile_error!("idempotency-ledger needs a backend: the feature `sqlite`, `postgres`, or both");

#[cfg(feature = "actix-web")]
pub mod actix;
mod admission;
pub mod columns;
mod conn;
mod entry;
mod failure;
#[cfg(feature = "fault-points")]
pub mod fault;
mod fingerprint;
mod inflight;
#[cfg(any(test, feature = "invariants"))]
pub mod invariants;
mod key;
mod ledger;
pub mod maintenance;
pub mod migrate;
mod options;
#[cfg(feature = "postgres")]
mod pg;
mod pool;
pub mod protocol;
mod remembered;
mod response;
pub mod row;
pub mod schema;
mod setup;
#[cfg(feature = "sqlite")]
mod sqlite;
mod work;

pub use admission::{Admission, DEFAULT_WRITE_ADMISSION};
pub use fingerprint::{Fingerprint, canonical_json};
pub use key::{HEADER, IdempotencyKey, KeyError, MAX_LEN};
pub use ledger::{
    Completion, DEFAULT_WAITERS_PER_KEY, LedgerError, LedgerRequest, LedgerTx, Outcome, Settings,
};
pub use maintenance::{Maintenance, MaintenanceOptions, spawn_maintenance};
pub use response::{RECORDED_HEADERS, RecordedResponse, Unreplayable};
pub use setup::{Migrations, OpenError, Options, backend_of, open};

/// The idempotency ledger of one process: its settings, its storage (a
/// [`Pool`](db::Pool) of either backend unless another
/// [`Storage`](protocol::Storage) is named), the keys it is running
/// requests for, and its write admission; how it answers is [`protocol`].
/// Cheap to clone (one `Arc`).
pub struct Ledger<S = db::Pool> {
    inner: std::sync::Arc<ledger::Inner<S>>,
}

impl<S> Clone for Ledger<S> {
    fn clone(&self) -> Self {
        Self {
            inner: std::sync::Arc::clone(&self.inner),
        }
    }
}

/// The ledger's table on SQLite: the statements of its first migration
/// ([`migrate`] runs them for you).
pub const SQLITE_DDL: &str =
    include_str!("../migrations/sqlite/idempotency-ledger-0001_table/up.sql");
/// The ledger's table on PostgreSQL: the statements of its first migration
/// ([`migrate`] runs them for you).
pub const POSTGRES_DDL: &str =
    include_str!("../migrations/postgres/idempotency-ledger-0001_table/up.sql");

pub mod db {
    //! The storage a ledger writes through: a connection [`Pool`] of either
    //! backend, each implementing the protocol's
    //! [`Storage`](crate::protocol::Storage) in its own folder
    //! (`src/sqlite/`, `src/pg/`; how a request is answered is
    //! `src/protocol.rs`, not restated here).
    //!
    //! - SQLite: pooled connections for reads, and one group-committing
    //!   [`writer`] that runs every unit of the process, each in a savepoint
    //!   of a shared transaction, and answers them all after one `COMMIT`.
    //! - PostgreSQL: one pool for both, whose sessions start with the
    //!   lease's timeouts; a unit is a read-committed transaction run on a
    //!   blocking thread.

    // The pool, its connections, and a unit's failures.
    pub use crate::conn::{COMMIT_GRACE, Conn, Unavailable, WriteError, write_bound};
    pub use crate::options::{ConnectError, PoolOptions, one_line};
    pub use crate::pool::{Backend, Pool, PooledConn};
    // How a failed query is answered, whatever the server's language.
    pub use crate::conn::Failure;
    pub use crate::failure::classify;
    #[cfg(feature = "postgres")]
    pub use crate::pg::session::drop_if_lost;
    // The ledger's table, for a command or an operator: its size, a purge
    // batch in the caller's transaction, PostgreSQL's purge statement (to
    // `EXPLAIN` it), and a key's advisory lock (to see it in `pg_locks`).
    pub use crate::entry::{count, purge_batch};
    #[cfg(feature = "postgres")]
    pub use crate::pg::lock::{PG_LOCK_WAIT, lock_id};
    #[cfg(feature = "postgres")]
    pub use crate::pg::purge::PURGE_POSTGRES;
    // SQLite's sessions, and timestamps as it stores them.
    pub use crate::conn::{WriterHealth, WriterStats};
    #[cfg(feature = "sqlite")]
    pub use crate::sqlite::session::{SQLITE_BUSY_TIMEOUT, SqliteSession, timestamp_text};
    #[cfg(feature = "sqlite")]
    pub use crate::sqlite::writer;
}
