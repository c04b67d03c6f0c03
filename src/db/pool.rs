//! The connection pool of either backend, its connections, and
//! [`dispatch!`], which compiles one query for both.

use std::sync::Arc;
use std::time::Duration;

use diesel::prelude::*;
use diesel::r2d2::{self, ConnectionManager, PooledConnection};
use diesel::result::Error as DieselError;

use super::pg::{PgManager, PgSession, checked_out};
use super::sqlite::{SqliteManager, SqlitePool, SqliteSession};
use super::writer::{WriteError, WriterSlot, WriterStats};
use super::{Backend, DatabaseUrl, SetupError, failure, one_line};

/// Pool and session settings.
#[derive(Debug, Clone)]
pub struct PoolOptions {
    pub max_size: u32,
    /// How long a request waits for a free connection (or a reconnect during
    /// an outage) before it is answered `503`.
    pub connection_timeout: Duration,
    /// The idempotency lease: on PostgreSQL no statement and no idle moment
    /// inside a transaction may outlast it.
    pub lease: Duration,
    /// SQLite: how many units may wait for the writer before a write is
    /// refused as overloaded.
    pub write_queue: usize,
}

/// The connection pool of whichever backend `DATABASE_URL` selected.
#[derive(Clone)]
pub enum Pool {
    Sqlite(SqlitePool),
    Postgres(r2d2::Pool<PgManager>),
}

/// A connection checked out of [`Pool`].
pub enum PooledConn {
    Sqlite(PooledConnection<SqliteManager>),
    Postgres(PooledConnection<PgManager>),
}

