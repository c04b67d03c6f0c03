//! The protocol as built has no counterexample within the bounds: every
//! reachable state is checked, in three configurations.

use ledger_model::{Bounds, Design, LedgerModel, Run, check_all, trace};

/// Checks every reachable state and prints what the run covered; on a
/// counterexample, fails with its trace.
fn holds_everywhere(bounds: Bounds) -> Run {
    let model = LedgerModel::new(Design::Correct, bounds);
    let run = check_all(model, 1);
    println!("{bounds:?}: {}", run.summary());
    let found: Vec<String> = run
        .discoveries
        .iter()
        .map(|(name, path)| format!("{name}:\n{}", trace::trace(&model, path)))
        .collect();
    assert!(found.is_empty(), "counterexamples:\n{}", found.join("\n"));
    // Exhaustive, not a sample: the whole space, and it is not trivial.
    assert!(run.unique_states > 500_000, "{}", run.summary());
    run
}

/// PostgreSQL's creates: the one-statement create first.
#[test]
fn the_correct_design_has_no_counterexample_with_the_one_statement_create() {
    holds_everywhere(Bounds::default());
}

/// Every request through the unit of writing (SQLite's creates; PATCH and
/// DELETE; what the one-statement create leaves undecided).
#[test]
fn the_correct_design_has_no_counterexample_on_the_general_path() {
    holds_everywhere(Bounds {
        one_statement: false,
        ..Bounds::default()
    });
}

/// With a second admission slot a request that took over a hung holder's
/// key in its own process is admitted and runs on (with one, it is refused
/// `503`), so the lease's takeover meets the hung unit's lock and fence.
#[test]
fn the_correct_design_has_no_counterexample_when_a_takeover_runs_beside_the_hung_holder() {
    holds_everywhere(Bounds {
        one_statement: false,
        admission: 2,
        ..Bounds::default()
    });
}
