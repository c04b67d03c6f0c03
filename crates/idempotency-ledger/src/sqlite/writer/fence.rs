//! A batch's fence: its fate, decided once, by whichever of the writer
//! thread and the watchdog gets there first.

use std::sync::atomic::{AtomicU8, Ordering};

/// Where a batch is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Fate {
    /// Its units run.
    Running = 0,
    /// Its `COMMIT` runs.
    Committing = 1,
    /// Its `COMMIT` returned, and nobody gave up on it meanwhile.
    Committed = 2,
    /// The watchdog gave up on it: its callers were answered, and it never
    /// commits (or, given up on in its `COMMIT`, its outcome is unknown).
    Abandoned = 3,
}

/// A batch's [`Fate`], moved only by its transitions: the writer thread's
/// (running → committing right before `COMMIT`, committing → committed once
/// it returned) and the watchdog's (running or committing → abandoned).
/// Each is one compare-and-swap, so exactly one side decides.
#[derive(Debug)]
pub(crate) struct Fence(AtomicU8);

impl Fence {
    /// A batch that has just begun.
    pub(crate) fn running() -> Self {
        Self(AtomicU8::new(Fate::Running as u8))
    }

    /// The writer thread, right before `COMMIT`: `false` when the batch
    /// was abandoned (it must roll back).
    pub(crate) fn commit(&self) -> bool {
        self.moves(Fate::Running, Fate::Committing)
    }

    /// The writer thread, once `COMMIT` returned: `false` when the batch
    /// was given up on meanwhile (its callers were answered already).
    pub(crate) fn committed(&self) -> bool {
        self.moves(Fate::Committing, Fate::Committed)
    }

    /// The watchdog, past the lease: abandons a batch still running.
    pub(crate) fn abandon_running(&self) -> bool {
        self.moves(Fate::Running, Fate::Abandoned)
    }

    /// The watchdog, past the lease plus the commit grace: gives up on a
    /// batch still in its `COMMIT`.
    pub(crate) fn give_up_committing(&self) -> bool {
        self.moves(Fate::Committing, Fate::Abandoned)
    }

    /// Whether the watchdog gave the batch up.
    pub(crate) fn is_abandoned(&self) -> bool {
        self.0.load(Ordering::SeqCst) == Fate::Abandoned as u8
    }

    fn moves(&self, from: Fate, to: Fate) -> bool {
        self.0
            .compare_exchange(from as u8, to as u8, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_abandoned_while_running_never_commits_and_one_committing_cannot_be_abandoned_as_running()
     {
        let fence = Fence::running();
        assert!(fence.abandon_running());
        assert!(fence.is_abandoned());
        assert!(!fence.commit(), "an abandoned batch rolls back");

        let fence = Fence::running();
        assert!(fence.commit());
        assert!(!fence.abandon_running(), "it is committing, not running");
        assert!(fence.give_up_committing());
        assert!(!fence.committed(), "given up on during its COMMIT");

        let fence = Fence::running();
        assert!(fence.commit() && fence.committed());
        assert!(!fence.give_up_committing() && !fence.is_abandoned());
    }
}
