//! Write admission: how many units of writing one process runs or lets
//! wait at once, and how many database connections they may hold.
//!
//! A request is admitted only once the ledger knows it must write — after
//! its key's in-flight wait and after the read that answers replays and
//! refusals — so neither a duplicate waiting for its key nor a replay ever
//! takes a slot. Past the bound a write is refused at once
//! ([`LedgerError::Overloaded`](crate::LedgerError::Overloaded)), before it
//! takes a database connection or a thread, and its key is left free: while
//! every slot is taken ([`Admission::is_full`]) a request is refused on
//! arrival, before its read, so that shedding costs no thread, no
//! connection and no wait for either — a replay included, whose retry
//! replays once a slot is free.
//!
//! On PostgreSQL the admitted writes also share out the pool's connections
//! (`pg/share.rs`); on SQLite writes go through the one writer and reads
//! have a pool of their own.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The default bound of write admission: units admitted at once per process.
pub const DEFAULT_WRITE_ADMISSION: u32 = 64;

/// The count of admitted writes, shared by every worker of a process.
#[derive(Debug)]
pub struct Admission {
    admitted: Arc<AtomicUsize>,
    bound: usize,
}

/// One admitted write's slot; dropping it frees the slot.
#[derive(Debug)]
pub(crate) struct Admitted {
    admitted: Arc<AtomicUsize>,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.admitted.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Admission {
    /// Admits at most `bound` writes at once (at least one).
    pub(crate) fn new(bound: u32) -> Self {
        Self {
            admitted: Arc::default(),
            bound: usize::try_from(bound).unwrap_or(usize::MAX).max(1),
        }
    }

    /// The bound.
    pub fn bound(&self) -> usize {
        self.bound
    }

    /// Writes admitted now.
    pub fn admitted(&self) -> usize {
        self.admitted.load(Ordering::SeqCst)
    }

    /// Whether every slot is taken now (a request arriving now would be
    /// refused a slot).
    pub fn is_full(&self) -> bool {
        self.admitted() >= self.bound
    }

    /// A slot, or `None` at once when all are taken.
    pub(crate) fn try_admit(&self) -> Option<Admitted> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn past_the_bound_nothing_is_admitted_until_a_slot_is_freed() {
        let admission = Admission::new(2);
        assert_eq!(admission.bound(), 2);
        let first = admission.try_admit();
        let second = admission.try_admit();
        assert!(first.is_some() && second.is_some());
        assert_eq!(admission.admitted(), 2);
        assert!(admission.is_full());
        assert!(admission.try_admit().is_none());
        assert_eq!(admission.admitted(), 2, "a refusal takes no slot");
        drop(first);
        assert_eq!(admission.admitted(), 1, "a dropped slot is freed");
        assert!(!admission.is_full());
        assert!(admission.try_admit().is_some());
    }

    #[test]
    fn a_bound_of_zero_still_admits_one_write() {
        let admission = Admission::new(0);
        assert_eq!(admission.bound(), 1);
        let only = admission.try_admit();
        assert!(only.is_some());
        assert!(admission.try_admit().is_none());
    }
}
