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

mod failure;
mod migrate;
pub mod schema;
mod url;
pub mod writer;

pub use failure::{Failure, classify};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::r2d2::{self, ConnectionManager, CustomizeConnection, PooledConnection};
use diesel::result::Error as DieselError;

pub use migrate::{migrations_applied, run_migrations};
pub use url::{Backend, DatabaseUrl, one_line};
use writer::Writer;
pub use writer::{WriteError, WriterStats};

/// The least time a SQLite writer waits for the database lock before giving
/// up (pooled connections wait a little longer than the lease, see
/// [`SqliteSession`]).
const SQLITE_BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a request waits on PostgreSQL for a row another transaction
/// holds (in practice: a concurrent request with the same idempotency key)
/// before it is answered `409 IDEMPOTENCY_IN_PROGRESS`.
pub const PG_LOCK_WAIT: Duration = Duration::from_secs(2);
/// An arbitrary, fixed advisory-lock id that serialises migrations when
/// several processes start against one PostgreSQL database at once.
const PG_MIGRATION_LOCK: i64 = 0x6f72_6465_7273;

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

type SqliteManager = ConnectionManager<SqliteConnection>;

/// PostgreSQL connections for r2d2, which also drops a connection on which
/// the thread that returns it saw the server go away.
///
/// diesel calls a `PgConnection` broken only when its transaction state is,
/// so a connection that lost its server between two transactions would go
/// back to the pool and fail every request that draws it ("no connection to
/// the server") until the process restarts. A ping on every checkout would
/// cost a round trip per request; instead [`classify`] notes a lost
/// connection on the current thread, and the connection that thread returns
/// next is dropped (errors are classified before the connection that caused
/// them goes back: both happen on the blocking thread that ran the query).
#[derive(Debug)]
pub struct PgManager(ConnectionManager<PgConnection>);

thread_local! {
    static CONNECTION_LOST: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Marks the PostgreSQL connection this thread holds as lost.
fn note_connection_lost() {
    CONNECTION_LOST.set(true);
}

/// A connection from the pool, with this thread's lost-connection flag
/// cleared: it speaks of this connection only (a failure classified after an
/// earlier connection went back must not drop this one).
fn checked_out(
    pool: &r2d2::Pool<PgManager>,
) -> Result<PooledConnection<PgManager>, r2d2::PoolError> {
    let conn = pool.get()?;
    CONNECTION_LOST.set(false);
    Ok(conn)
}

impl r2d2::ManageConnection for PgManager {
    type Connection = PgConnection;
    type Error = r2d2::Error;

    fn connect(&self) -> Result<PgConnection, r2d2::Error> {
        self.0.connect()
    }

    fn is_valid(&self, conn: &mut PgConnection) -> Result<(), r2d2::Error> {
        self.0.is_valid(conn)
    }

    fn has_broken(&self, conn: &mut PgConnection) -> bool {
        CONNECTION_LOST.replace(false) | self.0.has_broken(conn)
    }
}

/// The connection pool of whichever backend `DATABASE_URL` selected.
#[derive(Clone)]
pub enum Pool {
    Sqlite(SqlitePool),
    Postgres(r2d2::Pool<PgManager>),
}

/// SQLite: pooled connections for reads, and one [`Writer`] that commits
/// every write of this process in batches (started on the first write, so a
/// command that only reads never opens it).
#[derive(Clone)]
pub struct SqlitePool {
    readers: r2d2::Pool<SqliteManager>,
    writer: Arc<WriterSlot>,
}

struct WriterSlot {
    path: String,
    session: SqliteSession,
    capacity: usize,
    lease: Duration,
    writer: Mutex<Option<Arc<Writer>>>,
}

impl WriterSlot {
    fn get(&self) -> Result<Arc<Writer>, WriteError> {
        let mut slot = self
            .writer
            .lock()
            .map_err(|_| WriteError::Unavailable("the writer's lock is poisoned".into()))?;
        if let Some(writer) = slot.as_ref() {
            return Ok(Arc::clone(writer));
        }
        let unavailable =
            |e: String| WriteError::Unavailable(format!("cannot open the writer: {e}"));
        let (path, session) = (self.path.clone(), self.session);
        let open = move || -> Result<SqliteConnection, String> {
            let mut conn = SqliteConnection::establish(&path).map_err(|e| e.to_string())?;
            session.apply(&mut conn).map_err(|e| e.to_string())?;
            Ok(conn)
        };
        let conn = open().map_err(unavailable)?;
        let writer = Arc::new(
            Writer::start(conn, Box::new(open), self.capacity, self.lease)
                .map_err(|e| unavailable(e.to_string()))?,
        );
        *slot = Some(Arc::clone(&writer));
        Ok(writer)
    }
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
pub use dispatch;

/// Why the database could not be set up at start.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("cannot open database {target}: {cause}")]
    Connect { target: String, cause: String },
    #[error("database {name:?} does not exist on {target} and could not be created: {cause}")]
    CreateDatabase {
        name: String,
        target: String,
        cause: String,
    },
    #[error("cannot read database {target}: {cause}")]
    Read { target: String, cause: String },
    #[error("cannot apply migrations to {target}: {cause}")]
    Migrate { target: String, cause: String },
    #[error("cannot build the connection pool: {0}")]
    Pool(String),
}

impl SetupError {
    /// A connection that could not be opened: the URL as typed (never its
    /// password) and the cause on one line; for SQLite, what is wrong with
    /// the location when the driver only says it cannot open the file.
    fn connect(url: &DatabaseUrl, error: &diesel::ConnectionError) -> Self {
        let driver = one_line(&error.to_string());
        SetupError::Connect {
            target: url.to_string(),
            cause: match url.backend() {
                Backend::Sqlite => url::sqlite_open_cause(url.as_str(), driver),
                Backend::Postgres => driver,
            },
        }
    }
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
                    writer: Arc::new(WriterSlot {
                        path: url.as_str().to_owned(),
                        session,
                        capacity: options.write_queue.max(1),
                        lease: options.lease,
                        writer: Mutex::new(None),
                    }),
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
            Pool::Sqlite(p) => p.writer.writer.lock().ok()?.as_ref().map(|w| w.stats()),
            Pool::Postgres(_) => None,
        }
    }

    /// Runs `work` as one unit of writing, atomically: `Ok` persists (and is
    /// on stable storage when this returns), `Err` changes nothing.
    ///
    /// - SQLite: the unit joins the [`Writer`]'s next batch, inside its own
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

