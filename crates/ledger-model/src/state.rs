//! What the system is made of, and its state: clients, the requests inside
//! the server processes, the database, and what a dead process left behind.
//! Plain data and the questions asked of it: the steps that change it are
//! the model's, the promises it is judged by the properties'.

use stateright::semantics::LinearizabilityTester;

use crate::design::Bounds;
use crate::spec::{Answer, Body, KeyAnswer, ReqId};

/// Where a request is in `Ledger::execute` (`docs/MODEL.md` maps each step
/// to the code).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Pc {
    /// In its process's in-flight registry, waiting for the request of this
    /// process that holds the key. Holds nothing (unless
    /// [`Design::PermitHeldWhileWaiting`](crate::design::Design::PermitHeldWhileWaiting)).
    Waiting,
    /// Holds the key in this process; next: the read of the key's entry,
    /// then admission (a write slot) when the key has none.
    Reading,
    /// [`Design::ClaimFirstWithoutLease`](crate::design::Design::ClaimFirstWithoutLease):
    /// admitted; next: commit a claim.
    Claiming,
    /// Admitted; the one-statement create is sent, and the database runs
    /// it: it writes (and goes on to its commit, `Committing`) or writes
    /// nothing (the general way).
    Statement,
    /// Admitted; next: `BEGIN` and a try of the key's lock.
    Locking,
    /// Holds the key's lock; next: the change (the order's `INSERT`).
    Changing,
    /// Changed; next: the lease fence and the entry's record.
    Recording,
    /// `COMMIT` sent (or the one-statement create ending, which commits
    /// it); the database commits it, or the connection breaks.
    Committing,
    /// [`Design::RecordOutsideTransaction`](crate::design::Design::RecordOutsideTransaction):
    /// the change committed alone; next: the entry, in a statement of its
    /// own.
    RecordingAfter,
}

impl Pc {
    /// At most how many more steps a request takes from here (the answer
    /// included): every step lowers it, so no request loops.
    fn steps_left(self) -> u16 {
        match self {
            Pc::Waiting => 10,
            Pc::Reading => 9,
            Pc::Claiming => 8,
            Pc::Statement => 7,
            Pc::Locking => 6,
            Pc::Changing => 5,
            Pc::Recording => 4,
            Pc::Committing => 3,
            Pc::RecordingAfter => 2,
        }
    }
}

/// A transaction's uncommitted writes (the unit of writing): what vanishes
/// when it rolls back or its process dies.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Tx {
    /// The key's advisory lock (`pg_try_advisory_xact_lock`), held until
    /// the transaction ends.
    pub lock: bool,
    /// The request's order row.
    pub order: bool,
    /// The key's ledger entry (or, claim-first, the claim's completion).
    pub entry: bool,
}

/// A request inside a server process.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Req {
    pub id: ReqId,
    pub process: u8,
    pub pc: Pc,
    /// Holds one of its process's write admission slots.
    pub permit: bool,
    /// Looks left at a key another process's unit holds before its wait
    /// bound: `409 IDEMPOTENCY_IN_PROGRESS` after the last.
    pub polls: u8,
    /// Its lease ran out (a holder that hung): waited for no longer in its
    /// process, and fenced off from recording.
    pub expired: bool,
    /// The one-statement create was tried (once per request).
    pub tried_statement: bool,
    pub tx: Tx,
}

/// A client: one body, sent with the key until it is answered, at most
/// [`Bounds::attempts`] times. It retries after `409 IN_PROGRESS`, `503`
/// and a broken connection, and it may stop waiting for an answer and
/// retry while its earlier request still runs (a client-side timeout).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Client {
    pub body: Body,
    /// Attempts sent so far.
    pub sent: u8,
    /// The attempt it is waiting for.
    pub waiting: Option<u8>,
    /// It heard a final answer (2xx or `409 KEY_REUSED`).
    pub settled: bool,
}

/// A ledger row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Entry {
    /// A completed entry: the request's body (fingerprint) and its answer,
    /// the `201` with the order it made.
    Recorded { body: Body, order: ReqId },
    /// [`Design::ClaimFirstWithoutLease`](crate::design::Design::ClaimFirstWithoutLease):
    /// a claim committed before the change, naming the request that owns
    /// it.
    Claimed { body: Body, owner: ReqId },
}

/// What the database holds, committed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Db {
    /// The key's orders, in commit order (`UNIQUE (user_id,
    /// idempotency_key)` keeps it to one, where the design has it).
    pub orders: Vec<ReqId>,
    /// The key's ledger entry.
    pub entry: Option<Entry>,
    /// The purge deleted the key's entry (a ghost: for the properties).
    pub purged: bool,
}

/// A statement a process sent whole before it died: the database finishes
/// it alone (or drops it, when the connection broke before it arrived).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Orphan {
    /// A unit's `COMMIT`, with the unit's writes (it holds the key's lock).
    Commit { id: ReqId, order: bool, entry: bool },
    /// A one-statement create.
    Statement { id: ReqId },
}

/// What a request was answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reply {
    /// `201` with the order this request made.
    Created(ReqId),
    /// `200`, `Idempotent-Replayed: true`, with this order: a recorded
    /// `201` replayed byte for byte, or the order found by its key.
    Replayed(ReqId),
    /// `409 IDEMPOTENCY_KEY_REUSED_WITH_DIFFERENT_PAYLOAD`.
    KeyReused,
    /// `409 IDEMPOTENCY_IN_PROGRESS`.
    InProgress,
    /// `503` with `Retry-After`.
    Unavailable,
    /// The connection broke: its process died.
    Reset,
}

impl Reply {
    /// The order a 2xx carries.
    pub fn order(self) -> Option<ReqId> {
        match self {
            Reply::Created(o) | Reply::Replayed(o) => Some(o),
            _ => None,
        }
    }

