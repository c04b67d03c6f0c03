//! The keys this process is running a request for, so that a duplicate in
//! the same process waits for the first holding nothing — no thread, no
//! connection, no write slot — and is woken the moment the first is over.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

/// `(user, key)` of every request of this process between its start and
/// its answer, with the requests waiting for it. As many entries as
/// requests hold keys; each key has at most `waiters_per_key` waiters.
#[derive(Debug)]
pub struct InFlight {
    running: Mutex<HashMap<(String, String), Holder>>,
    waiters_per_key: usize,
    next_token: AtomicU64,
}

/// The request holding a key, as its waiters see it.
#[derive(Debug)]
struct Holder {
    token: u64,
    /// When it entered: past its lease, a holder is waited for no longer
    /// (the ledger's fence keeps a hung holder from recording afterwards).
    since: Instant,
    /// Closed when the holder is over (its sender is dropped).
    over: watch::Receiver<()>,
    waiting: Arc<AtomicUsize>,
}

/// This request's hold on its key; dropping it wakes every request waiting
/// for it.
#[derive(Debug)]
pub struct Running {
    in_flight: Arc<InFlight>,
    id: (String, String),
    token: u64,
    _over: watch::Sender<()>,
}

impl Drop for Running {
    fn drop(&mut self) {
        let mut running = self.in_flight.lock();
        if running
            .get(&self.id)
            .is_some_and(|holder| holder.token == self.token)
        {
            running.remove(&self.id);
        }
        // `_over` is dropped after this: the waiters wake to a free key.
    }
}

/// How [`InFlight::enter`] ended.
#[derive(Debug)]
pub enum Entered {
    /// This request holds the key until the [`Running`] is dropped.
    Holder(Running),
    /// Another request still held the key at the deadline.
    GaveUp,
    /// The key already had as many waiters as it may.
    Crowded,
}

/// Counts one waiter of a key for as long as it waits (also when its
/// request is cancelled mid-wait).
struct Waiting(Arc<AtomicUsize>);

