//! Runs of the correct design, step by step: each is a path the checker
//! explores (every step must be enabled where it is taken), and each ends
//! as the contract says. They show that the model reaches what its
//! properties are about, so that "no counterexample" is not vacuous.

#![allow(clippy::expect_used, clippy::panic)]

use ledger_model::model::{Action, Net};
use ledger_model::spec::{Body, ReqId};
use ledger_model::state::{Pc, Reply};
use ledger_model::{Bounds, Design, LedgerModel, State};
use stateright::{Model, Path};

fn id(client: u8, attempt: u8) -> ReqId {
    ReqId { client, attempt }
}

/// Plays `steps` from the start where client 1 sends `second`; every step
/// must be one the model offers at that point.
fn play(bounds: Bounds, second: Body, steps: &[Action]) -> State {
    let model = LedgerModel::new(Design::Correct, bounds);
    let init = model
        .init_states()
        .into_iter()
        .find(|s| s.clients[1].body == second)
        .expect("an initial state with that body");
    let path = Path::from_actions(&model, init, steps).expect("every step is enabled");
    path.last_state().clone()
}

fn general_path() -> Bounds {
    Bounds {
        one_statement: false,
        ..Bounds::default()
    }
}

fn send(client: u8, process: u8) -> Action {
    Action::Send { client, process }
}

#[test]
fn a_duplicate_in_the_same_process_waits_holding_nothing_and_replays_the_first_answer() {
    let (first, second) = (id(0, 0), id(1, 0));
    let waiting = play(Bounds::default(), Body::A, &[send(0, 0), send(1, 0)]);
    let waiter = waiting.reqs.iter().find(|r| r.id == second).expect("waits");
    assert_eq!((waiter.pc, waiter.permit), (Pc::Waiting, false));

    let end = play(
        Bounds::default(),
        Body::A,
        &[
            send(0, 0),
            send(1, 0),
            Action::Read(first),
            Action::Statement(first, Net::Acked),
            Action::Commit(first, Net::Acked),
            Action::Wake(second),
            Action::Read(second),
        ],
    );
    assert_eq!(
        end.replies,
        [
            (first, Reply::Created(first)),
            (second, Reply::Replayed(first))
        ]
    );
}

#[test]
fn a_one_statement_create_that_meets_another_ones_lock_goes_the_general_way_and_replays() {
    let (first, second) = (id(0, 0), id(1, 0));
    let end = play(
        Bounds::default(),
        Body::A,
        &[
            send(0, 0),
            Action::Read(first),
            Action::Statement(first, Net::Acked),
            send(1, 1),
            Action::Read(second),
            // The first statement still holds the key's lock: this one
            // writes nothing, and its unit finds the lock held.
            Action::Statement(second, Net::Acked),
            Action::Lock(second),
            Action::Commit(first, Net::Acked),
            Action::Read(second),
        ],
    );
    assert_eq!(
        end.replies,
        [
            (first, Reply::Created(first)),
            (second, Reply::Replayed(first))
        ]
    );
}

#[test]
fn a_unit_that_finds_the_key_locked_by_another_process_looks_again_and_replays() {
    let (first, second) = (id(0, 0), id(1, 0));
    let end = play(
        general_path(),
        Body::A,
        &[
            send(0, 0),
            Action::Read(first),
            Action::Lock(first),
            send(1, 1),
            Action::Read(second),
            Action::Lock(second),
            Action::Change(first),
            Action::Record(first),
            Action::Commit(first, Net::Acked),
            Action::Read(second),
        ],
    );
    assert_eq!(
        end.replies,
        [
            (first, Reply::Created(first)),
            (second, Reply::Replayed(first))
        ]
    );
    assert_eq!(end.db.orders, [first]);
}

#[test]
fn a_retry_after_a_lost_acknowledgement_and_the_purge_is_answered_from_the_order() {
    let (first, retry) = (id(0, 0), id(0, 1));
    let end = play(
        Bounds::default(),
        Body::A,
        &[
            send(0, 0),
            Action::Read(first),
            Action::Statement(first, Net::Acked),
            Action::Commit(first, Net::AckLost),
            Action::Purge,
            send(0, 1),
            Action::Read(retry),
            // The one-statement create finds the order: the general way.
            Action::Statement(retry, Net::Acked),
            Action::Lock(retry),
            Action::Change(retry),
        ],
    );
    assert_eq!(
        end.replies,
        [(first, Reply::Unavailable), (retry, Reply::Replayed(first))]
    );
    assert_eq!(end.db.orders, [first]);
    assert!(end.db.purged && end.db.entry.is_none());
}