    /// A client does not retry after it.
    pub(crate) fn is_final(self) -> bool {
        matches!(
            self,
            Reply::Created(_) | Reply::Replayed(_) | Reply::KeyReused
        )
    }

    /// What it decides, for the linearizability check; `None` for an
    /// answer whose outcome is unknown.
    pub(crate) fn answer(self) -> Option<Answer> {
        match self {
            Reply::Created(o) => Some(Answer::Created(o)),
            Reply::Replayed(o) => Some(Answer::Replayed(o)),
            Reply::KeyReused => Some(Answer::KeyReused),
            Reply::InProgress => Some(Answer::InProgress),
            Reply::Unavailable | Reply::Reset => None,
        }
    }
}

/// What the faults and timers may still do (ordered field by field, for
/// `State::fuel`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Budget {
    pub crashes: u8,
    pub hangs: u8,
    pub losses: u8,
    pub purges: u8,
}

/// The whole system: one user, one key.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    pub clients: Vec<Client>,
    /// Requests inside the processes, by id.
    pub reqs: Vec<Req>,
    /// Per process: the request holding the key in its in-flight registry.
    pub slots: Vec<Option<ReqId>>,
    pub db: Db,
    pub orphans: Vec<Orphan>,
    pub budget: Budget,
    /// Every answer the server sent, in order.
    pub replies: Vec<(ReqId, Reply)>,
    /// The same answers, as a concurrent history of the key's register.
    pub history: LinearizabilityTester<ReqId, KeyAnswer>,
    /// `history` is linearizable: computed when an answer is added to it
    /// (a request only invoked can always be left out, so an invocation
    /// never changes it).
    pub linearizable: bool,
}

impl State {
    pub(crate) fn req(&self, id: ReqId) -> Option<&Req> {
        self.reqs.iter().find(|r| r.id == id)
    }

    pub(crate) fn index(&self, id: ReqId) -> Option<usize> {
        self.reqs.iter().position(|r| r.id == id)
    }

    /// The body a request (and the order it made) carries.
    pub fn body_of(&self, id: ReqId) -> Body {
        self.clients
            .get(usize::from(id.client))
            .map_or(Body::A, |c| c.body)
    }

    pub(crate) fn permits(&self, process: u8) -> usize {
        self.reqs
            .iter()
            .filter(|r| r.process == process && r.permit)
            .count()
    }

    pub(crate) fn waiters(&self, process: u8) -> usize {
        self.reqs
            .iter()
            .filter(|r| r.process == process && r.pc == Pc::Waiting)
            .count()
    }

    /// The process's in-flight slot for the key is free, or its holder is
    /// past its lease (a waiter waits for it no longer).
    pub(crate) fn slot_open(&self, process: u8) -> bool {
        match self.slots.get(usize::from(process)).copied().flatten() {
            None => true,
            Some(holder) => self.req(holder).is_none_or(|h| h.expired),
        }
    }

    /// Another transaction (a live unit, or a dead process's `COMMIT` the
    /// database has) holds the key's advisory lock.
    pub(crate) fn locked_by_other(&self, me: ReqId) -> bool {
        self.reqs.iter().any(|r| r.id != me && r.tx.lock)
            || self
                .orphans
                .iter()
                .any(|o| matches!(o, Orphan::Commit { .. }))
    }

    /// Another open transaction has an uncommitted order row for the key:
    /// an `INSERT` into the `UNIQUE` column waits for it.
    pub(crate) fn order_pending_elsewhere(&self, me: ReqId) -> bool {
        self.reqs.iter().any(|r| r.id != me && r.tx.order)
            || self
                .orphans
                .iter()
                .any(|o| matches!(o, Orphan::Commit { order: true, .. }))
    }

    /// Another open transaction has an uncommitted entry for the key.
    pub(crate) fn entry_pending_elsewhere(&self, me: ReqId) -> bool {
        self.reqs.iter().any(|r| r.id != me && r.tx.entry)
            || self
                .orphans
                .iter()
                .any(|o| matches!(o, Orphan::Commit { entry: true, .. }))
    }

    /// Every client has its last answer (or gave up) and no request is left
    /// in any process.
    pub fn all_answered(&self, bounds: &Bounds) -> bool {
        self.reqs.is_empty()
            && self
                .clients
                .iter()
                .all(|c| c.waiting.is_none() && (c.settled || c.sent >= bounds.attempts))
    }

    /// Nothing holds the key: no in-flight slot, no lock, no claim, nothing
    /// a dead process left in the database.
    pub fn key_free(&self) -> bool {
        self.slots.iter().all(Option::is_none)
            && self.orphans.is_empty()
            && !self.reqs.iter().any(|r| r.tx.lock)
            && !matches!(self.db.entry, Some(Entry::Claimed { .. }))
    }

    /// A measure every step lowers (lexicographically): the budgets, the
    /// attempts left, the clients waiting, the looks left, the orphans,
    /// then the requests' steps left. The graph of states is therefore
    /// acyclic and every path ends, which makes the `eventually`
    /// properties exact (Stateright checks them on terminal states).
    pub(crate) fn fuel(&self, bounds: &Bounds) -> (Budget, u16, u16, u16, u16, u16) {
        let sum = |f: &dyn Fn(&Req) -> u16| self.reqs.iter().map(f).sum::<u16>();
        (
            self.budget,
            self.clients
                .iter()
                .map(|c| u16::from(bounds.attempts.saturating_sub(c.sent)))
                .sum(),
            self.clients.iter().filter(|c| c.waiting.is_some()).count() as u16,
            sum(&|r| u16::from(r.polls)),
            self.orphans.len() as u16,
            sum(&|r| r.pc.steps_left()),
        )
    }
}
