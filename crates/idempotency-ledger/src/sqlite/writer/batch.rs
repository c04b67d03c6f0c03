//! The writer thread's loop, and the group commit itself: a batch of
//! units in one transaction, each in its own savepoint, one `COMMIT`.

use std::sync::Arc;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::Instant;

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::query_builder::{AstPass, QueryFragment, QueryId};
use diesel::result::Error as DieselError;
use diesel::sqlite::{Sqlite, SqliteConnection};

use super::fence::Fence;
use super::queue::Job;
use super::shared::{Shared, Watch, locked};
use crate::conn::{Conn, WriteError};

/// The most units one transaction commits.
pub const MAX_BATCH: usize = 256;

/// The writer thread of `generation`: takes the first unit off the queue
/// and every one already waiting, runs them as one batch, and answers
/// them all after its `COMMIT`. Ends when it is replaced, or when every
/// handle is gone and the queue is empty.
pub(crate) fn writer_loop(mut conn: SqliteConnection, shared: &Shared, generation: u64) {
    while shared.generation.load(Ordering::SeqCst) == generation {
        let Some(mut batch) = next_batch(shared) else {
            return;
        };
        // Queued before the writer became unable to write: refused, not
        // left to wait for a lock that a thread given up on holds.
        if let Some(why) = shared.cannot_write() {
            let why = format!("the writer cannot write: {why}");
            batch
                .into_iter()
                .for_each(|job| job.finish(Err(WriteError::Unavailable(why.clone()))));
            continue;
        }
        let fence = Arc::new(Fence::running());
        let _leave = Leave {
            fence: &fence,
            hung: &shared.hung,
        };
        watch(shared, generation, &fence, &batch);
        let result = run_batch(&mut conn, &mut batch, &fence, shared);
        unwatch(shared, &fence);
        if fence.is_abandoned() {
            return; // the watchdog answered every caller; this thread's work is over
        }
        count(shared, &result, batch.len());
        for job in batch {
            job.finish(result.clone());
        }
    }
}

/// The next batch: blocks while the queue is idle; `None` once every
/// handle is gone and the queue is empty.
fn next_batch(shared: &Shared) -> Option<Vec<Box<dyn Job>>> {
    let jobs = locked(&shared.jobs);
    let first = jobs.recv().ok()?;
    let mut batch = Vec::with_capacity(MAX_BATCH.min(64));
    batch.push(first);
    while batch.len() < MAX_BATCH {
        match jobs.try_recv() {
            Ok(job) => batch.push(job),
            Err(_) => break,
        }
    }
    drop(jobs);
    shared
        .counters
        .queued
        .fetch_sub(batch.len(), Ordering::SeqCst);
    Some(batch)
}

/// Shows the batch to the watchdog, with a way to answer its callers.
fn watch(shared: &Shared, generation: u64, fence: &Arc<Fence>, batch: &[Box<dyn Job>]) {
    *locked(&shared.current) = Some(Watch {
        generation,
        started: Instant::now(),
        fence: Arc::clone(fence),
        callers: batch.iter().map(|job| job.answer_elsewhere()).collect(),
    });
}

/// The batch is over: the watchdog no longer watches it (unless it took
/// it already).
fn unwatch(shared: &Shared, fence: &Arc<Fence>) {
    let mut current = locked(&shared.current);
    if current
        .as_ref()
        .is_some_and(|w| Arc::ptr_eq(&w.fence, fence))
    {
        *current = None;
    }
}

/// Counts a batch that ended, committed or not.
fn count(shared: &Shared, result: &Result<(), WriteError>, units: usize) {
    if result.is_ok() {
        let counters = &shared.counters;
        counters.batches.fetch_add(1, Ordering::SeqCst);
        counters.units.fetch_add(units as u64, Ordering::SeqCst);
        metrics::counter!("idempotency_ledger_write_batches_total").increment(1);
        metrics::histogram!("idempotency_ledger_write_batch_units").record(units as f64);
    } else {
        metrics::counter!("idempotency_ledger_write_batches_failed_total").increment(1);
    }
}

/// Counts a thread given up on as returned when it leaves its batch, by
/// any way out (a panic included).
struct Leave<'a> {
    fence: &'a Fence,
    hung: &'a AtomicIsize,
}

impl Drop for Leave<'_> {
    fn drop(&mut self) {
        if self.fence.is_abandoned() {
            self.hung.fetch_sub(1, Ordering::SeqCst);
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

/// The group commit: one transaction for the whole batch, one savepoint
/// per unit, one `COMMIT`. `fence`
/// decides, right before `COMMIT`, whether the batch may commit at all, and
/// once `COMMIT` returns, whether the batch was given up on meanwhile.
fn run_batch(
    conn: &mut SqliteConnection,
    batch: &mut [Box<dyn Job>],
    fence: &Fence,
    shared: &Shared,
) -> Result<(), WriteError> {
    let unavailable = |e: DieselError| WriteError::Unavailable(e.to_string());
    let abandoned = || WriteError::Unavailable("the batch was abandoned".into());
    conn.batch_execute("BEGIN IMMEDIATE").map_err(unavailable)?;
    let ran = batch.iter_mut().try_for_each(|job| {
        if fence.is_abandoned() {
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
    let may_commit = || match fence.commit() {
        true => Ok(()),
        false => Err(DieselError::RollbackTransaction),
    };
    if let Err(e) = ran
        .and_then(|()| may_commit())
        .and_then(|()| commit(conn, shared))
    {
        // Harmless when the transaction is already gone.
        let _ = conn.batch_execute("ROLLBACK");
        return Err(if fence.is_abandoned() {
            abandoned()
        } else {
            unavailable(e)
        });
    }
    // Committed; its callers were answered already if the watchdog gave the
    // batch up while `COMMIT` ran.
    match fence.committed() {
        true => Ok(()),
        false => Err(abandoned()),
    }
}

#[cfg_attr(not(feature = "fault-points"), allow(unused_variables))]
fn commit(conn: &mut SqliteConnection, shared: &Shared) -> Result<(), DieselError> {
    #[cfg(feature = "fault-points")]
    if crate::fault::pass_blocking(crate::fault::Point::BeforeCommit, &shared.file).is_err() {
        return Err(DieselError::RollbackTransaction);
    }
    conn.batch_execute("COMMIT")
}