/// A borrowed connection of either backend: what every storage function takes,
/// so that the same function runs inside or outside a transaction.
pub enum Conn<'a> {
    Sqlite(&'a mut SqliteConnection),
    Postgres(&'a mut PgConnection),
}

/// Runs `$body` once per backend, with `$c` bound to the concrete connection
/// and `$schema` to that backend's table definitions.
///
/// ```ignore
/// dispatch!(conn, c, s => s::orders::table.count().get_result::<i64>(c))
/// ```
#[macro_export]
macro_rules! dispatch {
    ($conn:expr, $c:ident, $schema:ident => $body:expr) => {
        match $conn {
            $crate::db::Conn::Sqlite(inner) => {
                #[allow(unused_imports)]
                use $crate::db::schema::sqlite as $schema;
                let $c: &mut ::diesel::SqliteConnection = &mut **inner;
                $body
            }
            $crate::db::Conn::Postgres(inner) => {
                #[allow(unused_imports)]
                use $crate::db::schema::pg as $schema;
                let $c: &mut ::diesel::PgConnection = &mut **inner;
                $body
            }
        }
    };
}

/// Why a connection could not be checked out at request time.
#[derive(Debug, thiserror::Error)]
#[error("no database connection available: {0}")]
pub struct Unavailable(String);

impl Pool {
    /// Opens one connection first so that a bad URL or an unreachable server
    /// is reported with the driver's own words, then builds the pool.
    pub fn connect(url: &DatabaseUrl, options: &PoolOptions) -> Result<Self, SetupError> {
        let connect_error = |e: diesel::ConnectionError| SetupError::connect(url, &e);
        match url.backend() {
            Backend::Sqlite => {
                let mut probe = SqliteConnection::establish(url.as_str()).map_err(connect_error)?;
                let session = SqliteSession::for_lease(options.lease);
                session.apply(&mut probe).map_err(|e| SetupError::Connect {
                    target: url.to_string(),
                    cause: one_line(&e.to_string()),
                })?;
                drop(probe);
                let readers = pool_builder(url, options)
                    .connection_customizer(Box::new(session))
                    .build(ConnectionManager::new(url.as_str()))
                    .map_err(|e| SetupError::Pool(e.to_string()))?;
                Ok(Pool::Sqlite(SqlitePool {
                    readers,
                    writer: Arc::new(WriterSlot::new(
                        url.as_str(),
                        session,
                        options.write_queue.max(1),
                        options.lease,
                    )),
                }))
            }
            Backend::Postgres => {
                PgConnection::establish(url.as_str()).map_err(connect_error)?;
                failure::learn_wording(url.as_str()).map_err(|e| SetupError::Connect {
                    target: url.to_string(),
                    cause: one_line(&e.to_string()),
                })?;
                pool_builder(url, options)
                    .connection_customizer(Box::new(PgSession {
                        lease: options.lease,
                    }))
                    .build(PgManager(ConnectionManager::new(url.as_str())))
                    .map(Pool::Postgres)
                    .map_err(|e| SetupError::Pool(e.to_string()))
            }
        }
    }

    pub fn backend(&self) -> Backend {
        match self {
            Pool::Sqlite(_) => Backend::Sqlite,
            Pool::Postgres(_) => Backend::Postgres,
        }
    }

    /// Checks out a connection for reading (on PostgreSQL also for writing
    /// outside [`Pool::write`], as one-shot commands do), waiting at most
    /// the pool's connection timeout.
    pub fn get(&self) -> Result<PooledConn, Unavailable> {
        match self {
            Pool::Sqlite(p) => p.readers.get().map(PooledConn::Sqlite),
            Pool::Postgres(p) => checked_out(p).map(PooledConn::Postgres),
        }
        .map_err(|e| Unavailable(e.to_string()))
    }

    /// What the SQLite writer has done (`None` on PostgreSQL, or before the
    /// first write).
    pub fn writer_stats(&self) -> Option<WriterStats> {
        match self {
            Pool::Sqlite(p) => p.writer.stats(),
            Pool::Postgres(_) => None,
        }
    }

    /// Runs `work` as one unit of writing, atomically: `Ok` persists (and is
    /// on stable storage when this returns), `Err` changes nothing.
    ///
    /// - SQLite: the unit joins the next batch of the
    ///   [`Writer`](super::writer::Writer), inside its own
    ///   savepoint of the batch's transaction, and this returns once that
    ///   transaction has committed (group commit).
    /// - PostgreSQL: a read-committed transaction on a pooled connection;
    ///   the server's own WAL flushing groups concurrent commits.
    ///
    /// The outer `Err` says the unit's fate is that of a rolled-back one
    /// (the batch could not commit, or no connection was available).
    pub fn write<F, T, E>(&self, work: F) -> Result<Result<T, E>, WriteError>
    where
        F: FnOnce(&mut Conn<'_>) -> Result<T, E> + Send + 'static,
        T: Send + 'static,
        E: From<DieselError> + Send + 'static,
    {
        match self {
            Pool::Sqlite(p) => p.writer.get()?.run(work),
            Pool::Postgres(p) => {
                let mut conn =
                    checked_out(p).map_err(|e| WriteError::Unavailable(e.to_string()))?;
                Ok(conn.transaction(|c| work(&mut Conn::Postgres(c))))
            }
        }
    }
}

fn pool_builder<M>(url: &DatabaseUrl, options: &PoolOptions) -> r2d2::Builder<M>
where
    M: r2d2::ManageConnection,
    M::Error: std::fmt::Display,
{
    r2d2::Pool::builder()
        .error_handler(Box::new(LogConnectError {
            database: url.to_string(),
        }))
        .max_size(options.max_size)
        .min_idle(Some(1))
        .connection_timeout(options.connection_timeout)
        // A dead connection is dropped when it goes back after its first
        // failed query (see `PgManager`), so a `SELECT 1` on every checkout
        // would be a wasted round trip.
        .test_on_check_out(false)
}

/// Logs a connection the pool could not open (it keeps retrying) as one
/// event on one line: which database, and libpq's words folded.
#[derive(Debug)]
struct LogConnectError {
    database: String,
}

impl<E: std::fmt::Display> r2d2::HandleError<E> for LogConnectError {
    fn handle_error(&self, error: E) {
        tracing::warn!(
            database = %self.database,
            cause = %one_line(&error.to_string()),
            "cannot open a database connection; retrying"
        );
    }
}

impl PooledConn {
    pub fn conn(&mut self) -> Conn<'_> {
        match self {
            PooledConn::Sqlite(c) => Conn::Sqlite(c),
            PooledConn::Postgres(c) => Conn::Postgres(c),
        }
    }
}
