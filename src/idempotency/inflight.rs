//! The keys this process is running a request for, so that a duplicate in
//! the same process waits for the first without a database connection: on
//! the key's entry here, woken the moment the first is over.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// `(user, key)` of every request of this [`super::Ledger`] between its
/// start and its answer. As many entries as requests are running: bounded
/// by the writes the process admits.
#[derive(Debug, Default)]
pub struct InFlight {
    running: Mutex<HashMap<(String, String), Arc<Slot>>>,
}

#[derive(Debug)]
struct Slot {
    over: Mutex<bool>,
    ended: Condvar,
    /// When its request entered: past its lease, a request is waited for no
    /// longer (a hung holder keeps a key no longer than it may hold the
    /// claim; the ledger's fence keeps it from recording afterwards).
    since: Instant,
}

impl Slot {
    fn new() -> Self {
        Self {
            over: Mutex::new(false),
            ended: Condvar::new(),
            since: Instant::now(),
        }
    }
}

impl Slot {
    /// Waits until the request is over (`true`) or `deadline` (`false`).
    fn wait_until(&self, deadline: Instant) -> bool {
        let Ok(mut over) = self.over.lock() else {
            return false;
        };
        while !*over {
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                return false;
            };
            over = match self.ended.wait_timeout(over, left) {
                Ok((over, _)) => over,
                Err(_) => return false,
            };
        }
        true
    }
}

/// This request's entry; dropping it wakes every request waiting for it.
#[derive(Debug)]
pub struct Running {
    in_flight: Arc<InFlight>,
    id: (String, String),
    slot: Arc<Slot>,
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Ok(mut running) = self.in_flight.running.lock()
            && running
                .get(&self.id)
                .is_some_and(|slot| Arc::ptr_eq(slot, &self.slot))
        {
            running.remove(&self.id);
        }
        if let Ok(mut over) = self.slot.over.lock() {
            *over = true;
        }
        self.slot.ended.notify_all();
    }
}

impl InFlight {
    /// Enters `(user, key)`, first waiting (until `deadline`) for every
    /// request of this process that holds it and is still within its
    /// `lease`; `None` when one still does at `deadline`.
    pub fn enter(
        self: &Arc<Self>,
        user: &str,
        key: &str,
        deadline: Instant,
        lease: Duration,
    ) -> Option<Running> {
        let id = (user.to_owned(), key.to_owned());
        loop {
            let holder = {
                let mut running = self.running.lock().ok()?;
                match running.get(&id) {
                    Some(slot) if slot.since.elapsed() < lease => Arc::clone(slot),
                    // Free, or held past its lease: this request takes it.
                    _ => {
                        let slot = Arc::new(Slot::new());
                        running.insert(id.clone(), Arc::clone(&slot));
                        return Some(Running {
                            in_flight: Arc::clone(self),
                            id,
                            slot,
                        });
                    }
                }
            };
            let lease_end = holder.since.checked_add(lease).unwrap_or(deadline);
            if !holder.wait_until(deadline.min(lease_end)) && Instant::now() >= deadline {
                return None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: Duration = Duration::from_secs(30);

    #[test]
    fn a_second_entry_waits_for_the_first_and_gives_up_at_its_deadline() {
        let in_flight = Arc::new(InFlight::default());
        let soon = || Instant::now() + Duration::from_millis(20);
        let first = in_flight.enter("alice", "k", soon(), LEASE);
        assert!(first.is_some());
        assert!(in_flight.enter("alice", "k", soon(), LEASE).is_none());
        assert!(
            in_flight.enter("bob", "k", soon(), LEASE).is_some(),
            "another user's key"
        );
        let later = std::thread::scope(|s| {
            let waiting = s.spawn(|| {
                in_flight
                    .enter("alice", "k", Instant::now() + LEASE, LEASE)
                    .is_some()
            });
            std::thread::sleep(Duration::from_millis(20));
            drop(first);
            waiting.join().unwrap_or(false)
        });
        assert!(later, "the waiter entered once the first was over");
        assert!(
            in_flight
                .running
                .lock()
                .map(|r| r.is_empty())
                .unwrap_or(false)
        );
    }

    #[test]
    fn a_holder_past_its_lease_is_waited_for_no_longer() {
        let in_flight = Arc::new(InFlight::default());
        let lease = Duration::from_millis(20);
        let far = Instant::now() + LEASE;
        let hung = in_flight.enter("alice", "k", far, lease);
        let next = in_flight.enter("alice", "k", far, lease);
        assert!(hung.is_some() && next.is_some());
        drop(hung);
        assert!(
            in_flight
                .enter("alice", "k", Instant::now(), LEASE)
                .is_none(),
            "the old holder's end does not free the new holder's key"
        );
    }
}
