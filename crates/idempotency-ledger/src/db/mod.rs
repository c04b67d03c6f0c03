//! The storage a ledger writes through: a connection [`Pool`] of either
//! backend and the one place that knows how a unit of writing is run on
//! each.
//!
//! - SQLite: pooled connections for reads, and one group-committing
//!   [`writer`] that runs every unit of the process, each in a savepoint of
//!   a shared transaction, and answers them all after one `COMMIT` (one
//!   `fsync`).
//! - PostgreSQL: one pool for both, whose sessions start with the lease's
//!   timeouts (`pg.rs`); a unit is a read-committed transaction run on a
//!   blocking thread.
//!
//! The files, by concern: `pool.rs` ([`Pool`], [`Conn`], the unit of
//! writing), `writer.rs` (SQLite's group commit and its watchdog),
//! `sqlite.rs` (SQLite's session settings), `pg.rs` (PostgreSQL's
//! connection manager and session settings), `failure.rs` (how a failed
//! query is answered, whatever the server's language).

mod failure;
mod pg;
mod pool;
mod sqlite;
pub mod writer;

pub use failure::{Failure, classify, learn_wording};
pub use pg::{PG_LOCK_WAIT, PgManager};
pub use pool::{Backend, Conn, ConnectError, Pool, PoolOptions, PooledConn, Unavailable, one_line};
pub use sqlite::{SQLITE_BUSY_TIMEOUT, SqliteSession, timestamp_text};
pub use writer::{WriteError, WriterStats};
