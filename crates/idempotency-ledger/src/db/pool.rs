//! The connection pool of either backend, its connections, and the unit of
//! writing ([`Pool::write`]).

use std::sync::Arc;
use std::time::Duration;

use diesel::prelude::*;
use diesel::r2d2::{self, ConnectionManager, PooledConnection};
use diesel::result::Error as DieselError;

use super::failure;
use super::pg::{PgManager, PgSession, checked_out};
use super::sqlite::{SqliteManager, SqliteSession};
use super::writer::{WriteError, WriterHealth, WriterSlot, WriterStats, write_bound};

/// Which database a pool talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// A file, one writer per process (group commit).
    Sqlite,
    /// A server, several processes on one database.
    Postgres,
}

/// Pool and session settings.
#[derive(Debug, Clone)]
pub struct PoolOptions {
    /// The most connections the pool opens (readers, on SQLite).
    pub max_size: u32,
    /// How long a request waits for a free connection (or a reconnect during
    /// an outage) before it is answered unavailable.
    pub connection_timeout: Duration,
    /// The idempotency lease: on PostgreSQL no statement and no idle moment
    /// inside a transaction may outlast it; on SQLite no batch may.
    pub lease: Duration,
    /// SQLite: how many units may wait for the writer before a write is
    /// refused as overloaded.
    pub write_queue: usize,
    /// How the database is named in log lines (never with a password).
    pub shown: String,
}

/// The connection pool of either backend.
#[derive(Clone)]
pub enum Pool {
    /// Readers and the one writer.
    Sqlite(SqlitePool),
    /// One pool for reads and writes.
    Postgres(PgPool),
}

/// SQLite: pooled connections for reads, and one
/// [`Writer`](super::writer::Writer) that commits every write of this
/// process in batches (started on the first write, so a command that only
/// reads never opens it).
#[derive(Clone)]
pub struct SqlitePool {
    readers: r2d2::Pool<SqliteManager>,
    writer: Arc<WriterSlot>,
    /// The key of its [`Point::Read`](crate::fault::Point::Read).
    #[cfg(feature = "fault-points")]
    shown: Arc<str>,
}

/// PostgreSQL: one pool of connections for reads and writes, whose
/// sessions start with the lease's timeouts.
#[derive(Clone)]
pub struct PgPool {
    connections: r2d2::Pool<PgManager>,
    /// How long a unit may take, with [`COMMIT_GRACE`](super::writer::COMMIT_GRACE),
    /// before its caller is answered.
    lease: Duration,
    /// The key of its [`Point::Read`](crate::fault::Point::Read).
    #[cfg(feature = "fault-points")]
    shown: Arc<str>,
}

/// A connection checked out of [`Pool`].
pub enum PooledConn {
    /// A SQLite reader.
    Sqlite(PooledConnection<SqliteManager>),
    /// A PostgreSQL connection.
    Postgres(PooledConnection<PgManager>),
}

