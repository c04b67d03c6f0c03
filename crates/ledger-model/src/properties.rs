//! What the protocol promises, as properties of every reachable state
//! (`always`) and of every path's end (`eventually`).
//!
//! The `eventually` properties are a bounded-liveness formulation: every
//! fault, timer and retry has a budget, and every step lowers a measure
//! (`State::fuel`, asserted on each step), so the graph of states is
//! acyclic and every path ends in a state where nothing can happen. Stateright
//! checks an `eventually` property on exactly those paths, so no fairness
//! assumption is needed: within the bounds, *every* run ends, and ends
//! with the property true. Both conditions are stable once true (nothing
//! can start after every client is done), so Stateright's DAG joins lose
//! nothing.

use stateright::Property;

use crate::design::LedgerModel;
use crate::spec::ReqId;
use crate::state::{Entry, Orphan, Pc, Reply, State};

pub const ONE_ORDER: &str = "at most one order per (user, key)";
pub const FIRST_ANSWER: &str = "every 2xx for a key carries the first execution's answer";
pub const COMMITTED_ONLY: &str = "no 2xx for a change that did not commit";
pub const OTHER_BODY_NEVER_EXECUTES: &str = "a different body under a used key never executes";
pub const SAME_BODY_ONLY: &str = "a 2xx answers only the body that executed";
pub const CHANGE_WITH_ANSWER: &str = "a committed change has its answer recorded with it";
pub const WAITER_HOLDS_NO_PERMIT: &str = "a waiting duplicate holds no write permit";
pub const LINEARIZABLE: &str = "the key's answers are linearizable";
pub const ANSWERED: &str = "every request is answered";
pub const KEY_FREED: &str = "a key whose holder died is free again";

/// Every property, in the order the checker reports them.
pub fn all() -> Vec<Property<LedgerModel>> {
    vec![
        Property::always(ONE_ORDER, |_, s: &State| s.db.orders.len() <= 1),
        Property::always(FIRST_ANSWER, first_answer),
        Property::always(COMMITTED_ONLY, committed_only),
        Property::always(OTHER_BODY_NEVER_EXECUTES, other_body_never_executes),
        Property::always(SAME_BODY_ONLY, same_body_only),
        Property::always(CHANGE_WITH_ANSWER, |_, s: &State| {
            s.db.orders.is_empty()
                || s.db.purged
                || matches!(s.db.entry, Some(Entry::Recorded { .. }))
        }),
        // Waiting in its process's registry, or between two looks at a key
        // another process's unit holds (back at its read, with a look
        // spent): either way without a write admission slot.
        Property::always(WAITER_HOLDS_NO_PERMIT, |m: &LedgerModel, s: &State| {
            s.reqs.iter().all(|r| {
                let waits =
                    r.pc == Pc::Waiting || (r.pc == Pc::Reading && r.polls < m.bounds.polls);
                !(waits && r.permit)
            })
        }),
        Property::always(LINEARIZABLE, |_, s: &State| s.linearizable),
        Property::eventually(ANSWERED, |m: &LedgerModel, s: &State| {
            s.all_answered(&m.bounds)
        }),
        Property::eventually(KEY_FREED, |m: &LedgerModel, s: &State| {
            s.all_answered(&m.bounds) && s.key_free()
        }),
    ]
}

/// The 2xx answers the server sent: the request and the order it carries.
fn successes(s: &State) -> impl Iterator<Item = (ReqId, Reply)> + '_ {
    s.replies
        .iter()
        .copied()
        .filter(|(_, r)| r.order().is_some())
}

/// Every 2xx carries the key's first committed order, and a `201` goes only
/// to the request that made it (a replay is a `200` of the same body).
fn first_answer(_: &LedgerModel, s: &State) -> bool {
    let first = s.db.orders.first().copied();
    successes(s).all(|(id, reply)| match reply {
        Reply::Created(order) => Some(order) == first && order == id,
        Reply::Replayed(order) => Some(order) == first,
        _ => true,
    })
}

/// Every order a 2xx carries is committed (orders are never deleted, so
/// "committed now" is "committed when it was answered").
fn committed_only(_: &LedgerModel, s: &State) -> bool {
    successes(s).all(|(_, reply)| reply.order().is_some_and(|o| s.db.orders.contains(&o)))
}

/// Once the key has an order, no order of another body is ever written,
/// committed or not.
fn other_body_never_executes(_: &LedgerModel, s: &State) -> bool {
    let Some(first) = s.db.orders.first().copied() else {
        return true;
    };
    let body = s.body_of(first);
    let committed = s.db.orders.iter().all(|&o| s.body_of(o) == body);
    let open = s
        .reqs
        .iter()
        .filter(|r| r.tx.order)
        .all(|r| s.body_of(r.id) == body);
    let sent = s.orphans.iter().all(|o| match *o {
        Orphan::Commit { id, order, .. } => !order || s.body_of(id) == body,
        Orphan::Statement { .. } => true,
    });
    committed && open && sent
}

/// A 2xx answers a request with the body of the execution it reports.
fn same_body_only(_: &LedgerModel, s: &State) -> bool {
    successes(s).all(|(id, reply)| reply.order().is_some_and(|o| s.body_of(o) == s.body_of(id)))
}
