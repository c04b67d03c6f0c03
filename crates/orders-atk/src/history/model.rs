//! One order as a sequential object, and the check that the operations on
//! it, each between its invocation and its answer, happened in some order
//! that this object explains: linearizability, decided by the Wing–Gong–Lowe
//! search of `todc-utils` (memoised on the set of operations placed and the
//! order's state). An operation of unknown outcome is placed anywhere after
//! its invocation, or after everything (where it changes nothing anyone saw).

use std::collections::BTreeMap;

use todc_utils::linearizability::WGLChecker;
use todc_utils::linearizability::history::{Action as Step, History};
use todc_utils::specifications::Specification;

/// An order's members that requests set, each as canonical JSON text.
pub type Fields = BTreeMap<String, String>;

/// What the model knows of an order.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Order {
    pub fields: Fields,
    pub cancelled: bool,
}

/// An order as an answer showed it: the members the model tracks, and its
/// `status` when the answer has one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub fields: Fields,
    pub status: Option<String>,
}

impl Seen {
    /// Whether this is what `order` looks like: each member it has, the
    /// same value, and `pending` or `cancelled` as it is.
    fn shows(&self, order: &Order) -> bool {
        let status = if order.cancelled {
            "cancelled"
        } else {
            "pending"
        };
        order
            .fields
            .iter()
            .all(|(name, value)| self.fields.get(name) == Some(value))
            && self.status.as_deref().is_none_or(|s| s == status)
    }
}

/// What an operation does to the order.
#[derive(Debug, Clone)]
pub enum Action {
    /// The order exists as it was before the history (an opening listing showed it).
    Existed(Order),
    Create(Fields),
    /// Changes these members of a pending order; a cancelled order is refused.
    Update(Fields),
    /// Cancels it; cancelling a cancelled order changes nothing.
    Cancel,
    /// Shows the order.
    Read,
    /// Shows that the order does not exist (a listing without it, a `404`).
    ReadAbsent,
}

/// What came of it.
#[derive(Debug, Clone)]
pub enum Outcome {
    /// It took effect, and the answer showed the order as it then was.
    Seen(Seen),
    /// It took effect (or, for [`Action::ReadAbsent`], saw no order); the
    /// answer showed nothing more.
    Done,
    /// It may or may not have taken effect.
    Unknown,
}

/// One operation on the order.
#[derive(Debug, Clone)]
pub struct Op {
    pub action: Action,
    pub outcome: Outcome,
}

/// The order as a sequential object: `None` until it exists.
struct OrderSpec;

impl Specification for OrderSpec {
    type State = Option<Order>;
    type Operation = Op;

    fn init() -> Self::State {
        None
    }

    fn apply(op: &Op, state: &Self::State) -> (bool, Self::State) {
        let unchanged = (false, state.clone());
        let unknown = matches!(op.outcome, Outcome::Unknown);
        let next = match (&op.action, state) {
            (Action::Existed(order), None) => order.clone(),
            (Action::Create(fields), None) => Order {
                fields: fields.clone(),
                cancelled: false,
            },
            (Action::Update(fields), Some(order)) if !order.cancelled => {
                let mut next = order.clone();
                next.fields
                    .extend(fields.iter().map(|(k, v)| (k.clone(), v.clone())));
                next
            }
            (Action::Cancel, Some(order)) => Order {
                cancelled: true,
                ..order.clone()
            },
            (Action::Read, Some(order)) => order.clone(),
            (Action::ReadAbsent, None) => return (true, None),
            // Refused (a create of an existing order, a change of a missing
            // or cancelled one): one whose outcome is unknown was refused,
            // and changed nothing; an acknowledged one cannot be.
            _ if unknown => return (true, state.clone()),
            _ => return unchanged,
        };
        match &op.outcome {
            Outcome::Seen(seen) if !seen.shows(&next) => unchanged,
            _ => (true, Some(next)),
        }
    }
}

/// An operation with its place in the history: the line of its invocation
/// and of its answer (`None`: unknown outcome, it may take effect at any
/// point after its invocation).
#[derive(Debug, Clone)]
pub struct Timed {
    pub op: Op,
    pub invoked: usize,
    pub answered: Option<usize>,
}

/// Whether some order of `ops`, each placed between its invocation and its
/// answer, is what one order would do.
pub fn linearizable(ops: &[&Timed]) -> bool {
    if ops.is_empty() {
        return true;
    }
    // (line, call before answer at one line, which): every operation its
    // own process, so that only the lines order them.
    let mut points: Vec<(usize, u8, usize)> = Vec::with_capacity(ops.len() * 2);
    for (i, timed) in ops.iter().enumerate() {
        points.push((timed.invoked, 0, i));
        points.push((timed.answered.unwrap_or(usize::MAX), 1, i));
    }
    points.sort_unstable();
    let steps = points
        .into_iter()
        .filter_map(|(_, answer, i)| {
            let op = ops.get(i)?.op.clone();
            Some((
                i,
                if answer == 0 {
                    Step::Call(op)
                } else {
                    Step::Response(op)
                },
            ))
        })
        .collect();
    WGLChecker::<OrderSpec>::is_linearizable(History::from_actions(steps))
}

