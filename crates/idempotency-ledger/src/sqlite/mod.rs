//! SQLite: the protocol's [`Storage`](crate::protocol::Storage) on a file,
//! one writer per process.
//!
//! - `pool.rs`: the pool and the storage (reads on pooled connections,
//!   every unit on the writer);
//! - `writer/`: the group-committing writer, its fence and its watchdog;
//! - `session.rs`: the settings every connection starts with, and
//!   timestamps as SQLite stores them;
//! - `purge.rs`: the purge's batch.

pub(crate) mod pool;
pub(crate) mod purge;
pub(crate) mod session;
pub mod writer;