/// Per-connection SQLite settings. `busy_timeout` comes first so that the
/// following pragmas already wait for a lock instead of failing.
///
/// SQLite has one write lock for the whole file, so a request with the same
/// idempotency key as a running one waits for that lock, whatever key the
/// holder has. A holder may keep it at most its lease (the ledger rolls back
/// a holder past its lease), so a writer waits a little longer than the
/// lease: a duplicate then replays the holder's answer instead of failing
/// with "database is locked" while the holder is still within its rights.
#[derive(Debug, Clone, Copy)]
struct SqliteSession {
    busy_timeout: Duration,
}

impl SqliteSession {
    fn for_lease(lease: Duration) -> Self {
        Self {
            busy_timeout: (lease + Duration::from_secs(1)).max(SQLITE_BUSY_TIMEOUT),
        }
    }

    fn apply(&self, conn: &mut SqliteConnection) -> Result<(), DieselError> {
        conn.batch_execute(&format!(
            "PRAGMA busy_timeout = {};
             PRAGMA journal_mode = WAL;
             PRAGMA synchronous = FULL;
             PRAGMA foreign_keys = ON;",
            self.busy_timeout.as_millis()
        ))
        .or_else(|e| match e.to_string().contains("readonly") {
            // A read-only file keeps its journal mode (switching is a write):
            // commands that only read (`keys list`) still work on it.
            true => conn.batch_execute("PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON;"),
            false => Err(e),
        })
    }
}

impl CustomizeConnection<SqliteConnection, r2d2::Error> for SqliteSession {
    fn on_acquire(&self, conn: &mut SqliteConnection) -> Result<(), r2d2::Error> {
        self.apply(conn).map_err(r2d2::Error::QueryError)
    }
}

/// Per-connection PostgreSQL settings: READ COMMITTED, how long a request
/// waits for a row another transaction holds, and the lease that bounds how
/// long any transaction may hold its claim (a hung holder's session is ended
/// by the server, so its transaction can never commit late).
#[derive(Debug, Clone, Copy)]
struct PgSession {
    lease: Duration,
}

impl CustomizeConnection<PgConnection, r2d2::Error> for PgSession {
    fn on_acquire(&self, conn: &mut PgConnection) -> Result<(), r2d2::Error> {
        let lease_ms = self.lease.as_millis().max(1);
        // Strictly below `statement_timeout`: a duplicate waiting for a held
        // key must be told IDEMPOTENCY_IN_PROGRESS, never a 503 (with equal
        // timeouts the statement's, started first, fires first).
        let lock_ms = PG_LOCK_WAIT.as_millis().min(lease_ms / 2).max(1);
        // READ COMMITTED whatever the database's default: under `repeatable
        // read` or `serializable` a race loser's `INSERT … ON CONFLICT`
        // fails with a serialization error instead of seeing the winner.
        // PostgreSQL 17+ also ends any transaction older than the lease
        // (`transaction_timeout`); before it, a dead host's transaction
        // lives at most one statement plus one idle moment: twice the lease.
        let version: i64 = diesel::select(diesel::dsl::sql::<diesel::sql_types::BigInt>(
            "current_setting('server_version_num')::bigint",
        ))
        .get_result(conn)
        .map_err(r2d2::Error::QueryError)?;
        let transaction_timeout = if version >= 170_000 {
            format!("SET transaction_timeout = {lease_ms};")
        } else {
            String::new()
        };
        conn.batch_execute(&format!(
            "SET TIME ZONE 'UTC';
             SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL READ COMMITTED;
             SET lock_timeout = {lock_ms};
             SET statement_timeout = {lease_ms};
             SET idle_in_transaction_session_timeout = {lease_ms};
             {transaction_timeout}"
        ))
        .map_err(r2d2::Error::QueryError)
    }
}