/// The operations of a counterexample: every change to the order (their
/// indexes, in order), and of the reads only those without which it is no
/// longer one. Only reads are dropped: a history that is linearizable stays
/// so without some of its reads, so what is left is still a proof; without
/// a change it might not be. `ops` must not be linearizable.
pub fn minimal(ops: &[Timed]) -> Vec<usize> {
    let is_read = |i: usize| {
        ops.get(i)
            .is_some_and(|t| matches!(t.op.action, Action::Read | Action::ReadAbsent))
    };
    let fails = |subset: &[usize]| {
        let picked: Vec<&Timed> = subset.iter().filter_map(|&i| ops.get(i)).collect();
        !linearizable(&picked)
    };
    let mut kept: Vec<usize> = (0..ops.len()).collect();
    let reads = kept.iter().filter(|&&i| is_read(i)).count();
    let mut chunk = reads.div_ceil(2).max(1);
    loop {
        // Try dropping `chunk` reads at a time, from the first on.
        let mut skip = 0;
        loop {
            let candidates: Vec<usize> = kept
                .iter()
                .copied()
                .filter(|&i| is_read(i))
                .skip(skip)
                .take(chunk)
                .collect();
            if candidates.is_empty() {
                break;
            }
            let without: Vec<usize> = kept
                .iter()
                .copied()
                .filter(|i| !candidates.contains(i))
                .collect();
            if fails(&without) {
                kept = without;
            } else {
                skip += candidates.len();
            }
        }
        if chunk == 1 {
            return kept;
        }
        chunk = chunk.div_ceil(2);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(pairs: &[(&str, &str)]) -> Fields {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn seen(pairs: &[(&str, &str)], status: &str) -> Outcome {
        Outcome::Seen(Seen {
            fields: fields(pairs),
            status: Some(status.to_owned()),
        })
    }

    fn op(action: Action, outcome: Outcome, invoked: usize, answered: Option<usize>) -> Timed {
        Timed {
            op: Op { action, outcome },
            invoked,
            answered,
        }
    }

    fn check(ops: &[Timed]) -> bool {
        linearizable(&ops.iter().collect::<Vec<_>>())
    }

    #[test]
    fn a_create_then_reads_of_what_it_made_is_linearizable_and_a_read_of_anything_else_is_not() {
        let q2 = &[("quantity", "2e0")];
        let create = op(Action::Create(fields(q2)), seen(q2, "pending"), 1, Some(2));
        let read = op(Action::Read, seen(q2, "pending"), 3, Some(4));
        assert!(check(&[create.clone(), read]));
        let wrong = op(
            Action::Read,
            seen(&[("quantity", "3e0")], "pending"),
            3,
            Some(4),
        );
        assert!(!check(&[create.clone(), wrong]));
        let cancelled = op(Action::Read, seen(q2, "cancelled"), 3, Some(4));
        assert!(!check(&[create, cancelled]));
    }

    #[test]
    fn concurrent_operations_may_take_effect_in_either_order_but_not_against_real_time() {
        let q = |v: &str| fields(&[("quantity", v)]);
        let create = op(
            Action::Create(q("1")),
            seen(&[("quantity", "1")], "pending"),
            1,
            Some(2),
        );
        // An update to 5 overlaps a read that already shows 5: fine.
        let update = op(
            Action::Update(q("5")),
            seen(&[("quantity", "5")], "pending"),
            3,
            Some(6),
        );
        let read_new = op(
            Action::Read,
            seen(&[("quantity", "5")], "pending"),
            4,
            Some(5),
        );
        assert!(check(&[create.clone(), update.clone(), read_new]));
        // A read that starts after the update answered must not show the old value.
        let stale = op(
            Action::Read,
            seen(&[("quantity", "1")], "pending"),
            7,
            Some(8),
        );
        assert!(!check(&[create.clone(), update.clone(), stale]));
        // …but one overlapping it may.
        let overlapping = op(
            Action::Read,
            seen(&[("quantity", "1")], "pending"),
            4,
            Some(5),
        );
        assert!(check(&[create, update, overlapping]));
    }

    #[test]
    fn an_operation_of_unknown_outcome_may_or_may_not_have_taken_effect() {
        let q = |v: &str| fields(&[("quantity", v)]);
        let create = op(
            Action::Create(q("1")),
            seen(&[("quantity", "1")], "pending"),
            1,
            Some(2),
        );
        let lost_update = op(Action::Update(q("9")), Outcome::Unknown, 3, None);
        let old = op(
            Action::Read,
            seen(&[("quantity", "1")], "pending"),
            5,
            Some(6),
        );
        let new = op(
            Action::Read,
            seen(&[("quantity", "9")], "pending"),
            7,
            Some(8),
        );
        assert!(check(&[create.clone(), lost_update.clone(), old.clone()]));
        assert!(check(&[create.clone(), lost_update.clone(), new.clone()]));
        assert!(check(&[
            create.clone(),
            lost_update.clone(),
            old.clone(),
            new.clone()
        ]));
        // Once seen, its effect cannot be undone.
        assert!(!check(&[
            create.clone(),
            lost_update,
            new.clone(),
            op(
                Action::Read,
                seen(&[("quantity", "1")], "pending"),
                9,
                Some(10)
            )
        ]));
        // An unknown create explains an order nobody acknowledged.
        let maybe = op(Action::Create(q("1")), Outcome::Unknown, 1, None);
        assert!(check(&[maybe, old]));
    }

    #[test]
    fn a_cancelled_order_refuses_changes_and_stays_cancelled() {
        let q1 = &[("quantity", "1")];
        let create = op(Action::Create(fields(q1)), seen(q1, "pending"), 1, Some(2));
        let cancel = op(Action::Cancel, seen(q1, "cancelled"), 3, Some(4));
        let again = op(Action::Cancel, seen(q1, "cancelled"), 5, Some(6));
        assert!(check(&[create.clone(), cancel.clone(), again]));
        let update = op(
            Action::Update(fields(&[("quantity", "7")])),
            seen(&[("quantity", "7")], "pending"),
            5,
            Some(6),
        );
        assert!(!check(&[create.clone(), cancel.clone(), update]));
        let unknown = op(
            Action::Update(fields(&[("quantity", "7")])),
            Outcome::Unknown,
            5,
            None,
        );
        let read = op(Action::Read, seen(q1, "cancelled"), 7, Some(8));
        assert!(check(&[create, cancel, unknown, read]));
    }

    #[test]
    fn an_order_that_existed_before_the_history_is_read_as_it_was_and_absent_orders_are_absent() {
        let q1 = &[("quantity", "1")];
        let existed = op(
            Action::Existed(Order {
                fields: fields(q1),
                cancelled: true,
            }),
            Outcome::Done,
            0,
            Some(0),
        );
        assert!(check(&[
            existed.clone(),
            op(Action::Read, seen(q1, "cancelled"), 1, Some(2))
        ]));
        assert!(!check(&[
            existed,
            op(Action::ReadAbsent, Outcome::Done, 1, Some(2))
        ]));
        let create = op(Action::Create(fields(q1)), seen(q1, "pending"), 3, Some(4));
        assert!(check(&[
            op(Action::ReadAbsent, Outcome::Done, 1, Some(2)),
            create.clone()
        ]));
        assert!(!check(&[
            create,
            op(Action::ReadAbsent, Outcome::Done, 5, Some(6))
        ]));
    }

    #[test]
    fn the_minimal_counterexample_keeps_every_change_and_only_the_reads_that_conflict() {
        let q = |v: &str| fields(&[("quantity", v)]);
        let mut ops = vec![op(
            Action::Create(q("1")),
            seen(&[("quantity", "1")], "pending"),
            1,
            Some(2),
        )];
        for i in 0..20 {
            ops.push(op(
                Action::Read,
                seen(&[("quantity", "1")], "pending"),
                3 + 2 * i,
                Some(4 + 2 * i),
            ));
        }
        ops.push(op(
            Action::Read,
            seen(&[("quantity", "8")], "pending"),
            100,
            Some(101),
        ));
        assert!(!check(&ops));
        // The create, and the one read of a quantity nothing wrote.
        assert_eq!(minimal(&ops), vec![0, 21]);

        let stale = vec![
            op(
                Action::Create(q("1")),
                seen(&[("quantity", "1")], "pending"),
                1,
                Some(2),
            ),
            op(
                Action::Read,
                seen(&[("quantity", "1")], "pending"),
                3,
                Some(4),
            ),
            op(
                Action::Update(q("5")),
                seen(&[("quantity", "5")], "pending"),
                5,
                Some(6),
            ),
            op(
                Action::Read,
                seen(&[("quantity", "5")], "pending"),
                7,
                Some(8),
            ),
            op(
                Action::Read,
                seen(&[("quantity", "1")], "pending"),
                9,
                Some(10),
            ),
        ];
        assert_eq!(minimal(&stale), vec![0, 2, 4]);
    }
}
