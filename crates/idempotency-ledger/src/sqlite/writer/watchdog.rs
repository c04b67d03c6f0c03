//! The watchdog, and the writer thread's replacement: a batch past its
//! lease is abandoned, one stuck in `COMMIT` given up on, a dead thread
//! replaced, and a writer that cannot write for too long gives up.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use diesel::SqliteConnection;

use super::batch::writer_loop;
use super::shared::{Shared, Watch, WriterConnection, locked};
use crate::conn::{WriteError, write_bound};

/// How often the watchdog looks for a batch past its lease or a dead writer.
pub const WATCH_EVERY: Duration = Duration::from_millis(50);
/// How often a replacement thread that cannot open its connection tries again.
pub const REOPEN_EVERY: Duration = Duration::from_millis(500);

/// The watchdog: abandons a batch past its lease, gives up on one stuck in
/// `COMMIT`, replaces a writer thread that was given up on or died, and
/// gives up on the writer when writing stays impossible. Ends when the
/// handle goes. It never touches the database.
pub(crate) fn watch(shared: &Arc<Shared>) {
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
            replace_dead(shared, generation);
        } else if let Some((watch, why)) = overdue(shared, generation) {
            replace_overdue(shared, generation, watch, why);
        }
        stalled = look_at_health(shared, stalled);
    }
}

/// A writer thread that died: replaced, its batch's callers answered.
fn replace_dead(shared: &Arc<Shared>, generation: u64) {
    tracing::error!("the writer thread died; replaced");
    metrics::counter!("idempotency_ledger_writer_deaths_total").increment(1);
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

/// A batch given up on: its thread replaced, its callers answered.
fn replace_overdue(shared: &Arc<Shared>, generation: u64, watch: Watch, why: &str) {
    tracing::error!(
        lease_secs = shared.lease.as_secs(),
        units = watch.callers.len(),
        "a write batch {why}; writer replaced"
    );
    metrics::counter!("idempotency_ledger_write_batches_abandoned_total").increment(1);
    // The replacement first, so that a caller's retry finds it.
    replace(shared, generation);
    for caller in watch.callers {
        caller(WriteError::Unavailable(format!("the write batch {why}")));
    }
}

/// Logs when writing becomes impossible and possible again, and gives up
/// on the writer once it has been impossible for the lease plus the commit
/// grace; returns since when it has been impossible.
fn look_at_health(shared: &Shared, stalled: Option<Instant>) -> Option<Instant> {
    let bound = write_bound(shared.lease);
    match (shared.cannot_write(), stalled) {
        (None, None) => None,
        (None, Some(_)) => {
            tracing::info!("the writer can write again");
            None
        }
        (Some(why), None) => {
            tracing::error!(%why, "the writer cannot write; writes are answered 503 until it can");
            Some(Instant::now())
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
            Some(since)
        }
        (Some(_), since) => since,
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
    let why = if elapsed >= shared.lease && watch.fence.abandon_running() {
        "ran past the lease and was abandoned (rolled back)"
    } else if elapsed >= write_bound(shared.lease) && watch.fence.give_up_committing() {
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

/// Starts the writer thread of `generation`: on `conn`, or on a
/// connection it opens itself (a replacement).
pub(crate) fn spawn_writer(
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
