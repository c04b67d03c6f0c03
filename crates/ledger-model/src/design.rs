//! What is checked: a design (the protocol as built, or a known wrong
//! one) within bounds on everything the checker may do.

/// The design checked: the correct one, or one of the known wrong ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Design {
    /// The protocol as built: record last, in the change's transaction.
    Correct,
    /// The key is claimed by a committed row before the change runs, and
    /// the claim has no lease: a holder that dies leaves it claimed forever.
    ClaimFirstWithoutLease,
    /// `orders` has no `UNIQUE (user_id, idempotency_key)`: once the purge
    /// deleted the key's entry, a retried create runs again.
    NoUniqueColumn,
    /// The change commits in its own transaction and the entry is recorded
    /// after it: between the two, a change without its answer.
    RecordOutsideTransaction,
    /// A replay does not compare the fingerprint: another body under a used
    /// key gets the first one's answer.
    ReplaySkipsFingerprint,
    /// The write admission slot is taken on arrival, before the in-flight
    /// wait, and held to the answer: while waiting in the process, and
    /// while pausing between looks at a key another process holds.
    PermitHeldWhileWaiting,
    /// The `201` leaves before `COMMIT` returns: a commit that then fails
    /// leaves an answer for a change that never happened.
    AnswerBeforeCommit,
}

impl Design {
    /// Every known wrong design.
    pub const MUTANTS: [Design; 6] = [
        Design::ClaimFirstWithoutLease,
        Design::NoUniqueColumn,
        Design::RecordOutsideTransaction,
        Design::ReplaySkipsFingerprint,
        Design::PermitHeldWhileWaiting,
        Design::AnswerBeforeCommit,
    ];

    /// `orders` carries `UNIQUE (user_id, idempotency_key)`.
    pub fn has_unique_column(self) -> bool {
        self != Design::NoUniqueColumn
    }
}

/// How far the checker looks: every count is a budget the model spends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Bounds {
    /// Clients sharing the key (client 0 sends body A; each other client A
    /// or B, both explored; past 32 the others all send A).
    pub clients: u8,
    /// Attempts per client.
    pub attempts: u8,
    /// Server processes, sharing one database.
    pub processes: u8,
    /// Processes killed.
    pub crashes: u8,
    /// Connections lost (before a statement runs, or its acknowledgement).
    pub losses: u8,
    /// Holders that hang past their lease.
    pub hangs: u8,
    /// Purges at retention.
    pub purges: u8,
    /// Write admission slots per process.
    pub admission: u8,
    /// Requests that may wait for a key's holder, per process.
    pub waiters: u8,
    /// Looks again at a key another process's unit holds, before the wait
    /// bound answers `409 IN_PROGRESS`.
    pub polls: u8,
    /// Creates try the one-statement form first (PostgreSQL).
    pub one_statement: bool,
}

impl Default for Bounds {
    fn default() -> Self {
        Self {
            clients: 2,
            attempts: 2,
            processes: 2,
            crashes: 1,
            losses: 1,
            hangs: 1,
            purges: 1,
            admission: 1,
            waiters: 1,
            polls: 1,
            one_statement: true,
        }
    }
}

/// The model: a design and the bounds it is checked within.
#[derive(Clone, Copy, Debug)]
pub struct LedgerModel {
    pub design: Design,
    pub bounds: Bounds,
}

impl LedgerModel {
    pub fn new(design: Design, bounds: Bounds) -> Self {
        Self { design, bounds }
    }
}
