//! Fault points, compiled only with the `fault-points` feature (test builds:
//! the server's test suite turns it on; a release binary never has it).
//!
//! A test [`hold`]s a point for one key; the first request (or writer
//! batch) with that key to reach the point waits there until the test
//! releases the hold (or drops it), or [`Hold::fail`]s it, and the test can
//! wait until one has. Others with that key, and later ones, pass. A
//! [`failing`] hold instead makes every arrival with its key fail at once,
//! for as long as it lives, and a [`frozen`] hold makes every arrival with
//! its key wait until it ends, as a frozen file system does.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use tokio::sync::watch;

/// Where a request can be held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Point {
    /// In [`Ledger::execute`](crate::Ledger::execute), right after the
    /// request took its key in this process (before its read): the key is
    /// held, nothing else is. Key: the idempotency key.
    AfterEnter,
    /// In [`Ledger::execute`](crate::Ledger::execute), when a request
    /// begins waiting for another request of this process that holds its
    /// key: it is counted among the key's waiters and holds nothing else.
    /// Released, it goes on waiting for the holder as any waiter does.
    /// Key: the idempotency key.
    Waiting,
    /// In the SQLite writer, right before a batch's `COMMIT` (its fence
    /// already says committing, its transaction holds the write lock): a
    /// `COMMIT` that does not return, as on a frozen disk. Released, the
    /// `COMMIT` runs; failed, it fails and the batch is rolled back, as a
    /// process that died there would leave it. Key: the database as the
    /// pool was given it (the SQLite file).
    BeforeCommit,
    /// In the SQLite writer, where a replacement thread opens its
    /// connection. Key: the database as the pool was given it.
    OpenWriter,
    /// In [`Ledger::execute_insert`](crate::Ledger::execute_insert) on
    /// PostgreSQL, right after the one-statement create returned (the
    /// statement autocommits: its row and entry are committed), on its
    /// blocking thread, its connection still checked out: an answer that
    /// does not come back (a commit waiting for a synchronous standby, a
    /// server that stopped answering). Released, the thread goes on as if
    /// the answer came; failed, as if the connection broke. Key: the
    /// idempotency key.
    AfterOneStatement,
    /// In [`Pool::get`](crate::db::Pool::get), right after a connection
    /// for reading was checked out, on the blocking thread that will read
    /// with it: a read that does not return, as on a frozen file system
    /// (the thread waits in the kernel, its connection checked out).
    /// Released, the read goes on; failed, the connection is answered
    /// unavailable. Key: the database as the pool names it in log lines
    /// ([`PoolOptions::shown`](crate::db::PoolOptions::shown)).
    Read,
}

/// The arrival at a point of a [`failing`] or [`Hold::fail`]ed hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Injected;

impl std::fmt::Display for Injected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a fault injected by a test")
    }
}

#[derive(Debug, Default)]
struct Gate {
    /// Whether one has reached the point (the first one stops there).
    reached: bool,
    /// How the hold ended: `None` while it holds.
    ended: Option<Result<(), Injected>>,
    /// How many wait at the point now.
    waiting: usize,
}

#[derive(Debug)]
struct State {
    /// Every arrival fails at once (a [`failing`] hold).
    failing: bool,
    /// Every arrival waits until the hold ends (a [`frozen`] hold).
    frozen: bool,
    gate: Mutex<Gate>,
    changed: Condvar,
    /// For an arrival on an async task, which must not block its thread.
    released: watch::Sender<bool>,
}

type Holds = HashMap<(Point, String), Arc<State>>;

fn holds() -> MutexGuard<'static, Holds> {
    static HOLDS: OnceLock<Mutex<Holds>> = OnceLock::new();
    HOLDS
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A held point; dropping it releases it.
#[derive(Debug)]
pub struct Hold {
    id: (Point, String),
    state: Arc<State>,
}

fn install(point: Point, key: &str, failing: bool, frozen: bool) -> Hold {
    let state = Arc::new(State {
        failing,
        frozen,
        gate: Mutex::default(),
        changed: Condvar::new(),
        released: watch::Sender::new(false),
    });
    let id = (point, key.to_owned());
    holds().insert(id.clone(), Arc::clone(&state));
    Hold { id, state }
}

/// Holds `point` for the next arrival with `key`.
pub fn hold(point: Point, key: &str) -> Hold {
    install(point, key, false, false)
}

/// Makes every arrival at `point` with `key` wait until the returned hold
/// ends (every thread reaching it, not only the first): a frozen file
/// system. Only for a point passed on a blocking thread.
pub fn frozen(point: Point, key: &str) -> Hold {
    install(point, key, false, true)
}

/// Makes every arrival at `point` with `key` fail at once while the
/// returned hold lives.
pub fn failing(point: Point, key: &str) -> Hold {
    install(point, key, true, false)
}

impl Hold {
    /// How many have reached the point and still wait there (a [`frozen`]
    /// hold counts every one).
    pub fn waiting(&self) -> usize {
        self.state.gate.lock().unwrap().waiting
    }

    /// Blocks until one reaches the point; `false` after `timeout`.
    pub fn wait_reached(&self, timeout: Duration) -> bool {
        let gate = self.state.gate.lock().unwrap();
        let (gate, _) = self
            .state
            .changed
            .wait_timeout_while(gate, timeout, |g| !g.reached)
            .unwrap();
        gate.reached
    }

    /// Lets the held one go on.
    pub fn release(self) {}

    /// Makes the held one's step fail.
    pub fn fail(self) {
        self.end(Err(Injected));
    }

    fn end(&self, how: Result<(), Injected>) {
        holds().remove(&self.id);
        let mut gate = self.state.gate.lock().unwrap();
        gate.ended.get_or_insert(how);
        self.state.changed.notify_all();
        drop(gate);
        self.state.released.send_replace(true);
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.end(Ok(()));
    }
}

fn state(point: Point, key: &str) -> Option<Arc<State>> {
    holds().get(&(point, key.to_owned())).cloned()
}

/// Marks the point reached; `true` for the first arrival, which stops.
fn arrive(state: &State) -> bool {
    let mut gate = state.gate.lock().unwrap();
    let first = !gate.reached;
    gate.reached = true;
    state.changed.notify_all();
    first
}

/// Where a request passes `point` on an async task: the first with a held
/// key stops here until the hold ends.
pub(crate) async fn pass(point: Point, key: &str) {
    let Some(state) = state(point, key) else {
        return;
    };
    if !arrive(&state) {
        return;
    }
    let mut released = state.released.subscribe();
    let _ = released.wait_for(|r| *r).await;
}

/// Where a thread passes `point`: the first with a held key blocks here
/// until the hold ends, and fails if it was failed; with a [`failing`]
/// hold, every one fails at once.
pub(crate) fn pass_blocking(point: Point, key: &str) -> Result<(), Injected> {
    let Some(state) = state(point, key) else {
        return Ok(());
    };
    let first = arrive(&state);
    if state.failing {
        return Err(Injected);
    }
    if !first && !state.frozen {
        return Ok(());
    }
    let mut gate = state.gate.lock().unwrap();
    gate.waiting = gate.waiting.saturating_add(1);
    let mut gate = state
        .changed
        .wait_while(gate, |g| g.ended.is_none())
        .unwrap();
    gate.waiting = gate.waiting.saturating_sub(1);
    gate.ended.unwrap_or(Ok(()))
}
