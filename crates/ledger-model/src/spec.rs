//! The key's answer as a sequential object, for Stateright's
//! [`LinearizabilityTester`](stateright::semantics::LinearizabilityTester).
//!
//! Seen from its clients, one `(user, key)` behaves like a write-once
//! register holding "the first execution": a create with the key either
//! makes the order (when the register is empty) or is answered from it —
//! the same order when the body is the same, a refusal otherwise. The purge
//! empties the ledger, not the register: the order's `UNIQUE` column keeps
//! answering for the key forever.
//!
//! An answer that decides nothing is allowed at any point without changing
//! the register: `409 IDEMPOTENCY_IN_PROGRESS` (the request ran nothing).
//! A `503` or a broken connection says nothing about the outcome, so such a
//! request stays invoked and never returns: the tester may place its effect
//! anywhere after its start, or nowhere.

use stateright::semantics::SequentialSpec;

/// A request's body, as the ledger sees it: its fingerprint.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Body {
    A,
    B,
}

/// A request: the client that sent it and which of its attempts it is.
/// The order a request makes is named by it (the server makes a fresh
/// order id per request), so an answer's order says which execution it
/// comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ReqId {
    pub client: u8,
    pub attempt: u8,
}

/// The register: the body and the order of the key's first execution.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq)]
pub struct KeyAnswer(pub Option<(Body, ReqId)>);

/// A create with the key: its body, and the order it makes if it is the
/// one that executes (an order is named by the request that made it).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub struct Create {
    pub body: Body,
    pub order: ReqId,
}

/// What a create is answered, when the answer decides something.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Answer {
    /// `201`: this request made the order.
    Created(ReqId),
    /// `200` with `Idempotent-Replayed: true`: the order the key made.
    Replayed(ReqId),
    /// `409 IDEMPOTENCY_KEY_REUSED_WITH_DIFFERENT_PAYLOAD`.
    KeyReused,
    /// `409 IDEMPOTENCY_IN_PROGRESS`: nothing ran.
    InProgress,
}

impl SequentialSpec for KeyAnswer {
    type Op = Create;
    type Ret = Answer;

    fn invoke(&mut self, op: &Create) -> Answer {
        match self.0 {
            None => {
                self.0 = Some((op.body, op.order));
                Answer::Created(op.order)
            }
            Some((body, order)) if body == op.body => Answer::Replayed(order),
            Some(_) => Answer::KeyReused,
        }
    }

    fn is_valid_step(&mut self, op: &Create, ret: &Answer) -> bool {
        *ret == Answer::InProgress || self.invoke(op) == *ret
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIRST: ReqId = ReqId {
        client: 0,
        attempt: 0,
    };
    const SECOND: ReqId = ReqId {
        client: 1,
        attempt: 0,
    };

    #[test]
    fn the_first_create_makes_the_order_and_every_later_one_is_answered_from_it() {
        let mut key = KeyAnswer::default();
        let a = |order| Create {
            body: Body::A,
            order,
        };
        assert_eq!(key.invoke(&a(FIRST)), Answer::Created(FIRST));
        assert_eq!(key.invoke(&a(SECOND)), Answer::Replayed(FIRST));
        let b = Create {
            body: Body::B,
            order: SECOND,
        };
        assert_eq!(key.invoke(&b), Answer::KeyReused);
        assert!(key.is_valid_step(&b, &Answer::InProgress));
        assert!(!key.is_valid_step(&a(SECOND), &Answer::Created(SECOND)));
    }
}
