//! Group commit for SQLite: one thread owns the write connection and commits
//! many requests' work in one transaction, so that one `fsync` acknowledges
//! a whole batch.
//!
//! SQLite has a single write lock per file, so writing connections in a pool
//! only queue for it, and with `synchronous = FULL` each of their commits
//! pays its own `fsync`. Here the queue is explicit instead:
//!
//! 1. a caller hands [`Writer::run`] one unit of work and awaits its answer
//!    (holding no thread: the answer comes on a oneshot channel);
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
//! The writer cannot be stalled or lost for good. A watchdog thread looks at
//! it every [`WATCH_EVERY`]:
//!
//! - a batch running past the lease is **abandoned**: its callers are
//!   answered [`WriteError::Unavailable`] at once, and its fence makes sure
//!   it never commits — the writer thread moves a batch from running to
//!   committing with one compare-and-swap right before `COMMIT`, the
//!   watchdog from running to abandoned with another, so exactly one of them
//!   decides, and an abandoned batch is rolled back whenever its thread gets
//!   control again. A fresh thread, on a fresh connection, takes over the
//!   queue at once; the abandoned thread ends after its rollback.
//! - a writer thread that **died** (a panic outside a unit's own
//!   `catch_unwind`) is replaced the same way. Its connection closed as it
//!   unwound, which rolled its transaction back, and its callers' reply
//!   channels closed with it: each is answered `Unavailable`.
//!
//! What the watchdog cannot do is take SQLite's write lock away from a
//! thread hung *inside* its transaction: diesel exposes no
//! `sqlite3_interrupt` (and this crate forbids `unsafe`), and the lock
//! belongs to the hung connection until that thread returns. Until then the
//! replacement's `BEGIN IMMEDIATE` waits for the lock (at most the busy
//! timeout) and its batches are answered `Unavailable` in turn (at the
//! lease at most) — never left hanging; writing resumes the moment the hung
//! unit returns, is rolled back, and frees the lock. A unit of this service
//! is a handful of statements, each bounded by the busy timeout.
//! The writer knows nothing of what a unit does: the idempotency ledger hands
//! it one unit per request exactly as it would run one transaction.

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};

use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

use diesel::Connection;
use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::query_builder::{AstPass, QueryFragment, QueryId};
use diesel::result::Error as DieselError;
use diesel::sqlite::{Sqlite, SqliteConnection};

use super::pool::Conn;
use super::sqlite::SqliteSession;

/// The most units one transaction commits.
pub const MAX_BATCH: usize = 256;
/// The most units waiting for the writer by default; beyond that callers
/// are refused.
pub const DEFAULT_QUEUE_CAPACITY: usize = 4_096;
/// How often the watchdog looks for a batch past its lease or a dead writer.
pub const WATCH_EVERY: Duration = Duration::from_millis(50);

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
struct Counters {
    queued: AtomicUsize,
    batches: AtomicU64,
    units: AtomicU64,
    /// Writer threads started after the first (abandoned or dead ones replaced).
    replaced: AtomicU64,
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
    /// Answers the caller from another thread (the watchdog's, when the
    /// batch is abandoned); the unit's own `finish` then never answers.
    fn answer_elsewhere(&self) -> Box<dyn FnOnce(WriteError) + Send>;
}

/// What a caller is answered: its unit's result, or why the batch failed.
type Answer<T, E> = Result<Result<T, E>, WriteError>;

/// Where a caller's answer goes: taken by whichever answers first.
type Reply<T, E> = Arc<Mutex<Option<oneshot::Sender<Answer<T, E>>>>>;

struct Pending<F, T, E> {
    work: Option<F>,
    outcome: Option<Answer<T, E>>,
    /// Taken by whichever answers first: the writer thread after the batch,
    /// or the watchdog when it abandons the batch.
    reply: Reply<T, E>,
}

impl<F, T, E> Job for Pending<F, T, E>
where
    F: FnOnce(&mut Conn<'_>) -> Result<T, E> + Send,
    T: Send + 'static,
    E: Send + 'static,
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
        answer_once(&self.reply, answer);
    }

    fn answer_elsewhere(&self) -> Box<dyn FnOnce(WriteError) + Send> {
        let reply = Arc::clone(&self.reply);
        Box::new(move |e| answer_once(&reply, Err(e)))
    }
}

/// Sends the caller its answer unless it was answered already. The caller
/// may have gone (its request was cancelled): nothing to do then.
fn answer_once<T>(reply: &Mutex<Option<oneshot::Sender<T>>>, answer: T) {
    if let Some(sender) = locked(reply).take() {
        let _ = sender.send(answer);
    }
}

