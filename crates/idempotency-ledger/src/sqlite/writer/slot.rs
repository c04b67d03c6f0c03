//! The one writer of a SQLite pool, started on the first write, so that a
//! command that only reads never opens it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use diesel::{Connection, SqliteConnection};
use tokio::sync::watch;

use super::handle::{Launch, Writer};
use super::shared::{WriterHealth, WriterStats, locked};
use crate::conn::WriteError;
use crate::sqlite::session::SqliteSession;

/// The one [`Writer`] of a SQLite pool, started on the first write (so a
/// command that only reads never opens it).
pub(crate) struct WriterSlot {
    path: String,
    session: SqliteSession,
    capacity: usize,
    lease: Duration,
    writer: Mutex<Option<Arc<Writer>>>,
    /// Says why once the writer has given up; there before the writer is.
    gave_up: watch::Sender<Option<String>>,
}

impl WriterSlot {
    pub(crate) fn new(
        path: &str,
        session: SqliteSession,
        capacity: usize,
        lease: Duration,
    ) -> Self {
        Self {
            path: path.to_owned(),
            session,
            capacity,
            lease,
            writer: Mutex::new(None),
            gave_up: watch::Sender::new(None),
        }
    }

    fn started(&self) -> Option<Arc<Writer>> {
        locked(&self.writer).clone()
    }

    /// What the writer has done, once it has started.
    pub(crate) fn stats(&self) -> Option<WriterStats> {
        self.started().map(|w| w.stats())
    }

    /// Whether the writer can write (a writer not started yet can).
    pub(crate) fn health(&self) -> WriterHealth {
        self.started().map_or(WriterHealth::Ready, |w| w.health())
    }

    /// Resolves with why, once the writer has given up.
    pub(crate) async fn gave_up(&self) -> String {
        let mut gave_up = self.gave_up.subscribe();
        match gave_up.wait_for(Option::is_some).await {
            Ok(why) => why.clone().unwrap_or_default(),
            // The sender lives as long as this slot.
            Err(_) => std::future::pending().await,
        }
    }

    pub(crate) fn get(&self) -> Result<Arc<Writer>, WriteError> {
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
        // How a replacement thread opens its connection, too.
        let open = move || -> Result<SqliteConnection, String> {
            let mut conn = SqliteConnection::establish(&path).map_err(|e| e.to_string())?;
            session.apply(&mut conn).map_err(|e| e.to_string())?;
            Ok(conn)
        };
        let conn = open().map_err(unavailable)?;
        let writer = Arc::new(
            Writer::launch(Launch {
                conn,
                open: Box::new(open),
                capacity: self.capacity,
                lease: self.lease,
                file: self.path.clone(),
                gave_up: self.gave_up.clone(),
            })
            .map_err(|e| unavailable(e.to_string()))?,
        );
        *slot = Some(Arc::clone(&writer));
        Ok(writer)
    }
}