/// A borrowed connection of either backend: what every storage function
/// takes, so that the same function runs inside or outside a transaction.
pub enum Conn<'a> {
    /// SQLite.
    Sqlite(&'a mut SqliteConnection),
    /// PostgreSQL.
    Postgres(&'a mut PgConnection),
}

/// Why a connection could not be checked out at request time.
#[derive(Debug, thiserror::Error)]
#[error("no database connection available: {0}")]
pub struct Unavailable(String);

/// Why a pool could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The first connection could not be opened (the driver's words).
    #[error("{0}")]
    Open(#[from] diesel::ConnectionError),
    /// It opened, but its session could not be set up.
    #[error("{0}")]
    Session(DieselError),
    /// The pool itself could not be built.
    #[error("cannot build the connection pool: {0}")]
    Pool(String),
}

impl Pool {
    /// Opens one connection first, so that a bad URL or an unreachable
    /// server is reported with the driver's own words, then builds the pool.
    /// `url` is what the driver takes: a file path for SQLite, a URL for
    /// PostgreSQL.
    pub fn connect(
        backend: Backend,
        url: &str,
        options: &PoolOptions,
    ) -> Result<Self, ConnectError> {
        match backend {
            Backend::Sqlite => {
                let session = SqliteSession::for_lease(options.lease);
                let mut probe = SqliteConnection::establish(url)?;
                session.apply(&mut probe).map_err(ConnectError::Session)?;
                drop(probe);
                let readers = pool_builder(options)
                    .connection_customizer(Box::new(session))
                    .build(ConnectionManager::new(url))
                    .map_err(|e| ConnectError::Pool(e.to_string()))?;
                Ok(Pool::Sqlite(SqlitePool {
                    readers,
                    writer: Arc::new(WriterSlot::new(
                        url,
                        session,
                        options.write_queue.max(1),
                        options.lease,
                    )),
                    #[cfg(feature = "fault-points")]
                    shown: options.shown.as_str().into(),
                }))
            }
            Backend::Postgres => {
                PgConnection::establish(url)?;
                failure::learn_wording(url).map_err(ConnectError::Session)?;
                let connections = pool_builder(options)
                    .connection_customizer(Box::new(PgSession {
                        lease: options.lease,
                    }))
                    .build(PgManager(ConnectionManager::new(url)))
                    .map_err(|e| ConnectError::Pool(e.to_string()))?;
                Ok(Pool::Postgres(PgPool {
                    connections,
                    lease: options.lease,
                    #[cfg(feature = "fault-points")]
                    shown: options.shown.as_str().into(),
                }))
            }
        }
    }

    /// Which backend the pool talks to.
    pub fn backend(&self) -> Backend {
        match self {
            Pool::Sqlite(_) => Backend::Sqlite,
            Pool::Postgres(_) => Backend::Postgres,
        }
    }

    /// The most connections the pool holds.
    pub fn max_size(&self) -> u32 {
        match self {
            Pool::Sqlite(p) => p.readers.max_size(),
            Pool::Postgres(p) => p.connections.max_size(),
        }
    }

    /// Checks out a connection for reading (on PostgreSQL also for writing
    /// outside [`Pool::write`], as one-shot commands do), waiting at most
    /// the pool's connection timeout. It blocks: call it off the async
    /// workers.
    pub fn get(&self) -> Result<PooledConn, Unavailable> {
        let pooled = match self {
            Pool::Sqlite(p) => p.readers.get().map(PooledConn::Sqlite),
            Pool::Postgres(p) => checked_out(&p.connections).map(PooledConn::Postgres),
        }
        .map_err(|e| Unavailable(e.to_string()))?;
        #[cfg(feature = "fault-points")]
        {
            let shown = match self {
                Pool::Sqlite(p) => &p.shown,
                Pool::Postgres(p) => &p.shown,
            };
            crate::fault::pass_blocking(crate::fault::Point::Read, shown)
                .map_err(|e| Unavailable(e.to_string()))?;
        }
        Ok(pooled)
    }

    /// How long a read waits for its answer, its wait for a connection
    /// included: twice the pool's connection timeout (a wait for a
    /// connection, then as long for the statements). Past it the read is
    /// answered unavailable while its blocking thread, which a frozen file
    /// system or a server that stopped answering may hold for good, keeps
    /// its connection until the read returns: a pool whose every connection
    /// is stuck answers every read unavailable within this bound, and
    /// serves again as soon as they come back.
    pub fn read_bound(&self) -> Duration {
        let timeout = match self {
            Pool::Sqlite(p) => p.readers.connection_timeout(),
            Pool::Postgres(p) => p.connections.connection_timeout(),
        };
        timeout.saturating_mul(2)
    }

    /// What the SQLite writer has done (`None` on PostgreSQL, or before the
    /// first write).
    pub fn writer_stats(&self) -> Option<WriterStats> {
        match self {
            Pool::Sqlite(p) => p.writer.stats(),
            Pool::Postgres(_) => None,
        }
    }

    /// Whether the SQLite writer can write ([`WriterHealth::Ready`] on
    /// PostgreSQL, where each unit has a connection of its own, and before
    /// the first write).
    pub fn writer_health(&self) -> WriterHealth {
        match self {
            Pool::Sqlite(p) => p.writer.health(),
            Pool::Postgres(_) => WriterHealth::Ready,
        }
    }

    /// Resolves, with why, once the SQLite writer has given up: writing has
    /// been impossible for longer than the lease plus
    /// [`COMMIT_GRACE`](super::writer::COMMIT_GRACE), and the process cannot
    /// recover by itself — it should exit so that its supervisor restarts
    /// it. Never on PostgreSQL.
    pub async fn writer_gave_up(&self) -> String {
        match self {
            Pool::Sqlite(p) => p.writer.gave_up().await,
            Pool::Postgres(_) => std::future::pending().await,
        }
    }

    /// Runs `work` as one unit of writing, atomically: `Ok` persists (and is
    /// on stable storage when this returns), `Err` changes nothing. The
    /// caller holds no thread meanwhile:
    ///
    /// - SQLite: the unit joins the next batch of the
    ///   [`Writer`](super::writer::Writer), inside its own savepoint of the
    ///   batch's transaction, and this resolves once that transaction has
    ///   committed (group commit);
    /// - PostgreSQL: a read-committed transaction on a pooled connection, on
    ///   a blocking thread; the server's own WAL flushing groups concurrent
    ///   commits.
    ///
    /// The outer `Err` says the unit's fate is that of a rolled-back one
    /// (the batch could not commit, or no connection was available) —
    /// except when no answer came within the lease plus
    /// [`COMMIT_GRACE`](super::writer::COMMIT_GRACE), on either backend:
    /// then the outcome is unknown (a `COMMIT` may still go through after
    /// the caller was answered; on PostgreSQL the blocking thread still runs
    /// the unit, whose transaction keeps its key's lock until it ends).
    pub async fn write<F, T, E>(&self, work: F) -> Result<Result<T, E>, WriteError>
    where
        F: FnOnce(&mut Conn<'_>) -> Result<T, E> + Send + 'static,
        T: Send + 'static,
        E: From<DieselError> + Send + 'static,
    {
        match self {
            Pool::Sqlite(p) => p.writer.get()?.run(work).await,
            Pool::Postgres(p) => {
                let pool = p.connections.clone();
                let unit = tokio::task::spawn_blocking(move || pg_transaction(&pool, work));
                match tokio::time::timeout(write_bound(p.lease), unit).await {
                    Ok(ran) => ran.map_err(|e| WriteError::Panicked(e.to_string()))?,
                    Err(_) => Err(WriteError::Unavailable(format!(
                        "no answer within the lease plus {} s: the outcome is unknown",
                        super::writer::COMMIT_GRACE.as_secs()
                    ))),
                }
            }
        }
    }

    /// [`Pool::write`] for a caller on a thread that may block (a command,
    /// or work already on a blocking thread); never on an async worker.
    pub fn write_blocking<F, T, E>(&self, work: F) -> Result<Result<T, E>, WriteError>
    where
        F: FnOnce(&mut Conn<'_>) -> Result<T, E> + Send + 'static,
        T: Send + 'static,
        E: From<DieselError> + Send + 'static,
    {
        match self {
            Pool::Sqlite(p) => p.writer.get()?.run_blocking(work),
            Pool::Postgres(p) => pg_transaction(&p.connections, work),
        }
    }
}

/// A PostgreSQL unit: a transaction on a pooled connection. A failure of
/// the transaction itself (`BEGIN`, `COMMIT`) is classified here, on the
/// thread that holds the connection, so that a lost connection is dropped
/// rather than pooled again (see `pg.rs`).
fn pg_transaction<F, T, E>(
    pool: &r2d2::Pool<PgManager>,
    work: F,
) -> Result<Result<T, E>, WriteError>
where
    F: FnOnce(&mut Conn<'_>) -> Result<T, E>,
    E: From<DieselError>,
{
    enum TxError<E> {
        Work(E),
        Transaction(DieselError),
    }
    impl<E> From<DieselError> for TxError<E> {
        fn from(e: DieselError) -> Self {
            failure::classify(&e);
            TxError::Transaction(e)
        }
    }
    let mut conn = checked_out(pool).map_err(|e| WriteError::Unavailable(e.to_string()))?;
    let result = conn
        .transaction::<T, TxError<E>, _>(|c| work(&mut Conn::Postgres(c)).map_err(TxError::Work));
    Ok(result.map_err(|e| match e {
        TxError::Work(e) => e,
        TxError::Transaction(e) => E::from(e),
    }))
}

fn pool_builder<M>(options: &PoolOptions) -> r2d2::Builder<M>
where
    M: r2d2::ManageConnection,
    M::Error: std::fmt::Display,
{
    r2d2::Pool::builder()
        .error_handler(Box::new(LogConnectError {
            database: options.shown.clone(),
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
/// event on one line: which database, and the driver's words folded.
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

/// A driver's message as one line. libpq writes a hint, a wrapped sentence
/// or the next host's error on lines of their own (tab-indented); they are
/// joined so that each sentence still reads as one: `… Connection refused.
/// Is the server running on that host …?`.
pub fn one_line(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    for line in message.lines() {
        let line = line.split_whitespace().collect::<Vec<_>>().join(" ");
        if line.is_empty() {
            continue;
        }
        if !out.is_empty() {
            let continues = line.starts_with(|c: char| c.is_lowercase());
            let ended = out.ends_with(['.', '?', '!', ':', ';']);
            out.push_str(if ended || continues { " " } else { ". " });
        }
        out.push_str(&line);
    }
    out
}

impl PooledConn {
    /// The connection, as storage functions take it.
    pub fn conn(&mut self) -> Conn<'_> {
        match self {
            PooledConn::Sqlite(c) => Conn::Sqlite(c),
            PooledConn::Postgres(c) => Conn::Postgres(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::one_line;

    #[test]
    fn a_drivers_message_on_several_lines_reads_as_one_line_of_sentences() {
        // libpq: the error, then its hint on a tab-indented line of its own.
        let libpq = "connection to server at \"127.0.0.1\", port 5999 failed: Connection refused\n\
                     \tIs the server running on that host and accepting TCP/IP connections?\n";
        assert_eq!(
            one_line(libpq),
            "connection to server at \"127.0.0.1\", port 5999 failed: Connection refused. \
             Is the server running on that host and accepting TCP/IP connections?"
        );
        // A sentence wrapped onto the next line goes on after a space, as
        // does one after a line that ended its own sentence; blank lines
        // and runs of spaces are dropped.
        assert_eq!(
            one_line(
                "could not translate host name \"db\" to\n  address: Name or service not known\n\n"
            ),
            "could not translate host name \"db\" to address: Name or service not known"
        );
        assert_eq!(
            one_line("FATAL:  too many connections.\nRetry later."),
            "FATAL: too many connections. Retry later."
        );
        assert_eq!(one_line("one line already"), "one line already");
        assert_eq!(one_line(""), "");
    }
}
