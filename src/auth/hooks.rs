//! Test builds only (the `test-hooks` feature, which the integration tests
//! turn on; never a release binary): a token lookup paused between its
//! database read and remembering the answer, while it still holds its
//! database connection, its blocking thread and its lookup permit — so
//! that a test orders events (a revocation, other lookups, other requests)
//! around it instead of racing them.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// How long a paused lookup waits for its test at most: a test that forgot
/// to release it fails slowly instead of hanging.
const PAUSED_AT_MOST: Duration = Duration::from_secs(120);

#[derive(Debug, Default)]
struct State {
    paused: usize,
    released: bool,
}

#[derive(Debug, Default)]
struct Shared {
    state: Mutex<State>,
    changed: Condvar,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Token hashes whose next lookup pauses, and the pause each belongs to.
static PAUSING: Mutex<Option<HashMap<String, Arc<Shared>>>> = Mutex::new(None);

fn pausing() -> MutexGuard<'static, Option<HashMap<String, Arc<Shared>>>> {
    PAUSING.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The next lookup of each of some tokens, paused after its read until
/// [`Pause::release`] (or until the pause is dropped).
#[derive(Debug)]
pub struct Pause {
    shared: Arc<Shared>,
    hashes: Vec<String>,
}

impl Pause {
    /// Pauses the next lookup of each of `tokens`, in any process-wide
    /// [`super::cache::TokenCache`].
    pub fn next_lookup_of<S: AsRef<str>>(tokens: &[S]) -> Self {
        let shared = Arc::new(Shared::default());
        let hashes: Vec<String> = tokens
            .iter()
            .map(|t| super::hash_token(t.as_ref()))
            .collect();
        let mut pausing = pausing();
        let map = pausing.get_or_insert_with(HashMap::new);
        for hash in &hashes {
            map.insert(hash.clone(), Arc::clone(&shared));
        }
        Self { shared, hashes }
    }

    /// Waits until `n` lookups are paused (`false` when `within` passed first).
    pub fn wait_until_paused(&self, n: usize, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        let mut state = self.shared.state();
        while state.paused < n {
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                return false;
            };
            state = self
                .shared
                .changed
                .wait_timeout(state, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        true
    }

    /// How many lookups are paused now.
    pub fn paused(&self) -> usize {
        self.shared.state().paused
    }

    /// Lets every paused lookup go on, and those still to come pass.
    pub fn release(&self) {
        if let Some(map) = pausing().as_mut() {
            for hash in &self.hashes {
                map.remove(hash);
            }
        }
        self.shared.state().released = true;
        self.shared.changed.notify_all();
    }
}

impl Drop for Pause {
    fn drop(&mut self) {
        self.release();
    }
}

/// Called by a lookup of `token_hash` after its read: pauses when a test
/// asked for it.
pub(super) fn after_read(token_hash: &str) {
    let Some(shared) = pausing().as_mut().and_then(|map| map.remove(token_hash)) else {
        return;
    };
    let mut state = shared.state();
    state.paused += 1;
    shared.changed.notify_all();
    let deadline = Instant::now() + PAUSED_AT_MOST;
    while !state.released {
        let Some(left) = deadline.checked_duration_since(Instant::now()) else {
            return;
        };
        state = shared
            .changed
            .wait_timeout(state, left)
            .unwrap_or_else(PoisonError::into_inner)
            .0;
    }
}
