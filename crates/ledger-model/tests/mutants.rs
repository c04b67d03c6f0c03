//! Each known wrong design is a variant of the model, and the checker finds
//! the counterexample it allows: the shortest one, printed as numbered
//! steps (`cargo test -p ledger-model -- --nocapture` shows them).

#![allow(clippy::expect_used, clippy::panic)]

use ledger_model::properties::{
    CHANGE_WITH_ANSWER, COMMITTED_ONLY, KEY_FREED, LINEARIZABLE, ONE_ORDER, SAME_BODY_ONLY,
    WAITER_HOLDS_NO_PERMIT,
};
use ledger_model::{Bounds, Design, LedgerModel, find, trace};

/// Searches `design` for a counterexample to `property`, prints it, and
/// returns it as text.
fn counterexample(design: Design, bounds: Bounds, property: &'static str) -> String {
    let model = LedgerModel::new(design, bounds);
    let run = find(model, 1, property);
    let Some(path) = run.discoveries.get(property) else {
        panic!(
            "{design:?}: no counterexample to \"{property}\" ({})",
            run.summary()
        );
    };
    let text = trace::trace(&model, path);
    println!(
        "{design:?} breaks \"{property}\" ({}):\n{text}",
        run.summary()
    );
    text
}

/// The faults a second order after retention takes: a lost acknowledgement
/// and the purge. Crashes and hangs add only states (and a detour through a
/// dead process's statement) to the search for it.
fn lost_and_purged() -> Bounds {
    Bounds {
        crashes: 0,
        hangs: 0,
        ..Bounds::default()
    }
}

#[test]
fn claim_first_without_a_lease_leaves_a_dead_holders_key_stuck() {
    let text = counterexample(Design::ClaimFirstWithoutLease, Bounds::default(), KEY_FREED);
    assert!(text.contains("is killed"), "{text}");
    assert!(text.contains("claimed by"), "{text}");
}

#[test]
fn without_the_unique_column_a_retry_after_the_purge_makes_a_second_order() {
    let text = counterexample(Design::NoUniqueColumn, lost_and_purged(), ONE_ORDER);
    assert!(text.contains("the purge deletes"), "{text}");
}

#[test]
fn an_entry_recorded_outside_the_changes_transaction_leaves_a_change_without_its_answer() {
    // The unit of writing is the general path: PATCH and DELETE, SQLite,
    // and whatever the one-statement create leaves undecided.
    let bounds = Bounds {
        one_statement: false,
        ..Bounds::default()
    };
    let text = counterexample(Design::RecordOutsideTransaction, bounds, CHANGE_WITH_ANSWER);
    assert!(text.contains("commits its change alone"), "{text}");
}

#[test]
fn a_replay_that_skips_the_fingerprint_answers_another_body_with_the_first_ones_order() {
    let text = counterexample(
        Design::ReplaySkipsFingerprint,
        Bounds::default(),
        SAME_BODY_ONLY,
    );
    assert!(text.contains("body B"), "{text}");
}

#[test]
fn a_permit_taken_before_the_in_flight_wait_is_held_by_a_waiting_duplicate() {
    // Two slots, so that a duplicate is admitted behind its holder (with one,
    // it is refused 503 and the shortest counterexample is a long detour).
    let bounds = Bounds {
        admission: 2,
        ..Bounds::default()
    };
    let text = counterexample(
        Design::PermitHeldWhileWaiting,
        bounds,
        WAITER_HOLDS_NO_PERMIT,
    );
    assert!(text.contains("holding a write permit"), "{text}");
}

#[test]
fn an_answer_sent_before_commit_returns_is_a_2xx_for_a_change_that_did_not_commit() {
    let bounds = Bounds {
        one_statement: false,
        ..Bounds::default()
    };
    let text = counterexample(Design::AnswerBeforeCommit, bounds, COMMITTED_ONLY);
    // The 201 is out while nothing is committed: a lost connection or a
    // crash at the COMMIT would now roll the change back.
    assert!(text.contains("is answered 201"), "{text}");
    assert!(text.contains("end: orders [];"), "{text}");
}

/// The register view of the key finds, on its own, what the specific
/// properties find: an answer from another body's execution, and a second
/// execution.
#[test]
fn the_linearizability_check_alone_finds_the_skipped_fingerprint_and_the_second_order() {
    counterexample(
        Design::ReplaySkipsFingerprint,
        Bounds::default(),
        LINEARIZABLE,
    );
    counterexample(Design::NoUniqueColumn, lost_and_purged(), LINEARIZABLE);
}
