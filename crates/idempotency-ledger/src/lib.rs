#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

#[cfg(feature = "actix-web")]
pub mod actix;
pub mod admission;
pub mod columns;
pub mod db;
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
mod remembered;
mod response;
pub mod row;
pub mod schema;
mod setup;
pub mod store;

pub use fingerprint::{Fingerprint, canonical_json};
pub use key::{HEADER, IdempotencyKey, KeyError, MAX_LEN};
pub use ledger::{
    Completion, DEFAULT_WAITERS_PER_KEY, Ledger, LedgerError, LedgerRequest, LedgerTx, Outcome,
    Settings,
};
pub use maintenance::{Maintenance, MaintenanceOptions, spawn_maintenance};
pub use response::{RECORDED_HEADERS, RecordedResponse, Unreplayable};
pub use setup::{Migrations, OpenError, Options, backend_of, open};

/// The ledger's table on SQLite: the statements of its first migration
/// ([`migrate`] runs them for you).
pub const SQLITE_DDL: &str =
    include_str!("../migrations/sqlite/idempotency-ledger-0001_table/up.sql");
/// The ledger's table on PostgreSQL: the statements of its first migration
/// ([`migrate`] runs them for you).
pub const POSTGRES_DDL: &str =
    include_str!("../migrations/postgres/idempotency-ledger-0001_table/up.sql");
