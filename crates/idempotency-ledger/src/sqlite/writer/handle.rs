//! The handle callers share: it queues a unit, and answers its caller
//! once the unit's batch is over; dropping the last one drains the queue
//! and stops the threads.

use std::sync::atomic::{AtomicBool, AtomicIsize, AtomicU64, Ordering};
use std::sync::mpsc::{self, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use diesel::SqliteConnection;
use tokio::sync::{oneshot, watch};

use super::queue::{Answer, Job, Pending};
use super::shared::{Counters, Shared, WriterConnection, WriterHealth, WriterStats, locked};
use super::watchdog::{self, spawn_writer};
use crate::conn::{Conn, WriteError, answered_in_time};

/// The most units waiting for the writer by default; beyond that callers
/// are refused.
pub const DEFAULT_QUEUE_CAPACITY: usize = 4_096;

/// The handle callers share; dropping the last one drains the queue and
/// stops the thread.
pub struct Writer {
    queue: Option<SyncSender<Box<dyn Job>>>,
    shared: Arc<Shared>,
    watchdog: Option<JoinHandle<()>>,
}

impl Writer {
    /// Starts the writer thread on `conn`, whose session settings (busy
    /// timeout, WAL, `synchronous`) the caller has applied, with room for
    /// `capacity` waiting units; `open` makes a connection like it for a
    /// replacement thread, and a batch may run at most `lease`.
    pub fn start(
        conn: SqliteConnection,
        open: Box<dyn Fn() -> Result<SqliteConnection, String> + Send + Sync>,
        capacity: usize,
        lease: Duration,
    ) -> std::io::Result<Self> {
        Self::launch(Launch {
            conn,
            open,
            capacity,
            lease,
            file: String::new(),
            gave_up: watch::Sender::new(None),
        })
    }

    pub(crate) fn launch(launch: Launch) -> std::io::Result<Self> {
        let (queue, jobs) = mpsc::sync_channel::<Box<dyn Job>>(launch.capacity);
        let shared = Arc::new(Shared {
            jobs: Mutex::new(jobs),
            counters: Counters::default(),
            open: launch.open,
            lease: launch.lease,
            file: launch.file,
            generation: AtomicU64::new(0),
            current: Mutex::new(None),
            thread: Mutex::new(None),
            stopping: AtomicBool::new(false),
            connection: Mutex::new(WriterConnection::Open),
            hung: AtomicIsize::new(0),
            gave_up: launch.gave_up,
        });
        spawn_writer(&shared, Some(launch.conn), 0)?;
        let watched = Arc::clone(&shared);
        let watchdog = std::thread::Builder::new()
            .name("sqlite-watchdog".into())
            .spawn(move || watchdog::watch(&watched))?;
        Ok(Self {
            queue: Some(queue),
            shared,
            watchdog: Some(watchdog),
        })
    }

    /// What the writer has done so far.
    pub fn stats(&self) -> WriterStats {
        let counters = &self.shared.counters;
        WriterStats {
            queued: counters.queued.load(Ordering::SeqCst),
            batches: counters.batches.load(Ordering::SeqCst),
            units: counters.units.load(Ordering::SeqCst),
            replaced: counters.replaced.load(Ordering::SeqCst),
        }
    }

    /// Whether the writer can write now.
    pub fn health(&self) -> WriterHealth {
        if let Some(why) = self.shared.gave_up.borrow().as_ref() {
            return WriterHealth::Unrecoverable(why.clone());
        }
        self.shared
            .cannot_write()
            .map_or(WriterHealth::Ready, WriterHealth::Stalled)
    }

    /// Runs `work` in the next batch and resolves once that batch is over,
    /// or at the lease plus the commit grace after the call, whichever comes first. `Ok(result)`
    /// means `work` ran and, when `result` is `Ok`, its changes are
    /// committed and synced; an `Err` result was rolled back. An answer at
    /// the deadline is [`WriteError::Unavailable`] with the outcome unknown:
    /// the unit may still run, or its batch still commit.
    pub async fn run<F, T, E>(&self, work: F) -> Answer<T, E>
    where
        F: FnOnce(&mut Conn<'_>) -> Result<T, E> + Send + 'static,
        T: Send + 'static,
        E: Send + 'static,
    {
        let answer = self.submit(work)?;
        match answered_in_time(self.shared.lease, answer).await {
            Ok(answer) => answer.unwrap_or_else(|_| Err(stopped_mid_batch())),
            Err(unknown) => Err(WriteError::Unavailable(unknown)),
        }
    }

    /// [`Writer::run`] for a caller on a thread that may block. Its bound is
    /// the watchdog's: a batch is abandoned at the lease, given up on at
    /// [`write_bound`](crate::db::write_bound), and its callers answered then.
    pub fn run_blocking<F, T, E>(&self, work: F) -> Answer<T, E>
    where
        F: FnOnce(&mut Conn<'_>) -> Result<T, E> + Send + 'static,
        T: Send + 'static,
        E: Send + 'static,
    {
        self.submit(work)?
            .blocking_recv()
            .unwrap_or_else(|_| Err(stopped_mid_batch()))
    }

    /// Queues `work`; its answer comes on the returned channel.
    fn submit<F, T, E>(&self, work: F) -> Result<oneshot::Receiver<Answer<T, E>>, WriteError>
    where
        F: FnOnce(&mut Conn<'_>) -> Result<T, E> + Send + 'static,
        T: Send + 'static,
        E: Send + 'static,
    {
        if let Some(why) = self.shared.cannot_write() {
            return Err(WriteError::Unavailable(format!(
                "the writer cannot write: {why}"
            )));
        }
        let (reply, answer) = oneshot::channel();
        let job = Box::new(Pending {
            work: Some(work),
            outcome: None,
            reply: Arc::new(Mutex::new(Some(reply))),
        });
        let queue = self
            .queue
            .as_ref()
            .ok_or_else(|| WriteError::Unavailable("the writer has stopped".into()))?;
        let queued = &self.shared.counters.queued;
        queued.fetch_add(1, Ordering::SeqCst);
        queue.try_send(job).map_err(|e| {
            queued.fetch_sub(1, Ordering::SeqCst);
            match e {
                TrySendError::Full(_) => WriteError::Overloaded,
                TrySendError::Disconnected(_) => {
                    WriteError::Unavailable("the writer has stopped".into())
                }
            }
        })?;
        Ok(answer)
    }
}

/// A caller whose reply channel closed unanswered: the thread that held its
/// unit died.
fn stopped_mid_batch() -> WriteError {
    WriteError::Unavailable("the writer stopped mid-batch".into())
}

impl Drop for Writer {
    /// Lets the writer finish every queued unit, then waits for it.
    fn drop(&mut self) {
        // First, so that the watchdog does not take the end for a death.
        self.shared.stopping.store(true, Ordering::SeqCst);
        drop(self.queue.take());
        if let Some(watchdog) = self.watchdog.take() {
            let _ = watchdog.join();
        }
        let thread = locked(&self.shared.thread).take();
        if let Some(thread) = thread {
            // A unit that owned the last handle is dropped on the writer
            // thread itself, which then ends on its own.
            if thread.thread().id() != std::thread::current().id() {
                let _ = thread.join();
            }
        }
    }
}

/// What [`Writer::launch`] starts a writer with.
pub(crate) struct Launch {
    pub(crate) conn: SqliteConnection,
    pub(crate) open: Box<dyn Fn() -> Result<SqliteConnection, String> + Send + Sync>,
    pub(crate) capacity: usize,
    pub(crate) lease: Duration,
    pub(crate) file: String,
    pub(crate) gave_up: watch::Sender<Option<String>>,
}
