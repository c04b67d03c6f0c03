//! The protocol as a state machine: clients, server processes, the
//! database, and the steps of `Ledger::execute` between them.
//!
//! Every step is one atomic action of the checker, taken in any order the
//! state allows. A step groups only what no other actor can observe in
//! between (a process's in-memory checks, or one database statement and the
//! process receiving its result); each step that touches the database is
//! its own action, so a crash, a lost connection or another request can
//! come between any two of them.

use stateright::semantics::{ConsistencyTester, LinearizabilityTester};
use stateright::{Model, Property};

use crate::design::{Design, LedgerModel};
use crate::properties;
use crate::spec::{Body, Create, KeyAnswer, ReqId};
use crate::state::{Budget, Client, Db, Entry, Orphan, Pc, Reply, Req, State, Tx};

/// How a statement's round trip ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Net {
    /// The database ran it and the process heard back.
    Acked,
    /// The database ran it (committed) and the connection broke before
    /// the acknowledgement came back: `503`, outcome unknown.
    AckLost,
    /// The connection broke before the database ran it: `503`.
    Lost,
}

/// One step of the system.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// A client sends its next attempt to a process, which enters the key in
    /// its in-flight registry. A client still waiting for its earlier
    /// attempt stops waiting for it (its own timeout; the request runs on)
    /// and retries.
    Send { client: u8, process: u8 },
    /// A waiter's holder ended (or its lease ran out): it takes the key.
    Wake(ReqId),
    /// A waiter's wait bound passed: `409 IN_PROGRESS`.
    WaitBound(ReqId),
    /// The read, and admission when there is no entry.
    Read(ReqId),
    /// Claim-first: the claim's own committed `INSERT`.
    Claim(ReqId),
    /// The database runs the one-statement create (`Acked`: it ran, up to
    /// its commit; `Lost`: the connection broke before it ran).
    Statement(ReqId, Net),
    /// `BEGIN`; try the key's lock.
    Lock(ReqId),
    /// The change: the order's `INSERT … ON CONFLICT DO NOTHING`.
    Change(ReqId),
    /// The lease fence, then the entry's `INSERT … ON CONFLICT DO NOTHING`.
    Record(ReqId),
    /// `COMMIT`.
    Commit(ReqId, Net),
    /// Record-outside-the-transaction: the entry after the change committed.
    RecordAfter(ReqId),
    /// A holder hangs past its lease.
    LeaseRunsOut(ReqId),
    /// A process is killed (and started again, empty).
    Crash { process: u8 },
    /// The database finishes (or drops) what a dead process had sent.
    Orphan { index: u8, runs: bool },
    /// Retention passes and the purge deletes the key's entry.
    Purge,
}

/// What the one-statement create does when the database runs it now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum StatementRun {
    /// Waits for another transaction's uncommitted row.
    Blocked,
    /// Writes nothing: the key is locked, its order exists, or its entry
    /// does (the statement fails whole).
    Nothing,
    /// Writes and commits the order and the entry.
    Writes,
}

/// The state with its processes renamed into a canonical order (by the
/// requests each runs, then its in-flight slot): processes are
/// interchangeable, so states that differ only by their names are one
/// (Stateright's symmetry reduction). Two processes that sort alike run no
/// request and hold no slot, so they are alike: the order is exact.
pub fn representative(s: &State) -> State {
    let key = |p: usize| {
        let ids: Vec<ReqId> = s
            .reqs
            .iter()
            .filter(|r| usize::from(r.process) == p)
            .map(|r| r.id)
            .collect();
        (ids, s.slots.get(p).copied().flatten())
    };
    let mut order: Vec<usize> = (0..s.slots.len()).collect();
    order.sort_by_key(|&p| key(p));
    if order.iter().enumerate().all(|(new, &old)| new == old) {
        return s.clone();
    }
    let mut renamed = vec![0u8; order.len()];
    for (new, &old) in (0u8..).zip(&order) {
        if let Some(slot) = renamed.get_mut(old) {
            *slot = new;
        }
    }
    let mut t = s.clone();
    for r in &mut t.reqs {
        r.process = renamed
            .get(usize::from(r.process))
            .copied()
            .unwrap_or(r.process);
    }
    t.slots = order
        .iter()
        .map(|&old| s.slots.get(old).copied().flatten())
        .collect();
    t
}