fn panic_message(panic: &(dyn Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".to_owned())
}

/// A batch's fate, decided once: by the writer thread before `COMMIT`, or
/// by the watchdog past the lease.
const RUNNING: u8 = 0;
const COMMITTING: u8 = 1;
const ABANDONED: u8 = 2;

/// The batch a writer thread is running, as the watchdog sees it.
struct Watch {
    generation: u64,
    started: Instant,
    fence: Arc<AtomicU8>,
    callers: Vec<Box<dyn FnOnce(WriteError) + Send>>,
}

/// What the writer threads, the watchdog and the handle share.
struct Shared {
    jobs: Mutex<Receiver<Box<dyn Job>>>,
    counters: Counters,
    /// Opens (and sets up) a fresh writer connection.
    open: Box<dyn Fn() -> Result<SqliteConnection, String> + Send + Sync>,
    lease: Duration,
    /// The generation of the thread that may take jobs; others end.
    generation: AtomicU64,
    current: Mutex<Option<Watch>>,
    thread: Mutex<Option<JoinHandle<()>>>,
    stopping: AtomicBool,
}

fn locked<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing panics while one of these is held; a poisoned one is still whole.
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

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
        let (queue, jobs) = mpsc::sync_channel::<Box<dyn Job>>(capacity);
        let shared = Arc::new(Shared {
            jobs: Mutex::new(jobs),
            counters: Counters::default(),
            open,
            lease,
            generation: AtomicU64::new(0),
            current: Mutex::new(None),
            thread: Mutex::new(None),
            stopping: AtomicBool::new(false),
        });
        spawn_writer(&shared, conn, 0)?;
        let watched = Arc::clone(&shared);
        let watchdog = std::thread::Builder::new()
            .name("sqlite-watchdog".into())
            .spawn(move || watch(&watched))?;
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

    /// Runs `work` in the next batch and resolves once that batch is over.
    /// `Ok(result)` means `work` ran and, when `result` is `Ok`, its changes
    /// are committed and synced; an `Err` result was rolled back.
    pub async fn run<F, T, E>(&self, work: F) -> Answer<T, E>
    where
        F: FnOnce(&mut Conn<'_>) -> Result<T, E> + Send + 'static,
        T: Send + 'static,
        E: Send + 'static,
    {
        self.submit(work)?
            .await
            .unwrap_or_else(|_| Err(stopped_mid_batch()))
    }

    /// [`Writer::run`] for a caller on a thread that may block.
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

/// The one [`Writer`] of a SQLite pool, started on the first write (so a
/// command that only reads never opens it).
pub(super) struct WriterSlot {
    path: String,
    session: SqliteSession,
    capacity: usize,
    lease: Duration,
    writer: Mutex<Option<Arc<Writer>>>,
}

impl WriterSlot {
    pub(super) fn new(
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
        let (path, session) = (self.path.clone(), self.session);
        // How the watchdog opens a replacement's connection, too.
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

fn spawn_writer(
    shared: &Arc<Shared>,
    conn: SqliteConnection,
    generation: u64,
) -> std::io::Result<()> {
    let thread_shared = Arc::clone(shared);
    let thread = std::thread::Builder::new()
        .name("sqlite-writer".into())
        .spawn(move || writer_loop(conn, &thread_shared, generation))?;
    *locked(&shared.thread) = Some(thread);
    Ok(())
}

/// The watchdog: abandons a batch past its lease, replaces a writer thread
/// that was abandoned or died. Ends when the handle goes.
fn watch(shared: &Arc<Shared>) {
    while !shared.stopping.load(Ordering::SeqCst) {
        std::thread::sleep(WATCH_EVERY);
        let generation = shared.generation.load(Ordering::SeqCst);
        let overdue = {
            let mut current = locked(&shared.current);
            match current.as_ref() {
                Some(watch)
                    if watch.generation == generation
                        && watch.started.elapsed() >= shared.lease
                        && watch
                            .fence
                            .compare_exchange(
                                RUNNING,
                                ABANDONED,
                                Ordering::SeqCst,
                                Ordering::SeqCst,
                            )
                            .is_ok() =>
                {
                    current.take()
                }
                _ => None,
            }
        };
        let dead = locked(&shared.thread)
            .as_ref()
            .is_some_and(JoinHandle::is_finished);
        if let Some(watch) = overdue {
            tracing::error!(
                lease_secs = shared.lease.as_secs(),
                units = watch.callers.len(),
                "a write batch ran past the lease: abandoned (rolled back), writer replaced"
            );
            metrics::counter!("orders_api_write_batches_abandoned_total").increment(1);
            // The replacement first, so that a caller's retry finds it.
            replace(shared, generation);
            for caller in watch.callers {
                caller(WriteError::Unavailable(
                    "the write batch ran past the lease and was abandoned".into(),
                ));
            }
        } else if dead && !shared.stopping.load(Ordering::SeqCst) {
            tracing::error!("the writer thread died; replaced");
            metrics::counter!("orders_api_writer_deaths_total").increment(1);
            // Its batch's callers: their own reply channels closed with the
            // thread, but the copies kept here would keep them waiting.
            let orphaned = {
                let mut current = locked(&shared.current);
                match current.as_ref() {
                    Some(watch) if watch.generation == generation => current.take(),
                    _ => None,
                }
            };
            replace(shared, generation);
            for caller in orphaned.into_iter().flat_map(|watch| watch.callers) {
                caller(WriteError::Unavailable("the writer died mid-batch".into()));
            }
        }
    }
}

/// Starts the next generation's writer thread on a fresh connection; while
/// none can be opened, answers every queued unit `Unavailable` (and tries
/// again at the next look).
fn replace(shared: &Arc<Shared>, old: u64) {
    let conn = match (shared.open)() {
        Ok(conn) => conn,
        Err(cause) => {
            tracing::error!(%cause, "cannot open a writer connection; refusing queued writes");
            let jobs = locked(&shared.jobs);
            while let Ok(job) = jobs.try_recv() {
                shared.counters.queued.fetch_sub(1, Ordering::SeqCst);
                job.finish(Err(WriteError::Unavailable(format!(
                    "cannot open the writer: {cause}"
                ))));
            }
            return;
        }
    };
    let generation = old.saturating_add(1);
    shared.generation.store(generation, Ordering::SeqCst);
    // The old thread, if it lives, ends on its own (detached).
    drop(locked(&shared.thread).take());
    match spawn_writer(shared, conn, generation) {
        Ok(()) => {
            shared.counters.replaced.fetch_add(1, Ordering::SeqCst);
        }
        Err(e) => {
            // Tried again at the next look: the slot still says dead.
            shared.generation.store(old, Ordering::SeqCst);
            tracing::error!(error = %e, "cannot start a writer thread");
        }
    }
}

fn writer_loop(mut conn: SqliteConnection, shared: &Shared, generation: u64) {
    let counters = &shared.counters;
    loop {
        if shared.generation.load(Ordering::SeqCst) != generation {
            return; // replaced while this thread was abandoned
        }
        let mut batch = {
            let jobs = locked(&shared.jobs);
            // Blocks while idle; ends when every handle is gone and the queue is empty.
            let Ok(first) = jobs.recv() else {
                return;
            };
            let mut batch = Vec::with_capacity(MAX_BATCH.min(64));
            batch.push(first);
            while batch.len() < MAX_BATCH {
                match jobs.try_recv() {
                    Ok(job) => batch.push(job),
                    Err(_) => break,
                }
            }
            batch
        };
        counters.queued.fetch_sub(batch.len(), Ordering::SeqCst);
        let fence = Arc::new(AtomicU8::new(RUNNING));
        *locked(&shared.current) = Some(Watch {
            generation,
            started: Instant::now(),
            fence: Arc::clone(&fence),
            callers: batch.iter().map(|job| job.answer_elsewhere()).collect(),
        });
        let result = run_batch(&mut conn, &mut batch, &fence);
        {
            let mut current = locked(&shared.current);
            if current
                .as_ref()
                .is_some_and(|w| Arc::ptr_eq(&w.fence, &fence))
            {
                *current = None;
            }
        }
        if fence.load(Ordering::SeqCst) == ABANDONED {
            // The watchdog answered every caller; this thread's work is over.
            return;
        }
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

/// One transaction for the whole batch, one savepoint per unit. `fence`
/// decides, right before `COMMIT`, whether the batch may commit at all.
fn run_batch(
    conn: &mut SqliteConnection,
    batch: &mut [Box<dyn Job>],
    fence: &AtomicU8,
) -> Result<(), WriteError> {
    let unavailable = |e: DieselError| WriteError::Unavailable(e.to_string());
    let abandoned = || WriteError::Unavailable("the batch was abandoned".into());
    conn.batch_execute("BEGIN IMMEDIATE").map_err(unavailable)?;
    let ran = batch.iter_mut().try_for_each(|job| {
        if fence.load(Ordering::SeqCst) == ABANDONED {
            return Err(DieselError::RollbackTransaction);
        }
        Savepoint.execute(conn)?;
        let keep = job.run(&mut Conn::Sqlite(conn));
        if !keep {
            // Fails when SQLite already rolled the whole transaction back
            // (a full disk, an I/O error): then the batch is lost.
            RollbackToSavepoint.execute(conn)?;
        }
        ReleaseSavepoint.execute(conn).map(|_| ())
    });
    let may_commit = || {
        fence
            .compare_exchange(RUNNING, COMMITTING, Ordering::SeqCst, Ordering::SeqCst)
            .map(|_| ())
            .map_err(|_| DieselError::RollbackTransaction)
    };
    match ran
        .and_then(|()| may_commit())
        .and_then(|()| conn.batch_execute("COMMIT"))
    {
        Ok(()) => Ok(()),
        Err(e) => {
            // Harmless when the transaction is already gone.
            let _ = conn.batch_execute("ROLLBACK");
            if fence.load(Ordering::SeqCst) == ABANDONED {
                Err(abandoned())
            } else {
                Err(unavailable(e))
            }
        }
    }
}
