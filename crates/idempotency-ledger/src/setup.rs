//! A ledger in one call: [`open`] picks the backend from the URL, applies
//! the ledger's migrations and the application's, connects the pool and
//! makes the ledger, each setting given once ([`Options`]).

use std::time::Duration;

use diesel_migrations::EmbeddedMigrations;

use crate::db::{Backend, ConnectError, Pool, PoolOptions};
use crate::migrate::{self, MigrateError};
use crate::{DEFAULT_WAITERS_PER_KEY, Ledger, Settings};

/// An application's own migrations, one set per backend (each made by
/// `diesel_migrations::embed_migrations!`); [`open`] runs the one of the
/// backend it opens, after the ledger's.
pub struct Migrations {
    /// The set for SQLite.
    pub sqlite: EmbeddedMigrations,
    /// The set for PostgreSQL.
    pub postgres: EmbeddedMigrations,
}

impl std::fmt::Debug for Migrations {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Migrations").finish_non_exhaustive()
    }
}

/// Everything [`open`] needs, each setting once; [`Options::default`] is
/// a sound start.
#[derive(Debug)]
pub struct Options {
    /// The application's migrations, run after the ledger's.
    pub migrations: Option<Migrations>,
    /// How long an entry answers its key (default a day).
    pub retention: Duration,
    /// How long a unit of writing may hold its key; past it, it may not
    /// record (default 30 s). It bounds PostgreSQL's statements and idle
    /// transactions and SQLite's batches too.
    pub lease: Duration,
    /// How long a duplicate waits for the request holding its key before
    /// it is answered "in progress" (default 5 s).
    pub wait: Duration,
    /// How long a request waits for a database connection (default 5 s).
    pub connection_timeout: Duration,
    /// The most connections the pool opens (default 8).
    pub max_connections: u32,
    /// How many units of writing this process admits at once; past it a
    /// mutation is answered "overloaded" at once (default 64).
    pub write_admission: u32,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            migrations: None,
            retention: Duration::from_secs(86_400),
            lease: Duration::from_secs(30),
            wait: Duration::from_secs(5),
            connection_timeout: Duration::from_secs(5),
            max_connections: 8,
            write_admission: 64,
        }
    }
}

/// Why [`open`] failed.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The migrations could not run.
    #[error(transparent)]
    Migrate(#[from] MigrateError),
    /// The pool could not be built.
    #[error("cannot connect: {0}")]
    Connect(#[from] ConnectError),
}

/// The backend a URL names: PostgreSQL for `postgres://` and
/// `postgresql://`, SQLite (a file path) for anything else.
pub fn backend_of(url: &str) -> Backend {
    match url.starts_with("postgres://") || url.starts_with("postgresql://") {
        true => Backend::Postgres,
        false => Backend::Sqlite,
    }
}

/// Opens the database at `url` ([`backend_of`]), applies the ledger's
/// migrations and the application's ([`migrate::run`]: safe at every
/// start and from processes starting at once), connects the pool and
/// returns the ledger ([`Ledger::pool`] is its pool).
pub fn open(url: &str, options: Options) -> Result<Ledger, OpenError> {
    let backend = backend_of(url);
    let ours = options.migrations.map(|m| match backend {
        Backend::Sqlite => m.sqlite,
        Backend::Postgres => m.postgres,
    });
    migrate::run(backend, url, ours)?;
    let pool = Pool::connect(
        backend,
        url,
        &PoolOptions {
            max_size: options.max_connections,
            connection_timeout: options.connection_timeout,
            lease: options.lease,
            write_queue: 1_024,
            shown: shown(url),
        },
    )?;
    Ok(Ledger::new(
        pool,
        Settings {
            retention: options.retention,
            wait: options.wait,
            waiters_per_key: DEFAULT_WAITERS_PER_KEY,
            write_admission: options.write_admission,
            remember: Duration::from_secs(1),
        },
    ))
}

/// The URL as log lines may show it: without a password.
fn shown(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}{}", &url[..scheme + 3], &url[at + 1..])
        }
        _ => url.to_owned(),
    }
}

/// Runs one diesel query on whichever backend a connection is: the query
/// is written once, compiled for both.
///
/// ```
/// # use diesel::prelude::*;
/// # fn count(conn: &mut idempotency_ledger::db::Conn<'_>) -> QueryResult<i64> {
/// let query = diesel::select(diesel::dsl::sql::<diesel::sql_types::BigInt>("1"));
/// idempotency_ledger::on_conn!(conn, c => query.get_result::<i64>(c))
/// # }
/// ```
#[cfg(all(feature = "sqlite", feature = "postgres"))]
#[macro_export]
macro_rules! on_conn {
    ($conn:expr, $c:ident => $query:expr) => {
        match $conn {
            $crate::db::Conn::Sqlite(c) => {
                let $c: &mut ::diesel::SqliteConnection = c;
                $query
            }
            $crate::db::Conn::Postgres(c) => {
                let $c: &mut ::diesel::PgConnection = c;
                $query
            }
        }
    };
}

/// Runs one diesel query on whichever backend a connection is: the query
/// is written once, compiled for both.
///
/// ```
/// # use diesel::prelude::*;
/// # fn count(conn: &mut idempotency_ledger::db::Conn<'_>) -> QueryResult<i64> {
/// let query = diesel::select(diesel::dsl::sql::<diesel::sql_types::BigInt>("1"));
/// idempotency_ledger::on_conn!(conn, c => query.get_result::<i64>(c))
/// # }
/// ```
#[cfg(all(feature = "sqlite", not(feature = "postgres")))]
#[macro_export]
macro_rules! on_conn {
    ($conn:expr, $c:ident => $query:expr) => {
        match $conn {
            $crate::db::Conn::Sqlite(c) => {
                let $c: &mut ::diesel::SqliteConnection = c;
                $query
            }
        }
    };
}

/// Runs one diesel query on whichever backend a connection is: the query
/// is written once, compiled for both.
///
/// ```
/// # use diesel::prelude::*;
/// # fn count(conn: &mut idempotency_ledger::db::Conn<'_>) -> QueryResult<i64> {
/// let query = diesel::select(diesel::dsl::sql::<diesel::sql_types::BigInt>("1"));
/// idempotency_ledger::on_conn!(conn, c => query.get_result::<i64>(c))
/// # }
/// ```
#[cfg(all(feature = "postgres", not(feature = "sqlite")))]
#[macro_export]
macro_rules! on_conn {
    ($conn:expr, $c:ident => $query:expr) => {
        match $conn {
            $crate::db::Conn::Postgres(c) => {
                let $c: &mut ::diesel::PgConnection = c;
                $query
            }
        }
    };
}