#[test]
fn another_body_after_the_purge_is_refused_by_the_order_and_runs_nothing() {
    let (first, other) = (id(0, 0), id(1, 0));
    let end = play(
        general_path(),
        Body::B,
        &[
            send(0, 0),
            Action::Read(first),
            Action::Lock(first),
            Action::Change(first),
            Action::Record(first),
            Action::Commit(first, Net::Acked),
            Action::Purge,
            send(1, 1),
            Action::Read(other),
            Action::Lock(other),
            Action::Change(other),
        ],
    );
    assert_eq!(end.replies[1], (other, Reply::KeyReused));
    assert_eq!(end.db.orders, [first]);
}

#[test]
fn a_commit_sent_by_a_process_that_then_dies_is_finished_by_the_database_and_replayed() {
    let (first, retry) = (id(0, 0), id(0, 1));
    let end = play(
        general_path(),
        Body::A,
        &[
            send(0, 0),
            Action::Read(first),
            Action::Lock(first),
            Action::Change(first),
            Action::Record(first),
            Action::Crash { process: 0 },
            send(0, 1),
            Action::Read(retry),
            // The dead process's COMMIT still holds the key's lock.
            Action::Lock(retry),
            Action::Orphan {
                index: 0,
                runs: true,
            },
            Action::Read(retry),
        ],
    );
    assert_eq!(
        end.replies,
        [(first, Reply::Reset), (retry, Reply::Replayed(first))]
    );
}

#[test]
fn a_holder_killed_before_its_commit_leaves_the_key_free_at_once() {
    let (first, retry) = (id(0, 0), id(0, 1));
    let end = play(
        general_path(),
        Body::A,
        &[
            send(0, 0),
            Action::Read(first),
            Action::Lock(first),
            Action::Change(first),
            Action::Crash { process: 0 },
        ],
    );
    assert!(end.key_free() && end.db.orders.is_empty());
    let end = play(
        general_path(),
        Body::A,
        &[
            send(0, 0),
            Action::Read(first),
            Action::Lock(first),
            Action::Change(first),
            Action::Crash { process: 0 },
            send(0, 0),
            Action::Read(retry),
            Action::Lock(retry),
            Action::Change(retry),
            Action::Record(retry),
            Action::Commit(retry, Net::Acked),
        ],
    );
    assert_eq!(end.replies[1], (retry, Reply::Created(retry)));
}

#[test]
fn a_hung_holder_is_taken_over_after_its_lease_and_its_fence_rolls_it_back() {
    let (hung, next) = (id(0, 0), id(1, 0));
    let bounds = Bounds {
        admission: 2,
        ..general_path()
    };
    let end = play(
        bounds,
        Body::A,
        &[
            send(0, 0),
            Action::Read(hung),
            Action::Lock(hung),
            Action::Change(hung),
            send(1, 0),
            Action::LeaseRunsOut(hung),
            Action::Wake(next),
            Action::Read(next),
            // The hung holder's transaction still holds the key's lock.
            Action::Lock(next),
            Action::Record(hung),
            Action::Read(next),
            Action::Lock(next),
            Action::Change(next),
            Action::Record(next),
            Action::Commit(next, Net::Acked),
        ],
    );
    assert_eq!(
        end.replies,
        [(hung, Reply::Unavailable), (next, Reply::Created(next))]
    );
    assert_eq!(end.db.orders, [next]);
}

#[test]
fn past_the_waiter_cap_a_duplicate_is_answered_in_progress_at_once() {
    let end = play(
        Bounds::default(),
        Body::A,
        &[send(0, 0), send(1, 0), send(0, 0)],
    );
    assert_eq!(end.replies, [(id(0, 1), Reply::InProgress)]);
}

#[test]
fn while_every_admission_slot_is_taken_a_request_is_answered_503_on_arrival_and_the_key_stays_free()
{
    let (hung, next) = (id(0, 0), id(1, 0));
    let end = play(
        Bounds::default(),
        Body::A,
        &[
            send(0, 0),
            Action::Read(hung),
            Action::LeaseRunsOut(hung),
            send(1, 0),
        ],
    );
    assert_eq!(end.replies, [(next, Reply::Unavailable)]);
    assert!(end.db.entry.is_none() && end.db.orders.is_empty());
}

#[test]
fn a_waiter_that_takes_the_key_over_without_a_free_slot_is_answered_503_and_the_key_stays_free() {
    let (hung, next) = (id(0, 0), id(1, 0));
    let end = play(
        Bounds::default(),
        Body::A,
        &[
            send(0, 0),
            // Arrives while the slot is free, and waits for the holder.
            send(1, 0),
            Action::Read(hung),
            Action::LeaseRunsOut(hung),
            Action::Wake(next),
            Action::Read(next),
        ],
    );
    assert_eq!(end.replies, [(next, Reply::Unavailable)]);
    assert!(end.db.entry.is_none() && end.db.orders.is_empty());
}
