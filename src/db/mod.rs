//! Storage plumbing shared by every part of the service: which backend
//! (`url.rs`), the connection pool, migrations (`migrate.rs`), and the one
//! place that knows how a writing transaction is opened on each backend.
//!
//! Query code is written once and compiled for both backends by
//! [`dispatch!`]. A lookup by a unique key uses `get_result`, never
//! `first`: `first` binds `LIMIT ?`, and the bundled SQLite (built with
//! `SQLITE_ENABLE_STAT4`) expires a cached statement whose plan read a bound
//! integer each time that parameter is bound again, so every run of it would
//! be compiled anew (40 % of a `GET` in a profile). A statement that only one
//! backend understands lives in a small named function beside its siblings (see `idempotency::store`).
//!
//! The files, by concern: `pool.rs` (the [`Pool`] of either backend, its
//! connections and [`dispatch!`]), `pg.rs` (the PostgreSQL connection
//! manager and session settings), `sqlite.rs` (the SQLite session settings
//! and reader pool), `writer.rs` (SQLite's group-committing writer),
//! `setup.rs` (why setting up the database failed), `failure.rs` (how a
//! failed query is answered), `url.rs`, `migrate.rs` and `schema.rs`.

mod failure;
mod migrate;
mod pg;
mod pool;
pub mod schema;
mod setup;
mod sqlite;
mod url;
pub mod writer;

pub use failure::{Failure, classify};
pub use migrate::{migrations_applied, run_migrations};
pub use pg::{PG_LOCK_WAIT, PgManager};
pub use pool::{Conn, Pool, PoolOptions, PooledConn, Unavailable};
pub use setup::SetupError;
pub use sqlite::SqlitePool;
pub(crate) use sqlite::timestamp_text;
pub use url::{Backend, DatabaseUrl, one_line};
pub use writer::{WriteError, WriterStats};

pub use crate::dispatch;

use pg::{PG_MIGRATION_LOCK, note_connection_lost};
use sqlite::{SQLITE_BUSY_TIMEOUT, SqliteSession};