impl LedgerModel {
    /// The decision for an existing entry (`decide`): a replay when the
    /// fingerprint matches, a refusal otherwise.
    fn decide(&self, entry: Entry, body: Body) -> Reply {
        let same = |b: Body| b == body || self.design == Design::ReplaySkipsFingerprint;
        match entry {
            Entry::Recorded { body: b, order } if same(b) => Reply::Replayed(order),
            Entry::Claimed { body: b, .. } if same(b) => Reply::InProgress,
            _ => Reply::KeyReused,
        }
    }

    /// What the one-statement create does if the database runs it now:
    /// `WITH held AS (SELECT 1 WHERE pg_try_advisory_xact_lock(…)), change
    /// AS (INSERT INTO orders … FROM held ON CONFLICT DO NOTHING), entry AS
    /// (INSERT INTO idempotency_ledger … FROM change)`.
    fn statement_run(&self, s: &State, me: ReqId) -> StatementRun {
        if s.locked_by_other(me) {
            return StatementRun::Nothing;
        }
        if self.design.has_unique_column() {
            if s.order_pending_elsewhere(me) {
                return StatementRun::Blocked;
            }
            if !s.db.orders.is_empty() {
                return StatementRun::Nothing;
            }
        }
        if s.entry_pending_elsewhere(me) {
            return StatementRun::Blocked;
        }
        if s.db.entry.is_some() {
            // No `ON CONFLICT` on the entry: a unique violation, and
            // nothing of the statement persists.
            return StatementRun::Nothing;
        }
        StatementRun::Writes
    }

    /// The committed writes of `id`'s transaction.
    fn apply(&self, s: &mut State, id: ReqId, order: bool, entry: bool) {
        if order {
            s.db.orders.push(id);
        }
        if entry {
            s.db.entry = Some(Entry::Recorded {
                body: s.body_of(id),
                order: id,
            });
        }
    }

    /// Sends `reply` for the request at `index`: its transaction (if any)
    /// is rolled back, its permit and in-flight slot released.
    fn answer(&self, s: &mut State, index: usize, reply: Reply) {
        let req = s.reqs.remove(index);
        if let Some(slot) = s.slots.get_mut(usize::from(req.process))
            && *slot == Some(req.id)
        {
            *slot = None;
        }
        if reply == Reply::Unavailable
            && matches!(s.db.entry, Some(Entry::Claimed { owner, .. }) if owner == req.id)
        {
            // Claim-first deletes its claim when it fails.
            s.db.entry = None;
        }
        self.deliver(s, req.id, reply);
    }

    /// The answer reaches the history, and the client if it still waits.
    fn deliver(&self, s: &mut State, id: ReqId, reply: Reply) {
        s.replies.push((id, reply));
        if let Some(answer) = reply.answer() {
            let _ = s.history.on_return(id, answer);
            s.linearizable = s.history.serialized_history().is_some();
        }
        if let Some(client) = s.clients.get_mut(usize::from(id.client))
            && client.waiting == Some(id.attempt)
        {
            client.waiting = None;
            client.settled |= reply.is_final();
        }
    }

    fn send(&self, s: &mut State, client: u8, process: u8) {
        let Some(c) = s.clients.get_mut(usize::from(client)) else {
            return;
        };
        let id = ReqId {
            client,
            attempt: c.sent,
        };
        c.sent = c.sent.saturating_add(1);
        c.waiting = Some(id.attempt);
        let body = c.body;
        let _ = s.history.on_invoke(id, Create { body, order: id });
        let mut req = Req {
            id,
            process,
            pc: Pc::Reading,
            permit: false,
            polls: self.bounds.polls,
            expired: false,
            tried_statement: false,
            tx: Tx::default(),
        };
        // Every write slot of the process taken: `503` on arrival, before
        // the in-flight wait and the read, the key untouched (the shed).
        if s.permits(process) >= usize::from(self.bounds.admission) {
            self.deliver(s, id, Reply::Unavailable);
            return;
        }
        if self.design == Design::PermitHeldWhileWaiting {
            // The permit is taken on arrival, and kept through the wait.
            req.permit = true;
        }
        if s.slot_open(process) {
            if let Some(slot) = s.slots.get_mut(usize::from(process)) {
                *slot = Some(id);
            }
        } else if s.waiters(process) < usize::from(self.bounds.waiters) {
            req.pc = Pc::Waiting;
        } else {
            // Past the per-key waiter cap: answered at once.
            self.deliver(s, id, Reply::InProgress);
            return;
        }
        let at = s.reqs.partition_point(|r| r.id < id);
        s.reqs.insert(at, req);
    }

