//! Group commit for SQLite: one thread owns the write connection and commits
//! many requests' work in one transaction, so that one `fsync` acknowledges
//! a whole batch.
//!
//! SQLite has a single write lock per file, so writing connections in a pool
//! only queue for it, and with `synchronous = FULL` each of their commits
//! pays its own `fsync`. Here the queue is explicit instead:
//!
//! 1. a caller hands [`Writer::run`] one unit of work and blocks;
//! 2. the writer thread takes the first unit off the queue, opens a
//!    transaction (`BEGIN IMMEDIATE`, which also serialises it against other
//!    processes on the same file) and runs the unit inside its own
//!    `SAVEPOINT`; then every unit already waiting, each in its own
//!    savepoint, up to [`MAX_BATCH`];
//! 3. a unit that returns `Ok` keeps its changes (`RELEASE`); one that
//!    returns `Err` (or panics) is rolled back to its savepoint alone;
//! 4. one `COMMIT` — the only `fsync` — and only then is every caller of the
//!    batch answered. A failed `COMMIT` answers all of them
//!    [`WriteError::Unavailable`] and none of their work persists.
//!
//! Batching is natural: an idle writer starts a transaction for a lone unit
//! at once, and the units that arrive while a `COMMIT` is syncing form the
//! next batch. The queue is bounded; a full queue answers
//! [`WriteError::Overloaded`] at once instead of growing without limit.
//! When the last handle goes, the writer finishes what is queued and stops.
//!
//! The writer knows nothing of what a unit does: the idempotency ledger hands
//! it one unit per request exactly as it would run one transaction.

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::query_builder::{AstPass, QueryFragment, QueryId};
use diesel::result::Error as DieselError;
use diesel::sqlite::{Sqlite, SqliteConnection};

use super::Conn;
use super::sqlite::SqliteSession;

/// The most units one transaction commits.
pub const MAX_BATCH: usize = 256;
/// The most units waiting for the writer by default; beyond that callers
/// are refused.
pub const DEFAULT_QUEUE_CAPACITY: usize = 4_096;

/// What the writer has done so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriterStats {
    /// Units waiting in the queue now.
    pub queued: usize,
    /// Transactions committed.
    pub batches: u64,
    /// Units those transactions carried (kept or rolled back to their savepoint).
    pub units: u64,
}

#[derive(Debug, Default)]
struct Counters {
    queued: AtomicUsize,
    batches: AtomicU64,
    units: AtomicU64,
}

/// Why a unit's outcome is not known to have persisted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WriteError {
    /// The batch could not be committed (or its transaction was lost); none
    /// of its units' work persisted. Safe to retry.
    #[error("the write could not be committed: {0}")]
    Unavailable(String),
    /// The queue is full: the writer is behind. Safe to retry later.
    #[error("the writer's queue is full")]
    Overloaded,
    /// The unit panicked; it was rolled back.
    #[error("the unit of work panicked: {0}")]
    Panicked(String),
}

