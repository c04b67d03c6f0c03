//! Storage plumbing shared by every part of the service: which backend, the
//! connection pool, migrations, and the one place that knows how a writing
//! transaction is opened on each backend.
//!
//! Query code is written once and compiled for both backends by
//! [`dispatch!`]. A lookup by a unique key uses `get_result`, never
//! `first`: `first` binds `LIMIT ?`, and the bundled SQLite (built with
//! `SQLITE_ENABLE_STAT4`) expires a cached statement whose plan read a bound
//! integer each time that parameter is bound again, so every run of it would
//! be compiled anew (40 % of a `GET` in a profile). a statement that only one backend understands lives in a
//! small named function beside its siblings (see `idempotency::store`).

mod failure;
pub mod schema;
pub mod writer;

pub use failure::{Failure, classify};

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::r2d2::{self, ConnectionManager, CustomizeConnection, PooledConnection};
use diesel::result::Error as DieselError;
use diesel_migrations::{EmbeddedMigrations, MigrationHarness, embed_migrations};

use writer::Writer;
pub use writer::{WriteError, WriterStats};

const SQLITE_MIGRATIONS: EmbeddedMigrations = embed_migrations!("migrations/sqlite");
const PG_MIGRATIONS: EmbeddedMigrations = embed_migrations!("migrations/postgres");

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

/// Which database a `DATABASE_URL` selects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// A parsed `DATABASE_URL`: `sqlite://path`, `sqlite:path`, a bare file path,
/// or `postgres://…` / `postgresql://…`.
#[derive(Clone, PartialEq, Eq)]
pub struct DatabaseUrl {
    backend: Backend,
    /// What the driver is given: a file path for SQLite, the URL for PostgreSQL.
    target: String,
}

impl DatabaseUrl {
    pub fn parse(raw: &str) -> Result<Self, String> {
        let raw = raw.trim();
        if raw.is_empty() {
            return Err("DATABASE_URL is empty".into());
        }
        if raw.starts_with("postgres://") || raw.starts_with("postgresql://") {
            return Ok(Self {
                backend: Backend::Postgres,
                target: without_gss_unless_asked(raw),
            });
        }
        let path = if let Some(rest) = raw.strip_prefix("sqlite://") {
            rest
        } else if let Some(rest) = raw.strip_prefix("sqlite:") {
            rest
        } else if let Some((scheme, _)) = raw.split_once("://") {
            return Err(format!(
                "unsupported DATABASE_URL scheme '{scheme}': use sqlite://PATH or postgres://…"
            ));
        } else {
            raw
        };
        if path.is_empty() {
            return Err("DATABASE_URL names no SQLite file".into());
        }
        if path == ":memory:" {
            return Err(
                "an in-memory SQLite database cannot be shared by a connection pool: name a file"
                    .into(),
            );
        }
        Ok(Self {
            backend: Backend::Sqlite,
            target: path.to_owned(),
        })
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The URL as the drivers take it.
    pub fn as_str(&self) -> &str {
        &self.target
    }
}

impl fmt::Debug for DatabaseUrl {
    /// Never prints a password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DatabaseUrl")
            .field("backend", &self.backend)
            .field("target", &redact(&self.target))
            .finish()
    }
}

/// libpq tries GSSAPI (Kerberos) encryption first when it was built with
/// it, which costs a negotiation on every new connection and, worse, can
/// abort the process at exit (libkrb5 destroys its mutexes while a pool
/// thread is still connecting). Unless the URL asks for it, turn it off.
fn without_gss_unless_asked(url: &str) -> String {
    if url.contains("gssencmode=") {
        url.to_owned()
    } else if url.contains('?') {
        format!("{url}&gssencmode=disable")
    } else {
        format!("{url}?gssencmode=disable")
    }
}

fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            match url[scheme_end + 3..at].split_once(':') {
                Some((user, _password)) => {
                    format!("{}{user}:***{}", &url[..scheme_end + 3], &url[at..])
                }
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}

