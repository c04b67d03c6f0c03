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
//! The writer cannot be stalled or lost for good, and every phase of a
//! write is bounded. A watchdog thread looks at it every [`WATCH_EVERY`],
//! and never waits for the disk itself:
//!
//! - a batch still **running** at the lease is **abandoned**: its callers
//!   are answered [`WriteError::Unavailable`] at once, and its fence makes
//!   sure it never commits — the writer thread moves a batch from running to
//!   committing with one compare-and-swap right before `COMMIT`, the
//!   watchdog from running to abandoned with another, so exactly one of them
//!   decides, and an abandoned batch is rolled back whenever its thread gets
//!   control again;
//! - a batch still in its **`COMMIT`** at the lease plus [`COMMIT_GRACE`]
//!   (a disk that does not answer its `fsync`) is **given up on** the same
//!   way: its callers are answered `Unavailable` — "outcome unknown": the
//!   commit may still go through, so a retry with the same key replays it
//!   then, and runs otherwise;
//! - a writer thread that **died** (a panic outside a unit's own
//!   `catch_unwind`) has its batch's callers answered `Unavailable`; its
//!   connection closed as it unwound, which rolled its transaction back.
//!
//! Either way a fresh thread takes over the queue at once, and opens a
//! connection of its own (on its own thread: a disk that hangs cannot hang
//! the watchdog); while it cannot, it tries again every [`REOPEN_EVERY`].
//! What the watchdog cannot do is take SQLite's write lock away from a
//! thread given up on: diesel exposes no `sqlite3_interrupt` (and this
//! crate forbids `unsafe`), and the lock belongs to its connection until
//! the thread returns. So while such a thread has not returned, or while no
//! connection can be opened, the writer **cannot write**
//! ([`WriterHealth::Stalled`]): every write is answered `Unavailable` at
//! once instead of queueing for a lock it cannot get, and writing resumes
//! the moment the thread returns (its batch rolled back, or committed after
//! all). When writing has been impossible for the lease plus
//! [`COMMIT_GRACE`], the writer **gives up** ([`WriterHealth::Unrecoverable`]):
//! the process cannot recover by itself, and should
//! exit so that its supervisor restarts it — a new process has a new
//! connection, and the lock of a dead one is gone.
//!
//! Whatever the writer does, a caller of [`Writer::run`] is answered within
//! the lease plus [`COMMIT_GRACE`] of handing its unit over ([`write_bound`]);
//! an answer at that deadline says "outcome unknown" too.
//!
//! The writer knows nothing of what a unit does: the idempotency ledger hands
//! it one unit per request exactly as it would run one transaction.

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicIsize, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};

use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tokio::sync::{oneshot, watch};

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
/// How long past the lease a batch may spend in its `COMMIT` before it is
/// given up on; also how long past the lease a caller waits for its answer
/// at most, and how long past the lease writing may stay impossible before
/// the writer gives up (see [`write_bound`]).
pub const COMMIT_GRACE: Duration = Duration::from_secs(5);
/// How often a replacement thread that cannot open its connection tries again.
pub const REOPEN_EVERY: Duration = Duration::from_millis(500);

/// The lease plus [`COMMIT_GRACE`]: within it of handing a unit over, its
/// caller is answered; past it from its start, a batch still in `COMMIT` is
/// given up on; and writing that stays impossible for that long makes the
/// writer give up.
pub fn write_bound(lease: Duration) -> Duration {
    lease.saturating_add(COMMIT_GRACE)
}

