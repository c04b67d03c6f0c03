//! The connection pool of either backend: each its own [`Storage`], and
//! [`Pool`] the one a service holds, whichever its URL named.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use diesel::r2d2::PooledConnection;
use diesel::result::Error as DieselError;

use crate::Ledger;
use crate::conn::{Conn, Created, StorageError, Unavailable, WriteError};
use crate::entry::{self, Entry, NewEntry};
use crate::ledger::LedgerError;
use crate::options::{ConnectError, PoolOptions};
use crate::pg::pool::PgPool;
use crate::pg::session::PgManager;
use crate::pg::share::WriteConnection;
use crate::protocol::Storage;
use crate::row::Row;
use crate::sqlite::pool::SqlitePool;
use crate::sqlite::session::SqliteManager;
use crate::sqlite::writer::{WriterHealth, WriterStats};

/// Which database a pool talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// A file, one writer per process (group commit).
    Sqlite,
    /// A server, several processes on one database.
    Postgres,
}

/// The connection pool of either backend.
#[derive(Clone)]
pub enum Pool {
    /// Readers and the one writer.
    Sqlite(SqlitePool),
    /// One pool for reads and writes.
    Postgres(PgPool),
}

/// A connection checked out of [`Pool`].
pub enum PooledConn {
    /// A SQLite reader.
    Sqlite(PooledConnection<SqliteManager>),
    /// A PostgreSQL connection.
    Postgres(PooledConnection<PgManager>),
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
        Ok(match backend {
            Backend::Sqlite => Pool::Sqlite(SqlitePool::connect(url, options)?),
            Backend::Postgres => Pool::Postgres(PgPool::connect(url, options)?),
        })
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

    /// How long a checkout waits for a free connection at most
    /// ([`PoolOptions::connection_timeout`]).
    pub fn connection_timeout(&self) -> Duration {
        match self {
            Pool::Sqlite(p) => p.readers.connection_timeout(),
            Pool::Postgres(p) => p.connections.connection_timeout(),
        }
    }

    /// Checks out a connection for reading (on PostgreSQL also for writing
    /// outside [`Pool::write`], as one-shot commands do), waiting at most
    /// the pool's connection timeout. It blocks: call it off the async
    /// workers.
    pub fn get(&self) -> Result<PooledConn, Unavailable> {
        match self {
            Pool::Sqlite(p) => p.get().map(PooledConn::Sqlite),
            Pool::Postgres(p) => p.get().map(PooledConn::Postgres),
        }
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
        self.connection_timeout().saturating_mul(2)
    }

    /// What the SQLite writer has done (`None` on PostgreSQL, or before the
    /// first write).
    pub fn writer_stats(&self) -> Option<WriterStats> {
        match self {
            Pool::Sqlite(p) => p.writer_stats(),
            Pool::Postgres(_) => None,
        }
    }

    /// Whether the SQLite writer can write ([`WriterHealth::Ready`] on
    /// PostgreSQL, where each unit has a connection of its own, and before
    /// the first write).
    pub fn writer_health(&self) -> WriterHealth {
        match self {
            Pool::Sqlite(p) => p.writer_health(),
            Pool::Postgres(_) => WriterHealth::Ready,
        }
    }

    /// Resolves, with why, once the SQLite writer has given up: writing has
    /// been impossible for longer than the lease plus
    /// [`COMMIT_GRACE`](crate::db::COMMIT_GRACE), and the process cannot
    /// recover by itself — it should exit so that its supervisor restarts
    /// it. Never on PostgreSQL.
    pub async fn writer_gave_up(&self) -> String {
        match self {
            Pool::Sqlite(p) => p.writer_gave_up().await,
            Pool::Postgres(_) => std::future::pending().await,
        }
    }