/// A driver's message on one line (libpq adds hints on following lines).
fn one_line(message: &str) -> String {
    message.split_whitespace().collect::<Vec<_>>().join(" ")
}

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
type PgManager = ConnectionManager<PgConnection>;

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
        let mut conn =
            SqliteConnection::establish(&self.path).map_err(|e| unavailable(e.to_string()))?;
        self.session
            .apply(&mut conn)
            .map_err(|e| unavailable(e.to_string()))?;
        let writer =
            Arc::new(Writer::start(conn, self.capacity).map_err(|e| unavailable(e.to_string()))?);
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
    #[error("cannot apply migrations: {0}")]
    Migrate(String),
    #[error("cannot build the connection pool: {0}")]
    Pool(String),
}

/// Why a connection could not be checked out at request time.
#[derive(Debug, thiserror::Error)]
#[error("no database connection available: {0}")]
pub struct Unavailable(String);

impl Pool {
    /// Opens one connection first so that a bad URL or an unreachable server
    /// is reported with the driver's own words, then builds the pool.
    pub fn connect(url: &DatabaseUrl, options: &PoolOptions) -> Result<Self, SetupError> {
        let connect_error = |e: diesel::ConnectionError| SetupError::Connect {
            target: redact(url.as_str()),
            cause: one_line(&e.to_string()),
        };
        match url.backend() {
            Backend::Sqlite => {
                let mut probe = SqliteConnection::establish(url.as_str()).map_err(connect_error)?;
                let session = SqliteSession::for_lease(options.lease);
                session.apply(&mut probe).map_err(|e| SetupError::Connect {
                    target: url.as_str().to_owned(),
                    cause: e.to_string(),
                })?;
                drop(probe);
                let readers = pool_builder(options)
                    .connection_customizer(Box::new(session))
                    .build(ConnectionManager::new(url.as_str()))
                    .map_err(|e| SetupError::Pool(e.to_string()))?;
                Ok(Pool::Sqlite(SqlitePool {
                    readers,
                    writer: Arc::new(WriterSlot {
                        path: url.as_str().to_owned(),
                        session,
                        capacity: options.write_queue.max(1),
                        writer: Mutex::new(None),
                    }),
                }))
            }
            Backend::Postgres => {
                PgConnection::establish(url.as_str()).map_err(connect_error)?;
                failure::learn_wording(url.as_str()).map_err(|e| SetupError::Connect {
                    target: redact(url.as_str()),
                    cause: one_line(&e.to_string()),
                })?;
                pool_builder(options)
                    .connection_customizer(Box::new(PgSession {
                        lease: options.lease,
                    }))
                    .build(ConnectionManager::new(url.as_str()))
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
            Pool::Postgres(p) => p.get().map(PooledConn::Postgres),
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
                let mut conn = p
                    .get()
                    .map_err(|e| WriteError::Unavailable(e.to_string()))?;
                Ok(conn.transaction(|c| work(&mut Conn::Postgres(c))))
            }
        }
    }
}

fn pool_builder<C>(options: &PoolOptions) -> r2d2::Builder<ConnectionManager<C>>
where
    C: diesel::r2d2::R2D2Connection + 'static,
{
    r2d2::Pool::builder()
        .max_size(options.max_size)
        .min_idle(Some(1))
        .connection_timeout(options.connection_timeout)
        // A dead connection marks itself broken on its first failed query
        // (diesel reads libpq's status), so a `SELECT 1` on every checkout
        // would be a wasted round trip.
        .test_on_check_out(false)
}

impl PooledConn {
    pub fn conn(&mut self) -> Conn<'_> {
        match self {
            PooledConn::Sqlite(c) => Conn::Sqlite(c),
            PooledConn::Postgres(c) => Conn::Postgres(c),
        }
    }
}

