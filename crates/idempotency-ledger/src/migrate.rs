//! The ledger's table as migrations the crate ships, safe to run at every
//! start and from several processes at once.
//!
//! [`run`] is the one call: it opens its own connection, serialises itself
//! against every other process migrating the same database (SQLite: one
//! `BEGIN IMMEDIATE` transaction, waiting for the file's lock up to
//! [`SQLITE_BUSY_TIMEOUT`]; PostgreSQL: a
//! session advisory lock), applies the ledger's pending migrations, then the
//! application's own set, and returns the versions it applied (none on a
//! second start).
//!
//! The ledger's migrations are diesel migrations embedded in the crate
//! ([`SQLITE_MIGRATIONS`], [`POSTGRES_MIGRATIONS`]), recorded in diesel's
//! `__diesel_schema_migrations` beside the application's, under versions
//! of their own (`idempotencyledger0001`, …) that no timestamped or
//! `diesel setup` version collides with. Their statements are
//! `IF NOT EXISTS`: a database whose own migrations made the table already
//! keeps it. An application whose migrations must run before the ledger's,
//! or on a connection of its own, runs them inside [`with_sqlite_lock`] or
//! [`with_postgres_lock`] with diesel's `MigrationHarness`.

#[cfg(feature = "postgres")]
use std::time::Duration;

#[cfg(feature = "postgres")]
use diesel::PgConnection;
#[cfg(feature = "sqlite")]
use diesel::SqliteConnection;
#[cfg(feature = "sqlite")]
use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel_migrations::{EmbeddedMigrations, MigrationHarness, embed_migrations};

use crate::db::Backend;
#[cfg(feature = "sqlite")]
use crate::db::SQLITE_BUSY_TIMEOUT;

/// The ledger's migrations on SQLite.
#[cfg(feature = "sqlite")]
pub const SQLITE_MIGRATIONS: EmbeddedMigrations = embed_migrations!("migrations/sqlite");
/// The ledger's migrations on PostgreSQL.
#[cfg(feature = "postgres")]
pub const POSTGRES_MIGRATIONS: EmbeddedMigrations = embed_migrations!("migrations/postgres");

/// The PostgreSQL advisory lock (session-scoped) that serialises the
/// processes migrating one database through this module.
pub const POSTGRES_MIGRATION_LOCK: i64 = 0x6c65_6467_6572_6d69;

/// How long a process waits between two tries of [`POSTGRES_MIGRATION_LOCK`].
#[cfg(feature = "postgres")]
const LOCK_POLL: Duration = Duration::from_millis(100);

/// Why the migrations could not run; the driver's words, never a password.
#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    /// The database could not be opened.
    #[error("cannot open the database: {0}")]
    Connect(#[from] diesel::ConnectionError),
    /// A statement failed (a migration, the lock, the session's settings).
    #[error("migrating failed: {0}")]
    Migrate(String),
}

impl From<diesel::result::Error> for MigrateError {
    fn from(e: diesel::result::Error) -> Self {
        MigrateError::Migrate(e.to_string())
    }
}

type HarnessError = Box<dyn std::error::Error + Send + Sync>;

/// Applies the ledger's pending migrations and then `app`'s (the set for
/// `backend`, e.g. `embed_migrations!("migrations/sqlite")`) on a
/// connection of its own to `url`, serialised against every other process
/// doing the same; returns the versions applied (empty when there was
/// nothing to do). Safe at every start, and from several processes
/// starting at once.
pub fn run(
    backend: Backend,
    url: &str,
    app: Option<EmbeddedMigrations>,
) -> Result<Vec<String>, MigrateError> {
    match backend {
        #[cfg(feature = "sqlite")]
        Backend::Sqlite => {
            let mut conn = SqliteConnection::establish(url)?;
            with_sqlite_lock(&mut conn, |c| {
                let mut applied = versions(c.run_pending_migrations(SQLITE_MIGRATIONS)?);
                if let Some(app) = app {
                    applied.extend(versions(c.run_pending_migrations(app)?));
                }
                Ok(applied)
            })
        }
        #[cfg(feature = "postgres")]
        Backend::Postgres => {
            let mut conn = PgConnection::establish(url)?;
            with_postgres_lock(&mut conn, |c| {
                let mut applied = versions(c.run_pending_migrations(POSTGRES_MIGRATIONS)?);
                if let Some(app) = app {
                    applied.extend(versions(c.run_pending_migrations(app)?));
                }
                Ok(applied)
            })
        }
        #[allow(unreachable_patterns)]
        other => Err(MigrateError::Migrate(format!(
            "this build of idempotency-ledger has no {other:?} backend (its cargo feature is off)"
        ))),
    }
}

