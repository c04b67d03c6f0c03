//! What the writer threads, the watchdog and the handle share, and what
//! the writer tells of itself.

use std::sync::atomic::{AtomicBool, AtomicIsize, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use diesel::SqliteConnection;
use tokio::sync::watch;

use super::fence::Fence;
use super::queue::Job;
use crate::conn::WriteError;

/// Whether the writer can write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriterHealth {
    /// It can (as far as it knows).
    Ready,
    /// It cannot for now, and says why; writes are answered
    /// [`WriteError::Unavailable`] at once.
    Stalled(String),
    /// It has not been able to for longer than the lease plus the commit
    /// grace ([`write_bound`](crate::db::write_bound)), and says
    /// why: the process cannot recover by itself, and should exit so that
    /// its supervisor restarts it.
    Unrecoverable(String),
}

/// What the writer has done so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriterStats {
    /// Units waiting in the queue now.
    pub queued: usize,
    /// Transactions committed.
    pub batches: u64,
    /// Units those transactions carried (kept or rolled back to their savepoint).
    pub units: u64,
    /// Writer threads started to replace one that was abandoned or died.
    pub replaced: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) queued: AtomicUsize,
    pub(crate) batches: AtomicU64,
    pub(crate) units: AtomicU64,
    /// Writer threads started after the first (abandoned or dead ones replaced).
    pub(crate) replaced: AtomicU64,
}

/// The batch a writer thread is running, as the watchdog sees it.
pub(crate) struct Watch {
    pub(crate) generation: u64,
    pub(crate) started: Instant,
    pub(crate) fence: Arc<Fence>,
    pub(crate) callers: Vec<Box<dyn FnOnce(WriteError) + Send>>,
}

/// The connection of the thread that may take jobs.
pub(crate) enum WriterConnection {
    Open,
    /// A replacement is opening its connection since then; the last
    /// attempt's failure, if one failed.
    Opening {
        since: Instant,
        failed: Option<String>,
    },
}

/// What the writer threads, the watchdog and the handle share.
pub(crate) struct Shared {
    pub(crate) jobs: Mutex<Receiver<Box<dyn Job>>>,
    pub(crate) counters: Counters,
    /// Opens (and sets up) a fresh writer connection.
    pub(crate) open: Box<dyn Fn() -> Result<SqliteConnection, String> + Send + Sync>,
    pub(crate) lease: Duration,
    /// The database file, as the pool was given it (fault points' key).
    #[cfg_attr(not(feature = "fault-points"), allow(dead_code))]
    pub(crate) file: String,
    /// The generation of the thread that may take jobs; others end.
    pub(crate) generation: AtomicU64,
    pub(crate) current: Mutex<Option<Watch>>,
    pub(crate) thread: Mutex<Option<JoinHandle<()>>>,
    pub(crate) stopping: AtomicBool,
    pub(crate) connection: Mutex<WriterConnection>,
    /// Threads given up on that have not returned: each may still hold
    /// SQLite's write lock. (Signed: a thread may return before the
    /// watchdog has counted it.)
    pub(crate) hung: AtomicIsize,
    /// Why the writer gave up, once it has.
    pub(crate) gave_up: watch::Sender<Option<String>>,
}

impl Shared {
    /// Why the writer cannot write now, if it cannot.
    pub(crate) fn cannot_write(&self) -> Option<String> {
        if let Some(why) = self.gave_up.borrow().as_ref() {
            return Some(why.clone());
        }
        if self.hung.load(Ordering::SeqCst) > 0 {
            return Some("a write batch that was given up on still holds the database".into());
        }
        match &*locked(&self.connection) {
            WriterConnection::Open => None,
            WriterConnection::Opening {
                failed: Some(cause),
                ..
            } => Some(format!("cannot open a writer connection: {cause}")),
            WriterConnection::Opening { since, .. } if since.elapsed() >= self.lease => {
                Some("a writer connection has been opening for longer than the lease".into())
            }
            WriterConnection::Opening { .. } => None,
        }
    }
}

pub(crate) fn locked<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing panics while one of these is held; a poisoned one is still whole.
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