    /// Runs `work` as one unit of writing, atomically: `Ok` persists (and is
    /// on stable storage when this returns), `Err` changes nothing. The
    /// caller holds no thread meanwhile:
    ///
    /// - SQLite: the unit joins the next batch of the
    ///   [`Writer`](crate::db::writer::Writer), inside its own savepoint of the
    ///   batch's transaction, and this resolves once that transaction has
    ///   committed (group commit);
    /// - PostgreSQL: a read-committed transaction on a pooled connection, on
    ///   a blocking thread; the server's own WAL flushing groups concurrent
    ///   commits.
    ///
    /// The outer `Err` says the unit's fate is that of a rolled-back one
    /// (the batch could not commit, or no connection was available) —
    /// except when no answer came within the lease plus
    /// [`COMMIT_GRACE`](crate::db::COMMIT_GRACE), on either backend: then
    /// the outcome is unknown (a `COMMIT` may still go through after the
    /// caller was answered; on PostgreSQL the blocking thread still runs the
    /// unit, whose transaction keeps its key's lock until it ends).
    pub async fn write<F, T, E>(&self, work: F) -> Result<Result<T, E>, WriteError>
    where
        F: FnOnce(&mut Conn<'_>) -> Result<T, E> + Send + 'static,
        T: Send + 'static,
        E: From<DieselError> + Send + 'static,
    {
        match self {
            Pool::Sqlite(p) => p.write(work).await,
            Pool::Postgres(p) => p.write(work).await,
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
            Pool::Sqlite(p) => p.write_blocking(work),
            Pool::Postgres(p) => p.write_blocking(work),
        }
    }
}

impl Storage for Pool {
    type Share = Option<WriteConnection>;

    fn lease(&self) -> Duration {
        match self {
            Pool::Sqlite(p) => p.lease(),
            Pool::Postgres(p) => p.lease(),
        }
    }

    async fn find(&self, user: &str, key: &str) -> Result<Option<Entry>, StorageError> {
        match self {
            Pool::Sqlite(p) => p.find(user, key).await,
            Pool::Postgres(p) => p.find(user, key).await,
        }
    }

    fn unit<F, T, E>(
        &self,
        work: F,
    ) -> impl Future<Output = Result<Result<T, E>, WriteError>> + Send
    where
        F: FnOnce(&mut Conn<'_>) -> Result<T, E> + Send + 'static,
        T: Send + 'static,
        E: From<DieselError> + Send + 'static,
    {
        self.write(work)
    }

    fn try_lock(
        conn: &mut Conn<'_>,
        user: &str,
        key: &str,
        lease: Duration,
    ) -> Result<bool, DieselError> {
        match conn {
            Conn::Sqlite(_) => SqlitePool::try_lock(conn, user, key, lease),
            Conn::Postgres(_) => PgPool::try_lock(conn, user, key, lease),
        }
    }

    fn record(conn: &mut Conn<'_>, entry: &NewEntry) -> Result<bool, DieselError> {
        match conn {
            Conn::Sqlite(_) => SqlitePool::record(conn, entry),
            Conn::Postgres(_) => PgPool::record(conn, entry),
        }
    }

    async fn share(&self) -> Option<Option<WriteConnection>> {
        match self {
            Pool::Sqlite(_) => Some(None),
            Pool::Postgres(p) => p.share().await.map(Some),
        }
    }

    async fn create<R: Row>(
        &self,
        row: Arc<R>,
        entry: impl FnOnce() -> NewEntry + Send,
    ) -> Result<Created, StorageError> {
        match self {
            Pool::Sqlite(p) => p.create(row, entry).await,
            Pool::Postgres(p) => p.create(row, entry).await,
        }
    }
}

impl Ledger<Pool> {
    /// Deletes expired entries in batches of `batch` rows, each batch its
    /// own short unit of writing so live requests interleave. Stops after
    /// `max_batches` batches (or when nothing expired is left); returns how
    /// many entries went. It blocks: call it off the async workers.
    pub fn purge_expired(
        pool: &Pool,
        batch: i64,
        max_batches: usize,
    ) -> Result<usize, LedgerError<std::convert::Infallible>> {
        let mut total: usize = 0;
        for _ in 0..max_batches {
            let now = Utc::now();
            let deleted = pool
                .write_blocking(move |conn| entry::purge_batch(conn, now, batch))?
                .map_err(LedgerError::database)?;
            total = total.saturating_add(deleted);
            if i64::try_from(deleted).unwrap_or(i64::MAX) < batch {
                break;
            }
        }
        Ok(total)
    }
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