fn versions(applied: Vec<diesel::migration::MigrationVersion<'_>>) -> Vec<String> {
    applied.iter().map(ToString::to_string).collect()
}

/// Runs `migrate` on `conn` inside one `BEGIN IMMEDIATE` transaction: the
/// file's write lock is taken before anything is read, so a second process
/// waits (its `busy_timeout`, set here to at least
/// [`SQLITE_BUSY_TIMEOUT`]) and then finds
/// every migration applied. diesel's harness runs each migration in a
/// savepoint of it. Everything `migrate` applies commits together, or
/// nothing does.
#[cfg(feature = "sqlite")]
pub fn with_sqlite_lock<T>(
    conn: &mut SqliteConnection,
    migrate: impl FnOnce(&mut SqliteConnection) -> Result<T, HarnessError>,
) -> Result<T, MigrateError> {
    conn.batch_execute(&format!(
        "PRAGMA busy_timeout = {};",
        SQLITE_BUSY_TIMEOUT.as_millis()
    ))?;
    conn.immediate_transaction::<T, Failed, _>(|c| migrate(c).map_err(Failed::Harness))
        .map_err(MigrateError::from)
}

#[cfg(feature = "postgres")]
diesel::define_sql_function! {
    /// PostgreSQL: takes a session-scoped advisory lock if it is free.
    fn pg_try_advisory_lock(key: diesel::sql_types::BigInt) -> diesel::sql_types::Bool;
}

#[cfg(feature = "postgres")]
diesel::define_sql_function! {
    /// PostgreSQL: releases a session-scoped advisory lock.
    fn pg_advisory_unlock(key: diesel::sql_types::BigInt) -> diesel::sql_types::Bool;
}

/// Runs `migrate` on `conn` while holding [`POSTGRES_MIGRATION_LOCK`],
/// tried again after a pause while another process holds it — never waited
/// for inside a statement, so that a waiting session holds no snapshot a
/// `CREATE INDEX CONCURRENTLY` of the holder's would wait for. `migrate`
/// runs outside any transaction (diesel's harness gives each migration its
/// own, unless it says otherwise).
#[cfg(feature = "postgres")]
pub fn with_postgres_lock<T>(
    conn: &mut PgConnection,
    migrate: impl FnOnce(&mut PgConnection) -> Result<T, HarnessError>,
) -> Result<T, MigrateError> {
    while !diesel::select(pg_try_advisory_lock(POSTGRES_MIGRATION_LOCK)).get_result::<bool>(conn)? {
        std::thread::sleep(LOCK_POLL);
    }
    let result = migrate(conn).map_err(|e| MigrateError::Migrate(e.to_string()));
    // Closing the session releases the lock too, should this fail.
    let _ = diesel::select(pg_advisory_unlock(POSTGRES_MIGRATION_LOCK)).get_result::<bool>(conn);
    result
}

/// A transaction's failure: the harness's or the transaction's own.
#[cfg(feature = "sqlite")]
#[derive(Debug)]
enum Failed {
    Harness(HarnessError),
    Database(diesel::result::Error),
}

#[cfg(feature = "sqlite")]
impl From<diesel::result::Error> for Failed {
    fn from(e: diesel::result::Error) -> Self {
        Failed::Database(e)
    }
}

#[cfg(feature = "sqlite")]
impl From<Failed> for MigrateError {
    fn from(e: Failed) -> Self {
        match e {
            Failed::Harness(e) => MigrateError::Migrate(e.to_string()),
            Failed::Database(e) => MigrateError::from(e),
        }
    }
}