    fn read(&self, s: &mut State, i: usize) {
        let (id, process, permit) = (s.reqs[i].id, s.reqs[i].process, s.reqs[i].permit);
        if let Some(entry) = s.db.entry {
            let reply = self.decide(entry, s.body_of(id));
            return self.answer(s, i, reply);
        }
        if !permit {
            if s.permits(process) >= usize::from(self.bounds.admission) {
                // No write admission slot: 503 at once, the key left free.
                return self.answer(s, i, Reply::Unavailable);
            }
            s.reqs[i].permit = true;
        }
        let req = &mut s.reqs[i];
        req.pc = if self.design == Design::ClaimFirstWithoutLease {
            Pc::Claiming
        } else if self.bounds.one_statement && !req.tried_statement {
            req.tried_statement = true;
            Pc::Statement
        } else {
            Pc::Locking
        };
    }

    fn change(&self, s: &mut State, i: usize) {
        let id = s.reqs[i].id;
        let body = s.body_of(id);
        let existing = if self.design.has_unique_column() {
            s.db.orders.first().copied()
        } else {
            None
        };
        let Some(order) = existing else {
            let req = &mut s.reqs[i];
            req.tx.order = true;
            req.pc = Pc::Recording;
            return;
        };
        // The UNIQUE column refused the row: the key made an order before.
        // Its entry, when it has one, is the answer it recorded; otherwise
        // the order answers (same fingerprint on the row) or refuses.
        let reply = match s.db.entry {
            Some(entry @ Entry::Recorded { .. }) => self.decide(entry, body),
            _ if s.body_of(order) == body => Reply::Replayed(order),
            _ => Reply::KeyReused,
        };
        self.answer(s, i, reply);
    }

    fn record(&self, s: &mut State, i: usize) {
        let req = &s.reqs[i];
        let id = req.id;
        if req.expired {
            // The fence: past its lease a holder may not record.
            return self.answer(s, i, Reply::Unavailable);
        }
        if self.design == Design::RecordOutsideTransaction {
            let order = req.tx.order;
            self.apply(s, id, order, false);
            let req = &mut s.reqs[i];
            req.tx = Tx::default();
            req.pc = Pc::RecordingAfter;
            return;
        }
        match s.db.entry {
            Some(Entry::Claimed { owner, .. }) if owner == id => {}
            Some(entry) => {
                // Recorded by another request since the read: roll back
                // the change; that entry answers.
                let reply = self.decide(entry, s.body_of(id));
                return self.answer(s, i, reply);
            }
            None => {}
        }
        let req = &mut s.reqs[i];
        req.tx.entry = true;
        req.pc = Pc::Committing;
        if self.design == Design::AnswerBeforeCommit {
            self.deliver(s, id, Reply::Created(id));
        }
    }

    fn crash(&self, s: &mut State, process: u8) {
        s.budget.crashes = s.budget.crashes.saturating_sub(1);
        let (dying, living): (Vec<Req>, Vec<Req>) =
            s.reqs.drain(..).partition(|r| r.process == process);
        s.reqs = living;
        for r in dying {
            match r.pc {
                Pc::Committing => s.orphans.push(Orphan::Commit {
                    id: r.id,
                    order: r.tx.order,
                    entry: r.tx.entry,
                }),
                Pc::Statement => s.orphans.push(Orphan::Statement { id: r.id }),
                _ => {}
            }
            self.deliver(s, r.id, Reply::Reset);
        }
        if let Some(slot) = s.slots.get_mut(usize::from(process)) {
            *slot = None;
        }
    }
}