/// Applies pending migrations with a dedicated connection (not pooled, so no
/// session timeouts apply). On PostgreSQL an advisory lock keeps several
/// processes that start together from migrating at once.
pub fn run_migrations(url: &DatabaseUrl) -> Result<usize, SetupError> {
    let connect_error = |e: diesel::ConnectionError| SetupError::Connect {
        target: redact(url.as_str()),
        cause: one_line(&e.to_string()),
    };
    let migrate_error =
        |e: Box<dyn std::error::Error + Send + Sync>| SetupError::Migrate(e.to_string());
    match url.backend() {
        Backend::Sqlite => {
            let mut conn = SqliteConnection::establish(url.as_str()).map_err(connect_error)?;
            SqliteSession {
                busy_timeout: SQLITE_BUSY_TIMEOUT,
            }
            .apply(&mut conn)
            .map_err(|e| SetupError::Migrate(e.to_string()))?;
            conn.run_pending_migrations(SQLITE_MIGRATIONS)
                .map(|v| v.len())
                .map_err(migrate_error)
        }
        Backend::Postgres => {
            let mut conn = PgConnection::establish(url.as_str()).map_err(connect_error)?;
            conn.batch_execute(&format!("SELECT pg_advisory_lock({PG_MIGRATION_LOCK})"))
                .map_err(|e| SetupError::Migrate(e.to_string()))?;
            let applied = conn
                .run_pending_migrations(PG_MIGRATIONS)
                .map(|v| v.len())
                .map_err(migrate_error);
            // Closing the session releases the lock even if this fails.
            let _ = conn.batch_execute(&format!("SELECT pg_advisory_unlock({PG_MIGRATION_LOCK})"));
            applied
        }
    }
}

/// Whether every migration this binary knows of has been applied.
pub fn migrations_applied(conn: &mut Conn<'_>) -> Result<bool, DieselError> {
    let pending = match conn {
        Conn::Sqlite(c) => MigrationHarness::has_pending_migration(*c, SQLITE_MIGRATIONS),
        Conn::Postgres(c) => MigrationHarness::has_pending_migration(*c, PG_MIGRATIONS),
    };
    // Keep the driver's own error when there is one: a connection lost in
    // an outage must classify as unavailable (503), not as a defect (500).
    pending.map(|pending| !pending).map_err(|e| {
        e.downcast::<DieselError>()
            .map(|e| *e)
            .unwrap_or_else(|e| DieselError::QueryBuilderError(e.to_string().into()))
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scheme_selects_the_backend() {
        for (raw, backend, target) in [
            ("sqlite://orders.db", Backend::Sqlite, "orders.db"),
            (
                "sqlite:///var/lib/orders.db",
                Backend::Sqlite,
                "/var/lib/orders.db",
            ),
            ("sqlite:orders.db", Backend::Sqlite, "orders.db"),
            ("orders.db", Backend::Sqlite, "orders.db"),
            (
                "postgres://u@h/db",
                Backend::Postgres,
                "postgres://u@h/db?gssencmode=disable",
            ),
            (
                "postgresql://u@h/db?sslmode=require",
                Backend::Postgres,
                "postgresql://u@h/db?sslmode=require&gssencmode=disable",
            ),
            (
                "postgres://u@h/db?gssencmode=prefer",
                Backend::Postgres,
                "postgres://u@h/db?gssencmode=prefer",
            ),
        ] {
            let url = DatabaseUrl::parse(raw).unwrap();
            assert_eq!((url.backend(), url.as_str()), (backend, target), "{raw}");
        }
    }

    #[test]
    fn unusable_urls_are_refused_with_a_reason() {
        for raw in ["", "mysql://h/db", "sqlite://", "sqlite::memory:"] {
            assert!(DatabaseUrl::parse(raw).is_err(), "{raw}");
        }
    }

    #[test]
    fn a_password_never_appears_in_debug_output() {
        let url = DatabaseUrl::parse("postgres://orders:s3cret@db/orders").unwrap();
        let shown = format!("{url:?}");
        assert!(
            !shown.contains("s3cret") && shown.contains("orders:***@db"),
            "{shown}"
        );
    }
}
