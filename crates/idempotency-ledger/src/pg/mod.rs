//! PostgreSQL: the protocol's [`Storage`](crate::protocol::Storage) on a
//! server, for several processes on one database.
//!
//! - `pool.rs`: the pool and the storage (a unit is a read-committed
//!   transaction on a blocking thread);
//! - `lock.rs`: the key's advisory lock, tried, never waited for, and the
//!   bound on every other lock wait of a unit (Citus included);
//! - `create.rs`: the one-statement create of a change that is one row;
//! - `share.rs`: the pool's connections that admitted writes may hold;
//! - `session.rs`: the settings every session starts with, and the
//!   dropping of a connection whose server went away;
//! - `wording.rs`: the server's words for the failures that decide an
//!   answer, whatever its language;
//! - `purge.rs`: the purge's batch, Citus-safe.

pub(crate) mod create;
pub(crate) mod lock;
pub(crate) mod pool;
pub(crate) mod purge;
pub(crate) mod session;
pub(crate) mod share;
pub(crate) mod wording;