/// Whether the writer can write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriterHealth {
    /// It can (as far as it knows).
    Ready,
    /// It cannot for now, and says why; writes are answered
    /// [`WriteError::Unavailable`] at once.
    Stalled(String),
    /// It has not been able to for longer than [`write_bound`], and says
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
    /// Runs the unit, unless its caller no longer waits for it; `true` to
    /// keep its changes, `false` to roll them back.
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
        // A caller answered already (at its deadline) or gone (its request
        // was cancelled): the unit must not run now.
        let caller_waits = locked(&self.reply)
            .as_ref()
            .is_some_and(|reply| !reply.is_closed());
        let Some(work) = self.work.take().filter(|_| caller_waits) else {
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

/// A batch's fate, decided once: by the writer thread before `COMMIT` (and
/// again when `COMMIT` returns), or by the watchdog past the lease (running)
/// or past [`write_bound`] (committing).
const RUNNING: u8 = 0;
const COMMITTING: u8 = 1;
const COMMITTED: u8 = 2;
const ABANDONED: u8 = 3;

/// The batch a writer thread is running, as the watchdog sees it.
struct Watch {
    generation: u64,
    started: Instant,
    fence: Arc<AtomicU8>,
    callers: Vec<Box<dyn FnOnce(WriteError) + Send>>,
}

/// The connection of the thread that may take jobs.
enum WriterConnection {
    Open,
    /// A replacement is opening its connection since then; the last
    /// attempt's failure, if one failed.
    Opening {
        since: Instant,
        failed: Option<String>,
    },
}

/// What the writer threads, the watchdog and the handle share.
struct Shared {
    jobs: Mutex<Receiver<Box<dyn Job>>>,
    counters: Counters,
    /// Opens (and sets up) a fresh writer connection.
    open: Box<dyn Fn() -> Result<SqliteConnection, String> + Send + Sync>,
    lease: Duration,
    /// The database file, as the pool was given it (fault points' key).
    #[cfg_attr(not(feature = "fault-points"), allow(dead_code))]
    file: String,
    /// The generation of the thread that may take jobs; others end.
    generation: AtomicU64,
    current: Mutex<Option<Watch>>,
    thread: Mutex<Option<JoinHandle<()>>>,
    stopping: AtomicBool,
    connection: Mutex<WriterConnection>,
    /// Threads given up on that have not returned: each may still hold
    /// SQLite's write lock. (Signed: a thread may return before the
    /// watchdog has counted it.)
    hung: AtomicIsize,
    /// Why the writer gave up, once it has.
    gave_up: watch::Sender<Option<String>>,
}

impl Shared {
    /// Why the writer cannot write now, if it cannot.
    fn cannot_write(&self) -> Option<String> {
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
        Self::launch(Launch {
            conn,
            open,
            capacity,
            lease,
            file: String::new(),
            gave_up: watch::Sender::new(None),
        })
    }

    fn launch(launch: Launch) -> std::io::Result<Self> {
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
    /// or at [`write_bound`] after the call, whichever comes first. `Ok(result)`
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
        match tokio::time::timeout(write_bound(self.shared.lease), answer).await {
            Ok(answer) => answer.unwrap_or_else(|_| Err(stopped_mid_batch())),
            Err(_) => Err(WriteError::Unavailable(format!(
                "no answer within the lease plus {} s: the outcome is unknown",
                COMMIT_GRACE.as_secs()
            ))),
        }
    }

    /// [`Writer::run`] for a caller on a thread that may block. Its bound is
    /// the watchdog's: a batch is abandoned at the lease, given up on at
    /// [`write_bound`], and its callers answered then.
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
struct Launch {
    conn: SqliteConnection,
    open: Box<dyn Fn() -> Result<SqliteConnection, String> + Send + Sync>,
    capacity: usize,
    lease: Duration,
    file: String,
    gave_up: watch::Sender<Option<String>>,
}

/// The one [`Writer`] of a SQLite pool, started on the first write (so a
/// command that only reads never opens it).
pub(super) struct WriterSlot {
    path: String,
    session: SqliteSession,
    capacity: usize,
    lease: Duration,
    writer: Mutex<Option<Arc<Writer>>>,
    /// Says why once the writer has given up; there before the writer is.
    gave_up: watch::Sender<Option<String>>,
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
            gave_up: watch::Sender::new(None),
        }
    }

    fn started(&self) -> Option<Arc<Writer>> {
        locked(&self.writer).clone()
    }

    /// What the writer has done, once it has started.
    pub(super) fn stats(&self) -> Option<WriterStats> {
        self.started().map(|w| w.stats())
    }

    /// Whether the writer can write (a writer not started yet can).
    pub(super) fn health(&self) -> WriterHealth {
        self.started().map_or(WriterHealth::Ready, |w| w.health())
    }

    /// Resolves with why, once the writer has given up.
    pub(super) async fn gave_up(&self) -> String {
        let mut gave_up = self.gave_up.subscribe();
        match gave_up.wait_for(Option::is_some).await {
            Ok(why) => why.clone().unwrap_or_default(),
            // The sender lives as long as this slot.
            Err(_) => std::future::pending().await,
        }
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

/// Starts the writer thread of `generation`: on `conn`, or on a
/// connection it opens itself (a replacement).
fn spawn_writer(
    shared: &Arc<Shared>,
    conn: Option<SqliteConnection>,
    generation: u64,
) -> std::io::Result<()> {
    let thread_shared = Arc::clone(shared);
    let thread = std::thread::Builder::new()
        .name("sqlite-writer".into())
        .spawn(move || {
            let conn = match conn {
                Some(conn) => conn,
                None => match connect(&thread_shared, generation) {
                    Some(conn) => conn,
                    None => return,
                },
            };
            writer_loop(conn, &thread_shared, generation);
        })?;
    *locked(&shared.thread) = Some(thread);
    Ok(())
}

/// A replacement's connection, tried again every [`REOPEN_EVERY`] while it
/// cannot be opened; meanwhile units that were queued are answered
/// `Unavailable` (new ones are refused at once). `None` when the thread
/// must end instead (the writer stops).
fn connect(shared: &Shared, generation: u64) -> Option<SqliteConnection> {
    loop {
        if shared.generation.load(Ordering::SeqCst) != generation
            || shared.stopping.load(Ordering::SeqCst)
        {
            return None;
        }
        #[cfg(feature = "fault-points")]
        let opened = crate::fault::pass_blocking(crate::fault::Point::OpenWriter, &shared.file)
            .map_err(|e| e.to_string())
            .and_then(|()| (shared.open)());
        #[cfg(not(feature = "fault-points"))]
        let opened = (shared.open)();
        let cause = match opened {
            Ok(conn) => {
                *locked(&shared.connection) = WriterConnection::Open;
                return Some(conn);
            }
            Err(cause) => cause,
        };
        // The watchdog logs it, as the reason the writer cannot write.
        if let WriterConnection::Opening { failed, .. } = &mut *locked(&shared.connection) {
            *failed = Some(cause.clone());
        }
        let jobs = locked(&shared.jobs);
        while let Ok(job) = jobs.try_recv() {
            shared.counters.queued.fetch_sub(1, Ordering::SeqCst);
            job.finish(Err(WriteError::Unavailable(format!(
                "cannot open the writer: {cause}"
            ))));
        }
        drop(jobs);
        std::thread::sleep(REOPEN_EVERY);
    }
}

/// The watchdog: abandons a batch past its lease, gives up on one stuck in
/// `COMMIT`, replaces a writer thread that was given up on or died, and
/// gives up on the writer when writing stays impossible. Ends when the
/// handle goes. It never touches the database.
fn watch(shared: &Arc<Shared>) {
    let bound = write_bound(shared.lease);
    // Since when writing has been impossible.
    let mut stalled: Option<Instant> = None;
    while !shared.stopping.load(Ordering::SeqCst) {
        std::thread::sleep(WATCH_EVERY);
        let generation = shared.generation.load(Ordering::SeqCst);
        let dead = locked(&shared.thread)
            .as_ref()
            .is_none_or(JoinHandle::is_finished);
        // A death first: its batch is orphaned, not overdue (its thread
        // holds nothing any more).
        if dead && !shared.stopping.load(Ordering::SeqCst) {
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
        } else if let Some((watch, why)) = overdue(shared, generation) {
            tracing::error!(
                lease_secs = shared.lease.as_secs(),
                units = watch.callers.len(),
                "a write batch {why}; writer replaced"
            );
            metrics::counter!("orders_api_write_batches_abandoned_total").increment(1);
            // The replacement first, so that a caller's retry finds it.
            replace(shared, generation);
            for caller in watch.callers {
                caller(WriteError::Unavailable(format!("the write batch {why}")));
            }
        }
        match (shared.cannot_write(), stalled) {
            (None, None) => {}
            (None, Some(_)) => {
                stalled = None;
                tracing::info!("the writer can write again");
            }
            (Some(why), None) => {
                stalled = Some(Instant::now());
                tracing::error!(%why, "the writer cannot write; writes are answered 503 until it can");
            }
            (Some(why), Some(since)) if since.elapsed() >= bound => {
                shared.gave_up.send_if_modified(|gave_up| {
                    if gave_up.is_some() {
                        return false;
                    }
                    *gave_up = Some(format!(
                        "the SQLite writer could not write for {} s: {why}",
                        bound.as_secs()
                    ));
                    true
                });
            }
            (Some(_), Some(_)) => {}
        }
    }
}

/// The current batch when it has overstayed: still running at the lease
/// (abandoned), or still in `COMMIT` at the lease plus [`COMMIT_GRACE`]
/// (given up on); with what happened to it. Its thread counts as hung from
/// then until it returns.
fn overdue(shared: &Shared, generation: u64) -> Option<(Watch, &'static str)> {
    let mut current = locked(&shared.current);
    let watch = current.as_ref().filter(|w| w.generation == generation)?;
    let elapsed = watch.started.elapsed();
    let decide = |from: u8| {
        watch
            .fence
            .compare_exchange(from, ABANDONED, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    };
    let why = if elapsed >= shared.lease && decide(RUNNING) {
        "ran past the lease and was abandoned (rolled back)"
    } else if elapsed >= write_bound(shared.lease) && decide(COMMITTING) {
        "was still committing at the lease plus the commit grace: its outcome is unknown"
    } else {
        return None;
    };
    shared.hung.fetch_add(1, Ordering::SeqCst);
    current.take().map(|watch| (watch, why))
}

/// Starts the next generation's writer thread, which opens its own
/// connection; the old thread, if it lives, ends on its own (detached).
fn replace(shared: &Arc<Shared>, old: u64) {
    let generation = old.saturating_add(1);
    shared.generation.store(generation, Ordering::SeqCst);
    *locked(&shared.connection) = WriterConnection::Opening {
        since: Instant::now(),
        failed: None,
    };
    drop(locked(&shared.thread).take());
    match spawn_writer(shared, None, generation) {
        Ok(()) => {
            shared.counters.replaced.fetch_add(1, Ordering::SeqCst);
        }
        Err(e) => {
            // Tried again at the next look: no thread lives.
            tracing::error!(error = %e, "cannot start a writer thread");
        }
    }
}

/// Counts a thread given up on as returned when it leaves its batch, by
/// any way out (a panic included).
struct Leave<'a> {
    fence: &'a AtomicU8,
    hung: &'a AtomicIsize,
}

impl Drop for Leave<'_> {
    fn drop(&mut self) {
        if self.fence.load(Ordering::SeqCst) == ABANDONED {
            self.hung.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

fn writer_loop(mut conn: SqliteConnection, shared: &Shared, generation: u64) {
    let counters = &shared.counters;
    loop {
        if shared.generation.load(Ordering::SeqCst) != generation {
            return; // replaced meanwhile
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
        // Queued before the writer became unable to write: refused, not
        // left to wait for a lock that a thread given up on holds.
        if let Some(why) = shared.cannot_write() {
            for job in batch {
                job.finish(Err(WriteError::Unavailable(format!(
                    "the writer cannot write: {why}"
                ))));
            }
            continue;
        }
        let fence = Arc::new(AtomicU8::new(RUNNING));
        let _leave = Leave {
            fence: &fence,
            hung: &shared.hung,
        };
        *locked(&shared.current) = Some(Watch {
            generation,
            started: Instant::now(),
            fence: Arc::clone(&fence),
            callers: batch.iter().map(|job| job.answer_elsewhere()).collect(),
        });
        let result = run_batch(&mut conn, &mut batch, &fence, shared);
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
            fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Sqlite>) -> Result<(), DieselError> {
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
/// decides, right before `COMMIT`, whether the batch may commit at all, and
/// once `COMMIT` returns, whether the batch was given up on meanwhile.
fn run_batch(
    conn: &mut SqliteConnection,
    batch: &mut [Box<dyn Job>],
    fence: &AtomicU8,
    shared: &Shared,
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
    if let Err(e) = ran
        .and_then(|()| may_commit())
        .and_then(|()| commit(conn, shared))
    {
        // Harmless when the transaction is already gone.
        let _ = conn.batch_execute("ROLLBACK");
        return Err(if fence.load(Ordering::SeqCst) == ABANDONED {
            abandoned()
        } else {
            unavailable(e)
        });
    }
    // Committed; its callers were answered already if the watchdog gave the
    // batch up while `COMMIT` ran.
    fence
        .compare_exchange(COMMITTING, COMMITTED, Ordering::SeqCst, Ordering::SeqCst)
        .map(|_| ())
        .map_err(|_| abandoned())
}

#[cfg_attr(not(feature = "fault-points"), allow(unused_variables))]
fn commit(conn: &mut SqliteConnection, shared: &Shared) -> Result<(), DieselError> {
    #[cfg(feature = "fault-points")]
    if crate::fault::pass_blocking(crate::fault::Point::BeforeCommit, &shared.file).is_err() {
        return Err(DieselError::RollbackTransaction);
    }
    conn.batch_execute("COMMIT")
}