impl Drop for Waiting {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl InFlight {
    pub fn new(waiters_per_key: usize) -> Self {
        Self {
            running: Mutex::default(),
            waiters_per_key,
            next_token: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<(String, String), Holder>> {
        // Nothing panics while it is held; a poisoned map is still whole.
        self.running
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Enters `(user, key)`, first waiting (until `deadline`) for every
    /// request of this process that holds it and is still within its
    /// `lease`. A key that already has its full count of waiters is
    /// [`Entered::Crowded`] at once.
    pub async fn enter(
        self: &Arc<Self>,
        user: &str,
        key: &str,
        deadline: Instant,
        lease: Duration,
    ) -> Entered {
        let id = (user.to_owned(), key.to_owned());
        loop {
            let (mut over, _waiting, lease_end) = {
                let mut running = self.lock();
                match running.get(&id) {
                    Some(holder) if holder.since.elapsed() < lease => {
                        let counted = holder
                            .waiting
                            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                                (n < self.waiters_per_key).then_some(n + 1)
                            })
                            .is_ok();
                        if !counted {
                            return Entered::Crowded;
                        }
                        (
                            holder.over.clone(),
                            Waiting(Arc::clone(&holder.waiting)),
                            holder.since + lease,
                        )
                    }
                    // Free, or held past its lease: this request takes it.
                    _ => {
                        let token = self.next_token.fetch_add(1, Ordering::SeqCst);
                        let (sender, receiver) = watch::channel(());
                        running.insert(
                            id.clone(),
                            Holder {
                                token,
                                since: Instant::now(),
                                over: receiver,
                                waiting: Arc::default(),
                            },
                        );
                        return Entered::Holder(Running {
                            in_flight: Arc::clone(self),
                            id,
                            token,
                            _over: sender,
                        });
                    }
                }
            };
            #[cfg(feature = "fault-points")]
            crate::fault::pass(crate::fault::Point::Waiting, key).await;
            // Resolves (with an error) when the holder's sender is dropped.
            let ended = tokio::time::timeout_at(deadline.min(lease_end), over.changed()).await;
            if ended.is_err() && Instant::now() >= deadline {
                return Entered::GaveUp;
            }
        }
    }

    /// Whether a request of this process holds `(user, key)` now.
    pub fn is_held(&self, user: &str, key: &str) -> bool {
        self.lock().contains_key(&(user.to_owned(), key.to_owned()))
    }

    /// Requests holding a key now.
    pub fn holders(&self) -> usize {
        self.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: Duration = Duration::from_secs(30);

    fn holds(entered: &Entered) -> bool {
        matches!(entered, Entered::Holder(_))
    }

    #[tokio::test]
    async fn a_second_entry_waits_for_the_first_and_gives_up_at_its_deadline() {
        let in_flight = Arc::new(InFlight::new(8));
        let soon = || Instant::now() + Duration::from_millis(20);
        let first = in_flight.enter("alice", "k", soon(), LEASE).await;
        assert!(holds(&first));
        assert!(matches!(
            in_flight.enter("alice", "k", soon(), LEASE).await,
            Entered::GaveUp
        ));
        assert!(
            holds(&in_flight.enter("bob", "k", soon(), LEASE).await),
            "another user's key"
        );
        let waiting = {
            let in_flight = Arc::clone(&in_flight);
            tokio::spawn(async move {
                holds(
                    &in_flight
                        .enter("alice", "k", Instant::now() + LEASE, LEASE)
                        .await,
                )
            })
        };
        // The waiter is counted before the first ends: its end wakes it.
        while in_flight
            .lock()
            .get(&("alice".to_owned(), "k".to_owned()))
            .is_some_and(|h| h.waiting.load(Ordering::SeqCst) == 0)
        {
            tokio::task::yield_now().await;
        }
        drop(first);
        assert!(
            waiting.await.unwrap_or(false),
            "the waiter entered once the first was over"
        );
        assert_eq!(in_flight.holders(), 0);
    }

    #[tokio::test]
    async fn past_its_waiter_cap_a_key_is_crowded_at_once() {
        let in_flight = Arc::new(InFlight::new(1));
        let far = Instant::now() + LEASE;
        let first = in_flight.enter("alice", "k", far, LEASE).await;
        let waiter = {
            let in_flight = Arc::clone(&in_flight);
            tokio::spawn(async move { holds(&in_flight.enter("alice", "k", far, LEASE).await) })
        };
        while in_flight
            .lock()
            .get(&("alice".to_owned(), "k".to_owned()))
            .is_some_and(|h| h.waiting.load(Ordering::SeqCst) == 0)
        {
            tokio::task::yield_now().await;
        }
        assert!(matches!(
            in_flight.enter("alice", "k", far, LEASE).await,
            Entered::Crowded
        ));
        drop(first);
        assert!(waiter.await.unwrap_or(false));
    }

    /// A waiter sleeps until its holder is over, its holder's lease ends or
    /// its own deadline passes; it never re-checks the key in a loop. On
    /// tokio's paused clock time moves only while every task sleeps, so a
    /// waiter that looped would hold the clock still and never reach its
    /// deadline: the test would wait for it in vain (the real-time bound
    /// below only ends that wait).
    #[test]
    fn a_waiter_sleeps_until_its_deadline_and_never_spins() {
        let (done, finished) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .start_paused(true)
                .build()
                .expect("a runtime");
            let outcome = rt.block_on(async {
                let in_flight = Arc::new(InFlight::new(8));
                let holder = in_flight
                    .enter("alice", "k", Instant::now() + LEASE, LEASE)
                    .await;
                let deadline = Instant::now() + Duration::from_secs(5);
                let waited = in_flight.enter("alice", "k", deadline, LEASE).await;
                let outcome = (
                    matches!(waited, Entered::GaveUp),
                    Instant::now() >= deadline,
                );
                drop(holder);
                outcome
            });
            let _ = done.send(outcome);
        });
        let outcome = finished
            .recv_timeout(Duration::from_secs(60))
            .expect("the waiter reached its deadline on the paused clock");
        assert_eq!(outcome, (true, true), "(gave up, at its deadline)");
    }

    #[tokio::test]
    async fn a_waiter_takes_the_key_over_when_the_holder_outlives_its_lease() {
        let in_flight = Arc::new(InFlight::new(8));
        let lease = Duration::from_millis(50);
        let far = Instant::now() + LEASE;
        let hung = in_flight.enter("alice", "k", far, lease).await;
        assert!(holds(&hung));
        assert_eq!(in_flight.holders(), 1);
        // It waits for the hung holder until the holder's lease ends, then
        // takes the key over, long before its own deadline.
        let next = in_flight.enter("alice", "k", far, lease).await;
        assert!(holds(&next), "{next:?}");
        assert_eq!(in_flight.holders(), 1, "one holder of the key");
    }

    #[tokio::test]
    async fn a_holder_past_its_lease_is_waited_for_no_longer() {
        let in_flight = Arc::new(InFlight::new(8));
        let lease = Duration::ZERO;
        let far = Instant::now() + LEASE;
        let hung = in_flight.enter("alice", "k", far, lease).await;
        let next = in_flight.enter("alice", "k", far, lease).await;
        assert!(holds(&hung) && holds(&next));
        drop(hung);
        assert!(
            matches!(
                in_flight.enter("alice", "k", Instant::now(), LEASE).await,
                Entered::GaveUp
            ),
            "the old holder's end does not free the new holder's key"
        );
    }
}
