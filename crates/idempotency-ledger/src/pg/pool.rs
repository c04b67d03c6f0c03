//! PostgreSQL's pool, and the protocol's [`Storage`] on it: one pool for
//! reads and writes, whose sessions start with the lease's timeouts; a unit
//! is a read-committed transaction on a blocking thread, and a change that
//! is one row goes as one statement first.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use diesel::prelude::*;
use diesel::r2d2::{self, ConnectionManager, PooledConnection};
use diesel::result::Error as DieselError;

use super::lock;
use super::session::{PgManager, PgSession, checked_out, drop_if_lost};
use super::share::{WriteConnection, WriteConnections};
use super::wording::learn_wording;
use crate::conn::{
    Conn, Created, StorageError, Unavailable, WriteError, answered_in_time, read_in_time,
};
use crate::entry::{self, Entry, NewEntry};
use crate::options::{ConnectError, PoolOptions, pool_builder};
use crate::protocol::Storage;
use crate::row::Row;

/// PostgreSQL: one pool of connections for reads and writes.
#[derive(Clone)]
pub struct PgPool {
    pub(crate) connections: r2d2::Pool<PgManager>,
    /// How long a unit may take, with the commit grace, before its caller
    /// is answered.
    lease: Duration,
    /// How long a unit waits for its write connection.
    connection_timeout: Duration,
    share: WriteConnections,
    /// The key of its [`Point::Read`](crate::fault::Point::Read).
    #[cfg(feature = "fault-points")]
    shown: Arc<str>,
}

impl PgPool {
    /// Opens one connection first (a bad URL is reported in the driver's
    /// words), learns the server's wording, then builds the pool.
    pub(crate) fn connect(url: &str, options: &PoolOptions) -> Result<Self, ConnectError> {
        PgConnection::establish(url)?;
        learn_wording(url).map_err(ConnectError::Session)?;
        let session = PgSession {
            lease: options.lease,
        };
        let connections = pool_builder(options)
            .connection_customizer(Box::new(session))
            .build(PgManager(ConnectionManager::new(url)))
            .map_err(|e| ConnectError::Pool(e.to_string()))?;
        Ok(Self {
            share: WriteConnections::for_pool(connections.max_size()),
            connections,
            lease: options.lease,
            connection_timeout: options.connection_timeout,
            #[cfg(feature = "fault-points")]
            shown: options.shown.as_str().into(),
        })
    }

    /// A connection for reading (or a command's writing), this thread's
    /// lost-connection mark cleared, waiting at most the pool's connection
    /// timeout.
    pub(crate) fn get(&self) -> Result<PooledConnection<PgManager>, Unavailable> {
        let conn = checked_out(&self.connections).map_err(|e| Unavailable(e.to_string()))?;
        #[cfg(feature = "fault-points")]
        crate::fault::pass_blocking(crate::fault::Point::Read, &self.shown)
            .map_err(|e| Unavailable(e.to_string()))?;
        Ok(conn)
    }

    /// A unit, bounded by the lease plus the commit grace: past it the
    /// outcome is unknown (the blocking thread still runs the unit, whose
    /// transaction keeps its key's lock until it ends).
    pub(crate) async fn write<F, T, E>(&self, work: F) -> Result<Result<T, E>, WriteError>
    where
        F: FnOnce(&mut Conn<'_>) -> Result<T, E> + Send + 'static,
        T: Send + 'static,
        E: From<DieselError> + Send + 'static,
    {
        let pool = self.connections.clone();
        let unit = tokio::task::spawn_blocking(move || transaction(&pool, work));
        match answered_in_time(self.lease, unit).await {
            Ok(ran) => ran.map_err(|e| WriteError::Panicked(e.to_string()))?,
            Err(unknown) => Err(WriteError::Unavailable(unknown)),
        }
    }

    /// [`PgPool::write`] on a thread that may block.
    pub(crate) fn write_blocking<F, T, E>(&self, work: F) -> Result<Result<T, E>, WriteError>
    where
        F: FnOnce(&mut Conn<'_>) -> Result<T, E>,
        E: From<DieselError>,
    {
        transaction(&self.connections, work)
    }
}

/// A unit: a transaction on a pooled connection. A failure of the
/// transaction itself (`BEGIN`, `COMMIT`) drops a connection that lost its
/// server, here, on the thread that holds it.
fn transaction<F, T, E>(pool: &r2d2::Pool<PgManager>, work: F) -> Result<Result<T, E>, WriteError>
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
            TxError::Transaction(e)
        }
    }
    let mut conn = checked_out(pool)
        .map_err(|e| WriteError::Unavailable(format!("no database connection available: {e}")))?;
    let result = conn
        .transaction::<T, TxError<E>, _>(|c| work(&mut Conn::Postgres(c)).map_err(TxError::Work));
    Ok(result.map_err(|e| match e {
        TxError::Work(e) => e,
        TxError::Transaction(e) => {
            drop_if_lost(&e);
            E::from(e)
        }
    }))
}

/// The unit's connection, which on this storage is PostgreSQL's.
fn pg<'c>(conn: &'c mut Conn<'_>) -> Result<&'c mut PgConnection, DieselError> {
    match conn {
        Conn::Postgres(c) => Ok(c),
        Conn::Sqlite(_) => Err(DieselError::QueryBuilderError(
            "a PostgreSQL unit was given a SQLite connection".into(),
        )),
    }
}

impl Storage for PgPool {
    type Share = WriteConnection;

    fn lease(&self) -> Duration {
        self.lease
    }

    fn find(
        &self,
        user: &str,
        key: &str,
    ) -> impl Future<Output = Result<Option<Entry>, StorageError>> + Send {
        let (pool, key, user) = (self.clone(), key.to_owned(), user.to_owned());
        let bound = self.connection_timeout.saturating_mul(2);
        let read = tokio::task::spawn_blocking(move || {
            let mut c = pool
                .get()
                .map_err(|e| StorageError::Unavailable(e.to_string()))?;
            let found = entry::find(&mut Conn::Postgres(&mut c), &key, &user);
            found
                .inspect_err(drop_if_lost)
                .map_err(StorageError::Database)
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

    fn try_lock(
        conn: &mut Conn<'_>,
        user: &str,
        key: &str,
        lease: Duration,
    ) -> Result<bool, DieselError> {
        lock::try_lock(pg(conn)?, key, user, lease).inspect_err(drop_if_lost)
    }

    fn record(conn: &mut Conn<'_>, entry: &NewEntry) -> Result<bool, DieselError> {
        entry::record(conn, entry).inspect_err(drop_if_lost)
    }

    fn share(&self) -> impl Future<Output = Option<WriteConnection>> + Send {
        self.share.acquire(self.connection_timeout)
    }

    fn create<R: Row>(
        &self,
        row: Arc<R>,
        entry: impl FnOnce() -> NewEntry + Send,
    ) -> impl Future<Output = Result<Created, StorageError>> + Send {
        super::create::create(&self.connections, self.lease, row, entry())
    }
}
