//! Fault points, compiled only with the `fault-points` feature (test builds:
//! the server's test suite turns it on; a release binary never has it).
//!
//! A test [`hold`]s a point for one key; the first request with that key to
//! reach the point waits there until the test releases it (or drops the
//! [`Hold`]), and the test can wait until one has. Requests with other keys,
//! and later requests with the same key, pass.
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
    /// held, nothing else is.
    AfterEnter,
    /// In [`Ledger::execute`](crate::Ledger::execute), when a request
    /// begins waiting for another request of this process that holds its
    /// key: it is counted among the key's waiters and holds nothing else.
    /// Released, it goes on waiting for the holder as any waiter does.
    Waiting,
}

#[derive(Debug)]
struct State {
    /// Whether a request has reached the point (the first one stops there).
    reached: Mutex<bool>,
    reached_changed: Condvar,
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

/// Holds `point` for the next request with `key`.
pub fn hold(point: Point, key: &str) -> Hold {
    let state = Arc::new(State {
        reached: Mutex::new(false),
        reached_changed: Condvar::new(),
        released: watch::Sender::new(false),
    });
    let id = (point, key.to_owned());
    holds().insert(id.clone(), Arc::clone(&state));
    Hold { id, state }
}

impl Hold {
    /// Blocks until a request stops at the point; `false` after `timeout`.
    pub fn wait_reached(&self, timeout: Duration) -> bool {
        let reached = self.state.reached.lock().unwrap();
        let (reached, _) = self
            .state
            .reached_changed
            .wait_timeout_while(reached, timeout, |r| !*r)
            .unwrap();
        *reached
    }

    /// Lets the held request go on.
    pub fn release(self) {}
}

impl Drop for Hold {
    fn drop(&mut self) {
        holds().remove(&self.id);
        self.state.released.send_replace(true);
    }
}

/// Where a request passes `point`: the first with a held key stops here
/// until the hold is released.
pub(crate) async fn pass(point: Point, key: &str) {
    let state = holds().get(&(point, key.to_owned())).cloned();
    let Some(state) = state else { return };
    {
        let mut reached = state.reached.lock().unwrap();
        if *reached {
            return;
        }
        *reached = true;
        state.reached_changed.notify_all();
    }
    let mut released = state.released.subscribe();
    let _ = released.wait_for(|r| *r).await;
}