/// A unit as the writer thread sees it: run it, then tell it how its batch ended.
trait Job: Send {
    /// Runs the unit; `true` to keep its changes, `false` to roll them back.
    fn run(&mut self, conn: &mut Conn<'_>) -> bool;
    /// Answers the caller once the batch is over.
    fn finish(self: Box<Self>, batch: Result<(), WriteError>);
}

struct Pending<F, T, E> {
    work: Option<F>,
    outcome: Option<Result<Result<T, E>, WriteError>>,
    reply: SyncSender<Result<Result<T, E>, WriteError>>,
}

impl<F, T, E> Job for Pending<F, T, E>
where
    F: FnOnce(&mut Conn<'_>) -> Result<T, E> + Send,
    T: Send,
    E: Send,
{
    fn run(&mut self, conn: &mut Conn<'_>) -> bool {
        let Some(work) = self.work.take() else {
            return false;
        };
        let outcome = match catch_unwind(AssertUnwindSafe(|| work(conn))) {
            Ok(result) => Ok(result),
            Err(panic) => Err(WriteError::Panicked(panic_message(&*panic))),
        };
        let keep = matches!(outcome, Ok(Ok(_)));
        self.outcome = Some(outcome);
        keep
    }

    fn finish(self: Box<Self>, batch: Result<(), WriteError>) {
        let answer = match (batch, self.outcome) {
            (Ok(()), Some(outcome)) => outcome,
            (Err(e), _) => Err(e),
            (Ok(()), None) => Err(WriteError::Unavailable("the unit never ran".into())),
        };
        // The caller may have gone (its request was cancelled); nothing to do.
        let _ = self.reply.send(answer);
    }
}

fn panic_message(panic: &(dyn Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".to_owned())
}

/// The handle callers share; dropping the last one drains the queue and
/// stops the thread.
pub struct Writer {
    queue: Option<SyncSender<Box<dyn Job>>>,
    thread: Option<JoinHandle<()>>,
    counters: Arc<Counters>,
}

impl Writer {
    /// Starts the writer thread on `conn`, whose session settings (busy
    /// timeout, WAL, `synchronous`) the caller has applied, with room for
    /// `capacity` waiting units.
    pub fn start(conn: SqliteConnection, capacity: usize) -> std::io::Result<Self> {
        let (queue, jobs) = mpsc::sync_channel::<Box<dyn Job>>(capacity);
        let counters = Arc::new(Counters::default());
        let thread_counters = Arc::clone(&counters);
        let thread = std::thread::Builder::new()
            .name("sqlite-writer".into())
            .spawn(move || writer_loop(conn, jobs, &thread_counters))?;
        Ok(Self {
            queue: Some(queue),
            thread: Some(thread),
            counters,
        })
    }

    pub fn stats(&self) -> WriterStats {
        WriterStats {
            queued: self.counters.queued.load(Ordering::SeqCst),
            batches: self.counters.batches.load(Ordering::SeqCst),
            units: self.counters.units.load(Ordering::SeqCst),
        }
    }

    /// Runs `work` in the next batch and blocks until that batch is over.
    /// `Ok(result)` means `work` ran and, when `result` is `Ok`, its changes
    /// are committed and synced; an `Err` result was rolled back.
    pub fn run<F, T, E>(&self, work: F) -> Result<Result<T, E>, WriteError>
    where
        F: FnOnce(&mut Conn<'_>) -> Result<T, E> + Send + 'static,
        T: Send + 'static,
        E: Send + 'static,
    {
        let (reply, answer) = mpsc::sync_channel(1);
        let job = Box::new(Pending {
            work: Some(work),
            outcome: None,
            reply,
        });
        let queue = self
            .queue
            .as_ref()
            .ok_or_else(|| WriteError::Unavailable("the writer has stopped".into()))?;
        self.counters.queued.fetch_add(1, Ordering::SeqCst);
        queue.try_send(job).map_err(|e| {
            self.counters.queued.fetch_sub(1, Ordering::SeqCst);
            match e {
                TrySendError::Full(_) => WriteError::Overloaded,
                TrySendError::Disconnected(_) => {
                    WriteError::Unavailable("the writer has stopped".into())
                }
            }
        })?;
        answer
            .recv()
            .map_err(|_| WriteError::Unavailable("the writer stopped mid-batch".into()))?
    }
}

impl Drop for Writer {
    /// Lets the writer finish every queued unit, then waits for it.
    fn drop(&mut self) {
        drop(self.queue.take());
        if let Some(thread) = self.thread.take() {
            // A unit that owned the last handle is dropped on the writer
            // thread itself, which then ends on its own.
            if thread.thread().id() != std::thread::current().id() {
                let _ = thread.join();
            }
        }
    }
}

/// The one [`Writer`] of a SQLite pool, started on the first write (so a
/// command that only reads never opens it).
pub(super) struct WriterSlot {
    path: String,
    session: SqliteSession,
    capacity: usize,
    writer: Mutex<Option<Arc<Writer>>>,
}

impl WriterSlot {
    pub(super) fn new(path: &str, session: SqliteSession, capacity: usize) -> Self {
        Self {
            path: path.to_owned(),
            session,
            capacity,
            writer: Mutex::new(None),
        }
    }

    /// What the writer has done, once it has started.
    pub(super) fn stats(&self) -> Option<WriterStats> {
        self.writer.lock().ok()?.as_ref().map(|w| w.stats())
    }

    pub(super) fn get(&self) -> Result<Arc<Writer>, WriteError> {
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

fn writer_loop(mut conn: SqliteConnection, jobs: Receiver<Box<dyn Job>>, counters: &Counters) {
    // Blocks while idle; ends when every handle is gone and the queue is empty.
    while let Ok(first) = jobs.recv() {
        let mut batch = Vec::with_capacity(MAX_BATCH.min(64));
        batch.push(first);
        while batch.len() < MAX_BATCH {
            match jobs.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        counters.queued.fetch_sub(batch.len(), Ordering::SeqCst);
        let result = run_batch(&mut conn, &mut batch);
        if result.is_ok() {
            counters.batches.fetch_add(1, Ordering::SeqCst);
            counters
                .units
                .fetch_add(batch.len() as u64, Ordering::SeqCst);
            metrics::counter!("orders_api_write_batches_total").increment(1);
            metrics::histogram!("orders_api_write_batch_units").record(batch.len() as f64);
        } else {
            metrics::counter!("orders_api_write_batches_failed_total").increment(1);
        }
        for job in batch {
            job.finish(result.clone());
        }
    }
}

/// A fixed statement of the writer's, prepared once and kept in diesel's
/// statement cache (found by its type): a text statement run with
/// `batch_execute` would be parsed anew every time, twice per unit.
macro_rules! fixed_statement {
    ($name:ident, $sql:literal) => {
        struct $name;

        impl QueryId for $name {
            type QueryId = Self;
            const HAS_STATIC_QUERY_ID: bool = true;
        }

        impl QueryFragment<Sqlite> for $name {
            fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Sqlite>) -> QueryResult<()> {
                out.push_sql($sql);
                Ok(())
            }
        }

        impl RunQueryDsl<SqliteConnection> for $name {}
    };
}

fixed_statement!(Savepoint, "SAVEPOINT unit");
fixed_statement!(RollbackToSavepoint, "ROLLBACK TO unit");
fixed_statement!(ReleaseSavepoint, "RELEASE unit");

/// One transaction for the whole batch, one savepoint per unit.
fn run_batch(conn: &mut SqliteConnection, batch: &mut [Box<dyn Job>]) -> Result<(), WriteError> {
    let unavailable = |e: DieselError| WriteError::Unavailable(e.to_string());
    conn.batch_execute("BEGIN IMMEDIATE").map_err(unavailable)?;
    let ran = batch.iter_mut().try_for_each(|job| {
        Savepoint.execute(conn)?;
        let keep = job.run(&mut Conn::Sqlite(conn));
        if !keep {
            // Fails when SQLite already rolled the whole transaction back
            // (a full disk, an I/O error): then the batch is lost.
            RollbackToSavepoint.execute(conn)?;
        }
        ReleaseSavepoint.execute(conn).map(|_| ())
    });
    match ran.and_then(|()| conn.batch_execute("COMMIT")) {
        Ok(()) => Ok(()),
        Err(e) => {
            // Harmless when the transaction is already gone.
            let _ = conn.batch_execute("ROLLBACK");
            Err(unavailable(e))
        }
    }
}
