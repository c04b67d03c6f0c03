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
//!    [`WriteError::Unavailable`](crate::db::WriteError::Unavailable) and none of their work persists.
//!
//! Batching is natural: an idle writer starts a transaction for a lone unit
//! at once, and the units that arrive while a `COMMIT` is syncing form the
//! next batch. The queue is bounded; a full queue answers
//! [`WriteError::Overloaded`](crate::db::WriteError::Overloaded) at once instead of growing without limit.
//! When the last handle goes, the writer finishes what is queued and stops.
//!
//! The writer cannot be stalled or lost for good, and every phase of a
//! write is bounded. A watchdog thread looks at it every [`WATCH_EVERY`],
//! and never waits for the disk itself:
//!
//! - a batch still **running** at the lease is **abandoned**: its callers
//!   are answered [`WriteError::Unavailable`](crate::db::WriteError::Unavailable) at once, and its fence makes
//!   sure it never commits — the writer thread moves a batch from running to
//!   committing with one compare-and-swap right before `COMMIT`, the
//!   watchdog from running to abandoned with another, so exactly one of them
//!   decides, and an abandoned batch is rolled back whenever its thread gets
//!   control again;
//! - a batch still in its **`COMMIT`** at the lease plus [`COMMIT_GRACE`](crate::db::COMMIT_GRACE)
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
//! [`COMMIT_GRACE`](crate::db::COMMIT_GRACE), the writer **gives up** ([`WriterHealth::Unrecoverable`]):
//! the process cannot recover by itself, and should
//! exit so that its supervisor restarts it — a new process has a new
//! connection, and the lock of a dead one is gone.
//!
//! Whatever the writer does, a caller of [`Writer::run`] is answered within
//! the lease plus [`COMMIT_GRACE`](crate::db::COMMIT_GRACE) of handing its unit over ([`write_bound`](crate::db::write_bound));
//! an answer at that deadline says "outcome unknown" too.
//!
//! The writer knows nothing of what a unit does: the idempotency ledger hands
//! it one unit per request exactly as it would run one transaction.
//!
//! The files, by part: `handle.rs` (the [`Writer`] callers share, and its
//! queue's end), `queue.rs` (a unit as the writer sees it, and its one
//! answer), `batch.rs` (the writer thread's loop and the group commit),
//! `fence.rs` (a batch's fate, decided once), `watchdog.rs` (the watchdog
//! and the replacement of a thread), `slot.rs` (the lazy start), and
//! `shared.rs` (what they share).

mod batch;
mod fence;
mod handle;
mod queue;
mod shared;
pub(crate) mod slot;
mod watchdog;

pub use batch::MAX_BATCH;
pub use handle::{DEFAULT_QUEUE_CAPACITY, Writer};
pub use shared::{WriterHealth, WriterStats};
pub use watchdog::{REOPEN_EVERY, WATCH_EVERY};