impl Model for LedgerModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let others = self.bounds.clients.saturating_sub(1);
        (0..1u32.checked_shl(u32::from(others)).unwrap_or(1))
            .map(|choice| {
                let clients = (0..self.bounds.clients)
                    .map(|c| Client {
                        // Client 0 sends body A; each other client sends A
                        // (a duplicate) or B (the key reused) by choice.
                        body: if c > 0 && choice.checked_shr(u32::from(c - 1)).unwrap_or(0) & 1 != 0
                        {
                            Body::B
                        } else {
                            Body::A
                        },
                        sent: 0,
                        waiting: None,
                        settled: false,
                    })
                    .collect();
                State {
                    clients,
                    reqs: Vec::new(),
                    slots: vec![None; usize::from(self.bounds.processes)],
                    db: Db::default(),
                    orphans: Vec::new(),
                    budget: Budget {
                        crashes: self.bounds.crashes,
                        hangs: self.bounds.hangs,
                        losses: self.bounds.losses,
                        purges: self.bounds.purges,
                    },
                    replies: Vec::new(),
                    history: LinearizabilityTester::new(KeyAnswer::default()),
                    linearizable: true,
                }
            })
            .collect()
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        for (client, c) in (0u8..).zip(&s.clients) {
            if !c.settled && c.sent < self.bounds.attempts {
                for process in 0..self.bounds.processes {
                    actions.push(Action::Send { client, process });
                }
            }
        }
        let losses = s.budget.losses > 0;
        for r in &s.reqs {
            let id = r.id;
            match r.pc {
                Pc::Waiting => {
                    if s.slot_open(r.process) {
                        actions.push(Action::Wake(id));
                    }
                    actions.push(Action::WaitBound(id));
                }
                Pc::Reading => actions.push(Action::Read(id)),
                Pc::Claiming => actions.push(Action::Claim(id)),
                Pc::Statement => {
                    let run = self.statement_run(s, id);
                    if run != StatementRun::Blocked {
                        actions.push(Action::Statement(id, Net::Acked));
                    }
                    if losses {
                        actions.push(Action::Statement(id, Net::Lost));
                    }
                }
                Pc::Locking => actions.push(Action::Lock(id)),
                Pc::Changing => {
                    if !(self.design.has_unique_column() && s.order_pending_elsewhere(id)) {
                        actions.push(Action::Change(id));
                    }
                }
                Pc::Recording => {
                    if r.expired
                        || self.design == Design::RecordOutsideTransaction
                        || !s.entry_pending_elsewhere(id)
                    {
                        actions.push(Action::Record(id));
                    }
                }
                Pc::Committing => {
                    actions.push(Action::Commit(id, Net::Acked));
                    if losses {
                        actions.push(Action::Commit(id, Net::AckLost));
                        actions.push(Action::Commit(id, Net::Lost));
                    }
                }
                Pc::RecordingAfter => {
                    if !s.entry_pending_elsewhere(id) {
                        actions.push(Action::RecordAfter(id));
                    }
                }
            }
            let holder = s.slots.get(usize::from(r.process)).copied().flatten() == Some(id);
            if s.budget.hangs > 0 && holder && !r.expired {
                actions.push(Action::LeaseRunsOut(id));
            }
        }
        if s.budget.crashes > 0 {
            for process in 0..self.bounds.processes {
                if s.reqs.iter().any(|r| r.process == process) {
                    actions.push(Action::Crash { process });
                }
            }
        }
        for (index, o) in (0u8..).zip(&s.orphans) {
            let runnable = match *o {
                Orphan::Commit { .. } => true,
                Orphan::Statement { id } => self.statement_run(s, id) != StatementRun::Blocked,
            };
            if runnable {
                actions.push(Action::Orphan { index, runs: true });
            }
            actions.push(Action::Orphan { index, runs: false });
        }
        if s.budget.purges > 0 && matches!(s.db.entry, Some(Entry::Recorded { .. })) {
            actions.push(Action::Purge);
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        let at = |s: &State, id: ReqId| s.index(id);
        match action {
            Action::Send { client, process } => self.send(&mut s, client, process),
            Action::Wake(id) => {
                let i = at(&s, id)?;
                let process = s.reqs[i].process;
                s.reqs[i].pc = Pc::Reading;
                *s.slots.get_mut(usize::from(process))? = Some(id);
            }
            Action::WaitBound(id) => {
                let i = at(&s, id)?;
                self.answer(&mut s, i, Reply::InProgress);
            }
            Action::Read(id) => {
                let i = at(&s, id)?;
                self.read(&mut s, i);
            }
            Action::Claim(id) => {
                let i = at(&s, id)?;
                match s.db.entry {
                    Some(entry) => {
                        let reply = self.decide(entry, s.body_of(id));
                        self.answer(&mut s, i, reply);
                    }
                    None => {
                        s.db.entry = Some(Entry::Claimed {
                            body: s.body_of(id),
                            owner: id,
                        });
                        s.reqs[i].pc = Pc::Changing;
                    }
                }
            }
            Action::Statement(id, net) => {
                let i = at(&s, id)?;
                match (net, self.statement_run(&s, id)) {
                    (Net::Lost | Net::AckLost, _) => {
                        s.budget.losses = s.budget.losses.saturating_sub(1);
                        self.answer(&mut s, i, Reply::Unavailable);
                    }
                    // It took the lock and wrote both rows; they commit as
                    // the statement ends (`Commit`), and meanwhile the lock
                    // is held like any unit's.
                    (Net::Acked, StatementRun::Writes) => {
                        let req = &mut s.reqs[i];
                        req.tx = Tx {
                            lock: true,
                            order: true,
                            entry: true,
                        };
                        req.pc = Pc::Committing;
                    }
                    // Whatever it cannot decide goes the general way.
                    (Net::Acked, _) => s.reqs[i].pc = Pc::Locking,
                }
            }
            Action::Lock(id) => {
                let i = at(&s, id)?;
                if s.locked_by_other(id) {
                    // Busy: roll back, release everything, look again
                    // after a pause (or give up at the wait bound).
                    let req = &mut s.reqs[i];
                    // (The permit-first design keeps its slot to the end.)
                    req.permit &= self.design == Design::PermitHeldWhileWaiting;
                    if req.polls == 0 {
                        self.answer(&mut s, i, Reply::InProgress);
                    } else {
                        req.polls = req.polls.saturating_sub(1);
                        req.pc = Pc::Reading;
                    }
                } else {
                    let req = &mut s.reqs[i];
                    req.tx.lock = true;
                    req.pc = Pc::Changing;
                }
            }
            Action::Change(id) => {
                let i = at(&s, id)?;
                self.change(&mut s, i);
            }
            Action::Record(id) => {
                let i = at(&s, id)?;
                self.record(&mut s, i);
            }
            Action::Commit(id, net) => {
                let i = at(&s, id)?;
                let tx = s.reqs[i].tx;
                if net != Net::Lost {
                    self.apply(&mut s, id, tx.order, tx.entry);
                }
                let reply = if net == Net::Acked {
                    Reply::Created(id)
                } else {
                    s.budget.losses = s.budget.losses.saturating_sub(1);
                    Reply::Unavailable
                };
                s.reqs[i].tx = Tx::default();
                if self.design == Design::AnswerBeforeCommit {
                    // Answered already: the request just ends.
                    let req = s.reqs.remove(i);
                    if let Some(slot) = s.slots.get_mut(usize::from(req.process))
                        && *slot == Some(id)
                    {
                        *slot = None;
                    }
                } else {
                    self.answer(&mut s, i, reply);
                }
            }
            Action::RecordAfter(id) => {
                let i = at(&s, id)?;
                let reply = match s.db.entry {
                    Some(entry) => self.decide(entry, s.body_of(id)),
                    None => {
                        self.apply(&mut s, id, false, true);
                        Reply::Created(id)
                    }
                };
                self.answer(&mut s, i, reply);
            }
            Action::LeaseRunsOut(id) => {
                let i = at(&s, id)?;
                s.budget.hangs = s.budget.hangs.saturating_sub(1);
                s.reqs[i].expired = true;
            }
            Action::Crash { process } => self.crash(&mut s, process),
            Action::Orphan { index, runs } => {
                let orphan = s.orphans.remove(usize::from(index));
                if runs {
                    match orphan {
                        Orphan::Commit { id, order, entry } => self.apply(&mut s, id, order, entry),
                        Orphan::Statement { id } => {
                            if self.statement_run(&s, id) == StatementRun::Writes {
                                self.apply(&mut s, id, true, true);
                            }
                        }
                    }
                }
            }
            Action::Purge => {
                s.budget.purges = s.budget.purges.saturating_sub(1);
                s.db.entry = None;
                s.db.purged = true;
            }
        }
        assert!(
            s.fuel(&self.bounds) < last.fuel(&self.bounds),
            "a step must make progress (the model would have a cycle): {action:?}"
        );
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        properties::all()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::design::Bounds;

    /// The same state with processes 0 and 1 swapped.
    fn swapped(s: &State) -> State {
        let mut t = s.clone();
        for r in &mut t.reqs {
            r.process = 1 - r.process;
        }
        t.slots.reverse();
        t
    }

    #[test]
    fn states_that_differ_only_by_which_process_is_which_share_one_representative() {
        let model = LedgerModel::new(Design::Correct, Bounds::default());
        // Every state within a few steps of the start, both ways round.
        let mut frontier = model.init_states();
        let mut seen = 0;
        for _ in 0..5 {
            let mut next = Vec::new();
            for s in &frontier {
                assert_eq!(representative(s), representative(&swapped(s)), "{s:?}");
                seen += 1;
                next.extend(model.next_states(s));
            }
            frontier = next;
        }
        assert!(seen > 1000, "{seen}");
    }
}
