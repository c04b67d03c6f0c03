//! SQLite's pool, and the protocol's [`Storage`] on it: pooled connections
//! for reads, and one group-committing writer that runs every unit of the
//! process, each in a savepoint of a shared transaction.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use diesel::prelude::*;
use diesel::r2d2::{self, ConnectionManager, PooledConnection};
use diesel::result::Error as DieselError;

use super::session::{SqliteManager, SqliteSession};
use super::writer::slot::WriterSlot;
use super::writer::{WriterHealth, WriterStats};
use crate::conn::{Conn, StorageError, Unavailable, WriteError, read_in_time};
use crate::entry::{self, Entry, NewEntry};
use crate::options::{ConnectError, PoolOptions, pool_builder};
use crate::protocol::Storage;

/// SQLite: pooled connections for reads, and one
/// [`Writer`](crate::db::writer::Writer) that commits every write of this process
/// in batches (started on the first write, so a command that only reads
/// never opens it).
#[derive(Clone)]
pub struct SqlitePool {
    pub(crate) readers: r2d2::Pool<SqliteManager>,
    pub(crate) writer: Arc<WriterSlot>,
    lease: Duration,
    /// The key of its [`Point::Read`](crate::fault::Point::Read).
    #[cfg(feature = "fault-points")]
    shown: Arc<str>,
}

impl SqlitePool {
    /// Opens one connection first, so that a bad path is reported in the
    /// driver's words, then builds the pool; the writer starts later.
    pub(crate) fn connect(url: &str, options: &PoolOptions) -> Result<Self, ConnectError> {
        let session = SqliteSession::for_lease(options.lease);
        let mut probe = SqliteConnection::establish(url)?;
        session.apply(&mut probe).map_err(ConnectError::Session)?;
        drop(probe);
        let readers = pool_builder(options)
            .connection_customizer(Box::new(session))
            .build(ConnectionManager::new(url))
            .map_err(|e| ConnectError::Pool(e.to_string()))?;
        let queue = options.write_queue.max(1);
        Ok(Self {
            readers,
            writer: Arc::new(WriterSlot::new(url, session, queue, options.lease)),
            lease: options.lease,
            #[cfg(feature = "fault-points")]
            shown: options.shown.as_str().into(),
        })
    }

    /// A reader, waiting at most the pool's connection timeout.
    pub(crate) fn get(&self) -> Result<PooledConnection<SqliteManager>, Unavailable> {
        let reader = self.readers.get().map_err(|e| Unavailable(e.to_string()))?;
        #[cfg(feature = "fault-points")]
        crate::fault::pass_blocking(crate::fault::Point::Read, &self.shown)
            .map_err(|e| Unavailable(e.to_string()))?;
        Ok(reader)
    }

    /// What the writer has done, once it has started.
    pub(crate) fn writer_stats(&self) -> Option<WriterStats> {
        self.writer.stats()
    }

    /// Whether the writer can write (a writer not started yet can).
    pub(crate) fn writer_health(&self) -> WriterHealth {
        self.writer.health()
    }

    /// Resolves with why, once the writer has given up.
    pub(crate) async fn writer_gave_up(&self) -> String {
        self.writer.gave_up().await
    }

    /// A unit, in the next batch of the writer.
    pub(crate) async fn write<F, T, E>(&self, work: F) -> Result<Result<T, E>, WriteError>
    where
        F: FnOnce(&mut Conn<'_>) -> Result<T, E> + Send + 'static,
        T: Send + 'static,
        E: Send + 'static,
    {
        self.writer.get()?.run(work).await
    }

    /// [`SqlitePool::write`] on a thread that may block.
    pub(crate) fn write_blocking<F, T, E>(&self, work: F) -> Result<Result<T, E>, WriteError>
    where
        F: FnOnce(&mut Conn<'_>) -> Result<T, E> + Send + 'static,
        T: Send + 'static,
        E: Send + 'static,
    {
        self.writer.get()?.run_blocking(work)
    }
}

impl Storage for SqlitePool {
    type Share = ();

    fn lease(&self) -> Duration {
        self.lease
    }

    fn find(
        &self,
        user: &str,
        key: &str,
    ) -> impl Future<Output = Result<Option<Entry>, StorageError>> + Send {
        let (pool, key, user) = (self.clone(), key.to_owned(), user.to_owned());
        let bound = self.readers.connection_timeout().saturating_mul(2);
        let read = tokio::task::spawn_blocking(move || {
            let mut c = pool
                .get()
                .map_err(|e| StorageError::Unavailable(e.to_string()))?;
            entry::find(&mut Conn::Sqlite(&mut c), &key, &user).map_err(StorageError::Database)
        });
        read_in_time(bound, read)
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

    /// Nothing to take: the writer runs one unit at a time, and `BEGIN
    /// IMMEDIATE` serialises it against other processes on the file.
    fn try_lock(_: &mut Conn<'_>, _: &str, _: &str, _: Duration) -> Result<bool, DieselError> {
        Ok(true)
    }

    fn record(conn: &mut Conn<'_>, entry: &NewEntry) -> Result<bool, DieselError> {
        entry::record(conn, entry)
    }

    /// Nothing to share out: writes go through the one writer.
    fn share(&self) -> impl Future<Output = Option<()>> + Send {
        std::future::ready(Some(()))
    }
}
