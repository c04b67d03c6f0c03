//! The idempotency ledger's protocol as a [Stateright] model, checked
//! exhaustively by `cargo test`. A test-only crate: nothing depends on it,
//! and it shares no code with the server; `docs/MODEL.md` maps each of its
//! steps to the function that implements it.
//!
//! # What is modelled
//!
//! One user and one key, created by clients through two server processes
//! that share one PostgreSQL database. A request runs as `Ledger::execute`
//! does (the protocol's statement is
//! `crates/idempotency-ledger/src/protocol.rs`): while every write
//! admission slot of its process is taken it is refused `503` on arrival
//! (the shed); otherwise it enters its process's in-flight registry for the
//! key (a duplicate waits there holding nothing, up to its wait bound; past
//! the per-key waiter cap it is refused at once; a holder past its lease is
//! waited for no longer); the holder reads the key's entry (a replay or a
//! refusal); without one it takes a write admission slot (none free:
//! `503`), tries the one-statement create once, and otherwise runs the
//! record-last unit: `BEGIN`, a try of the key's advisory lock (held by
//! another process's unit: roll back, release everything, look again), the
//! order's `INSERT … ON CONFLICT DO NOTHING` under `UNIQUE (user_id,
//! idempotency_key)`, the lease fence, the entry's `INSERT … ON CONFLICT DO
//! NOTHING`, `COMMIT`, and only then the answer. A process may be killed
//! at any step (its open transactions vanish; a `COMMIT` or a one-statement
//! create it had sent whole is finished, or dropped, by the database), a
//! connection may break before a statement runs or before its
//! acknowledgement comes back (`503`), a holder may hang past its lease,
//! and retention may pass and the purge delete the key's entry.
//!
//! # Bounds
//!
//! [`Bounds::default`] is what `cargo test` checks:
//!
//! | bound | value |
//! |---|---|
//! | users, keys | 1, 1 (keys share nothing but admission slots; see `docs/MODEL.md`) |
//! | clients | 2: client 0 sends body A; client 1 sends A (a duplicate) or B (the key reused) |
//! | attempts per client | 2 (a retry after `409 IN_PROGRESS`, `503`, a reset, or its own timeout) |
//! | server processes | 2, one database |
//! | crashes (process killed) | 1, at any step |
//! | lost connections (before a statement runs, or its acknowledgement) | 1 |
//! | holders hung past their lease | 1 |
//! | purges at retention | 1 |
//! | write admission slots per process | 1 (2 in one of the three runs of the correct design) |
//! | waiters per key per process | 1 |
//! | looks again at a key another process's unit holds | 1 |
//!
//! # Designs
//!
//! [`Design::Correct`] is the protocol as built; every other variant is a
//! known wrong design, and the tests assert that the checker finds the
//! counterexample each one allows, printed by [`trace::trace`].
//!
//! # Layout
//!
//! Each module uses only those above it:
//!
//! | module | what |
//! |---|---|
//! | [`design`] | what is checked: a [`Design`] within [`Bounds`] |
//! | [`spec`] | the key's answer as a sequential object (the linearizability check's reference) |
//! | [`state`] | the system's parts and state, and the questions asked of it |
//! | [`properties`] | what the protocol promises, as properties of states |
//! | [`model`] | the steps, and the Stateright model that ties steps and properties together |
//! | [`trace`] | a counterexample as numbered steps |
//!
//! [Stateright]: https://docs.rs/stateright

pub mod design;
pub mod model;
pub mod properties;
pub mod spec;
pub mod state;
pub mod trace;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use stateright::{Checker, Model};
use stateright::{HasDiscoveries, Path};

pub use design::{Bounds, Design, LedgerModel};
pub use model::Action;
pub use state::State;

/// What one exhaustive run found.
#[derive(Debug)]
pub struct Run {
    /// Distinct states reached (by [`find`]: summed over its searches).
    pub unique_states: usize,
    /// States generated, repeats included (summed likewise).
    pub states: usize,
    /// The longest path explored.
    pub max_depth: usize,
    pub elapsed: Duration,
    /// Each property with a counterexample, and the shortest path to it.
    pub discoveries: BTreeMap<&'static str, Path<State, Action>>,
}

impl Run {
    /// One line for logs and notes.
    pub fn summary(&self) -> String {
        format!(
            "{} distinct states ({} generated), depth {}, {:.1?}",
            self.unique_states, self.states, self.max_depth, self.elapsed
        )
    }
}

/// Explores every state `model` can reach, depth first on `threads`
/// threads, with the processes' symmetry reduced (states that differ only
/// by which process is which are checked once).
pub fn check_all(model: LedgerModel, threads: usize) -> Run {
    let start = Instant::now();
    let checker = model
        .checker()
        .threads(threads.max(1))
        .symmetry_fn(model::representative)
        .spawn_dfs()
        .join();
    run(&checker, start)
}

/// Searches `model` for a counterexample to `property`, breadth first with
/// a depth bound raised one step at a time, so the counterexample found is
/// a shortest one (Stateright keeps the last path it found for a property,
/// which within one unbounded search may be longer). Without one, the last
/// search is unbounded and has seen every state.
pub fn find(model: LedgerModel, threads: usize, property: &'static str) -> Run {
    let start = Instant::now();
    let (mut unique, mut states) = (0, 0);
    let mut depth = 2;
    loop {
        let bounded = depth <= MAX_DEPTH;
        let mut builder = model
            .checker()
            .threads(threads.max(1))
            .finish_when(HasDiscoveries::AnyOf([property].into_iter().collect()));
        if bounded {
            builder = builder.target_max_depth(depth);
        }
        let checker = builder.spawn_bfs().join();
        let mut found = run(&checker, start);
        unique += found.unique_states;
        states += found.states;
        if !bounded || found.discoveries.contains_key(property) {
            // What every search took together.
            found.unique_states = unique;
            found.states = states;
            return found;
        }
        depth += 1;
    }
}

/// Past this depth [`find`] searches without a bound: deeper than any
/// counterexample the tests expect.
const MAX_DEPTH: usize = 16;

fn run(checker: &impl Checker<LedgerModel>, start: Instant) -> Run {
    Run {
        unique_states: checker.unique_state_count(),
        states: checker.state_count(),
        max_depth: checker.max_depth(),
        elapsed: start.elapsed(),
        discoveries: checker.discoveries().into_iter().collect(),
    }
}
