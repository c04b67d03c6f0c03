//! Admission at the door: how many mutations one process runs or lets wait
//! at once, and how many database connections they may hold.
//!
//! A mutation is admitted (or refused) before it takes a blocking thread or
//! a database connection: past the bound it is answered `503
//! SERVICE_UNAVAILABLE` with `Retry-After` at once, and its key was never
//! touched. An admitted one keeps its slot until its blocking work is over
//! (the slot travels into that work, so a client that hangs up does not
//! free it early).
//!
//! Reads are never admitted and never wait behind writes:
//!
//! - blocking threads: each worker has [`READ_BLOCKING_THREADS`] more than
//!   the whole process admits writes, so even with every admitted write on
//!   one worker, reads find threads of their own;
//! - connections (PostgreSQL, where reads and writes share one pool): the
//!   admitted writes hold at most [`WriteConnections`] of them at once,
//!   [`READ_RESERVE`] of the pool fewer than its size. (On SQLite writes go
//!   through the one writer and reads have a pool of their own.)

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// The default of `WRITE_ADMISSION`: mutations admitted at once per process.
pub const DEFAULT_WRITE_ADMISSION: u32 = 64;
/// Blocking threads of each worker beyond the writes admitted, for reads
/// (and token lookups).
pub const READ_BLOCKING_THREADS: usize = 32;
/// PostgreSQL: the share of the pool (one in this many connections, at
/// least one) that admitted writes never hold, so reads always find one.
pub const READ_RESERVE: u32 = 4;

/// The count of admitted mutations, shared by every worker of a process.
#[derive(Debug)]
pub struct Admission {
    admitted: Arc<AtomicUsize>,
    bound: usize,
}

/// One admitted mutation's slot; dropping it frees the slot.
#[derive(Debug)]
pub struct Admitted {
    admitted: Arc<AtomicUsize>,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.admitted.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Admission {
    pub fn new(bound: u32) -> Self {
        Self {
            admitted: Arc::default(),
            bound: usize::try_from(bound).unwrap_or(usize::MAX).max(1),
        }
    }

    /// The bound.
    pub fn bound(&self) -> usize {
        self.bound
    }

    /// Mutations admitted now.
    pub fn admitted(&self) -> usize {
        self.admitted.load(Ordering::SeqCst)
    }

    /// A slot, or `None` at once when all are taken.
    pub fn try_admit(&self) -> Option<Admitted> {
        self.admitted
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < self.bound).then_some(n + 1)
            })
            .ok()?;
        Some(Admitted {
            admitted: Arc::clone(&self.admitted),
        })
    }
}

/// PostgreSQL: how many database connections admitted writes hold at once
/// (a counting semaphore, waited for on the write's blocking thread).
#[derive(Debug)]
pub struct WriteConnections {
    state: Arc<(Mutex<usize>, Condvar)>,
    limit: usize,
}

/// The right to hold one write connection; dropping it passes it on.
#[derive(Debug)]
pub struct WriteConnection {
    state: Arc<(Mutex<usize>, Condvar)>,
}

impl Drop for WriteConnection {
    fn drop(&mut self) {
        let (held, freed) = &*self.state;
        if let Ok(mut held) = held.lock() {
            *held = held.saturating_sub(1);
        }
        freed.notify_one();
    }
}

impl WriteConnections {
    /// For a pool of `pool_size`: all but its read reserve.
    pub fn for_pool(pool_size: u32) -> Self {
        let reserve = pool_size.div_ceil(READ_RESERVE).max(1);
        let limit = pool_size.saturating_sub(reserve).max(1);
        Self {
            state: Arc::default(),
            limit: usize::try_from(limit).unwrap_or(usize::MAX),
        }
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Waits at most `timeout` for the right to hold a connection; `None`
    /// when none came free (answered like a pool that has none: `503`).
    pub fn acquire(&self, timeout: Duration) -> Option<WriteConnection> {
        let (held, freed) = &*self.state;
        let deadline = Instant::now() + timeout;
        let mut count = held.lock().ok()?;
        while *count >= self.limit {
            let left = deadline.checked_duration_since(Instant::now())?;
            count = freed.wait_timeout(count, left).ok()?.0;
        }
        *count += 1;
        Some(WriteConnection {
            state: Arc::clone(&self.state),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn past_the_bound_nothing_is_admitted_until_a_slot_is_freed() {
        let admission = Admission::new(2);
        let first = admission.try_admit();
        let second = admission.try_admit();
        assert!(first.is_some() && second.is_some());
        assert!(admission.try_admit().is_none());
        drop(first);
        assert!(admission.try_admit().is_some());
    }

    #[test]
    fn writes_leave_a_quarter_of_the_pool_to_reads() {
        assert_eq!(WriteConnections::for_pool(10).limit(), 7);
        assert_eq!(WriteConnections::for_pool(8).limit(), 6);
        assert_eq!(WriteConnections::for_pool(1).limit(), 1);
        let connections = WriteConnections::for_pool(2);
        let held = connections.acquire(Duration::ZERO);
        assert!(held.is_some());
        assert!(connections.acquire(Duration::from_millis(1)).is_none());
        drop(held);
        assert!(connections.acquire(Duration::ZERO).is_some());
    }
}
