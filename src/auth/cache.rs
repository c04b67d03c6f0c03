//! What the database said about a token, remembered in memory for a short
//! time, so that a request authenticates without a trip to the database;
//! and the bound on the lookups that do make that trip.
//!
//! **Revocation.** A token revoked (by `keys revoke`, in any process) keeps
//! working in a process that saw it in use for at most the cache's time to
//! live after the revocation committed — one second by default
//! (`AUTH_CACHE_SECS`; `0` turns the cache off). The time to live counts
//! from the moment the lookup *began*, before the database read it: a read
//! that began before the revocation (and so saw the token live) cannot
//! remember it for longer than a time to live after the revocation, however
//! late its answer is remembered. And what a lookup remembers never
//! replaces what a lookup that began after it remembered: once a process
//! has seen a token revoked, an older read that still saw it live cannot
//! bring it back.
//!
//! **Unknown tokens.** A token the database does not know (never issued, or
//! revoked) is remembered as unknown for the same time, so a client that
//! keeps sending one costs one read per time to live. No token can be
//! remembered as unknown before it is issued (its 256 random bits are first
//! seen when `keys create` prints them), so a new key works at once.
//!
//! **Lookups.** A token this process never saw live (a flood of random
//! tokens is all such) is looked up only while fewer than
//! [`TokenCache::max_first_lookups`] such lookups run; past that the
//! request waits its turn — holding no blocking thread and no database
//! connection — at most the wait it is given (the connection timeout), and
//! is answered `503` with `Retry-After` when its turn has not come. A token
//! seen live before is looked up again (once its time to live is over)
//! outside that bound, so a flood of unknown tokens never keeps a known one
//! out; and a request that waited finds the answer a lookup of its token
//! remembered meanwhile, so a burst of requests with one new token costs
//! one lookup or two, not one each.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The most tokens remembered at once, live and unknown each; past that the
/// expired ones, then all of that kind, are forgotten.
pub const CAPACITY: usize = 10_000;

/// For a pool of `pool_size` connections: how many lookups of tokens never
/// seen live may run at once (a quarter of the pool, at least one).
pub fn first_lookups_for_pool(pool_size: u32) -> usize {
    usize::try_from(pool_size / 4).unwrap_or(usize::MAX).max(1)
}

/// What is remembered about a token hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cached {
    /// The database accepted it for this user less than a time to live ago.
    User(String),
    /// The database did not know it (or it was revoked) less than a time to
    /// live ago.
    Unknown,
}

/// One remembered answer: what it was, when its lookup began (in the
/// order lookups began), and until when it counts.
#[derive(Debug, Clone)]
struct Entry<T> {
    value: T,
    began: u64,
    expires: Instant,
}

#[derive(Debug, Default)]
struct Remembered {
    /// Hashes the database accepted, by user. An expired entry still says
    /// that the token was live once (its next lookup is not a first one).
    live: HashMap<String, Entry<String>>,
    /// Hashes the database did not know.
    unknown: HashMap<String, Entry<()>>,
}

impl Remembered {
    /// The order in which the lookup that wrote the entry of `hash` began.
    fn began(&self, hash: &str) -> Option<u64> {
        let live = self.live.get(hash).map(|e| e.began);
        let unknown = self.unknown.get(hash).map(|e| e.began);
        live.max(unknown)
    }
}

type Clock = Arc<dyn Fn() -> Instant + Send + Sync>;

/// Token hashes → what the database said about them, each until its expiry.
pub struct TokenCache {
    ttl: Duration,
    clock: Clock,
    remembered: Mutex<Remembered>,
    /// Numbers the lookups in the order they began.
    lookups_begun: AtomicU64,
    /// One permit per lookup of a token never seen live that may run at once.
    first_lookups: Arc<Semaphore>,
    max_first_lookups: usize,
}

impl std::fmt::Debug for TokenCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenCache")
            .field("ttl", &self.ttl)
            .field("max_first_lookups", &self.max_first_lookups)
            .finish_non_exhaustive()
    }
}

/// The right to look one token up; dropping it frees its place.
#[derive(Debug)]
pub struct LookupPermit {
    /// Its place among the lookups of tokens never seen live: `None` for a
    /// token seen live before.
    _first: Option<OwnedSemaphorePermit>,
}

impl TokenCache {
    /// Remembers answers for `ttl` (nothing when it is zero) and lets at
    /// most `max_first_lookups` lookups of tokens never seen live run at
    /// once.
    pub fn new(ttl: Duration, max_first_lookups: usize) -> Self {
        Self::with_clock(ttl, max_first_lookups, Arc::new(Instant::now))
    }

    fn with_clock(ttl: Duration, max_first_lookups: usize, clock: Clock) -> Self {
        Self {
            ttl,
            clock,
            remembered: Mutex::default(),
            lookups_begun: AtomicU64::new(0),
            first_lookups: Arc::new(Semaphore::new(max_first_lookups.max(1))),
            max_first_lookups: max_first_lookups.max(1),
        }
    }

    /// How many lookups of tokens never seen live may run at once.
    pub fn max_first_lookups(&self) -> usize {
        self.max_first_lookups
    }

    /// What the database said about `token_hash` less than a time to live
    /// ago, if anything.
    pub fn get(&self, token_hash: &str) -> Option<Cached> {
        if self.ttl.is_zero() {
            return None;
        }
        let now = (self.clock)();
        let remembered = self.remembered.lock().ok()?;
        if let Some(entry) = remembered.live.get(token_hash)
            && now < entry.expires
        {
            return Some(Cached::User(entry.value.clone()));
        }
        remembered
            .unknown
            .get(token_hash)
            .filter(|entry| now < entry.expires)
            .map(|_| Cached::Unknown)
    }

    /// The right to look `token_hash` up in the database, now: at once for
    /// a token seen live before; for any other, only while fewer than
    /// [`TokenCache::max_first_lookups`] such lookups run (`None` past it).
    pub fn try_permit(&self, token_hash: &str) -> Option<LookupPermit> {
        if self.seen_live(token_hash) {
            return Some(LookupPermit { _first: None });
        }
        let first = Arc::clone(&self.first_lookups).try_acquire_owned().ok()?;
        Some(LookupPermit {
            _first: Some(first),
        })
    }

    /// [`TokenCache::try_permit`], or else its turn among the lookups of
    /// tokens never seen live, waited for (holding nothing but the task) at
    /// most `wait`: `None` when it did not come.
    pub async fn permit(&self, token_hash: &str, wait: Duration) -> Option<LookupPermit> {
        if let Some(permit) = self.try_permit(token_hash) {
            return Some(permit);
        }
        let first = Arc::clone(&self.first_lookups).acquire_owned();
        let first = tokio::time::timeout(wait, first).await.ok()?.ok()?;
        Some(LookupPermit {
            _first: Some(first),
        })
    }

    fn seen_live(&self, token_hash: &str) -> bool {
        self.remembered
            .lock()
            .is_ok_and(|r| r.live.contains_key(token_hash))
    }

    /// Looks `token_hash` up with `read` (the database's answer: its live
    /// user, or `None`) and remembers the answer, for a time to live that
    /// counts from now, before `read` runs — unless a lookup of the same
    /// hash that began later has remembered its answer meanwhile.
    pub fn look_up<E>(
        &self,
        permit: LookupPermit,
        token_hash: &str,
        read: impl FnOnce() -> Result<Option<String>, E>,
    ) -> Result<Option<String>, E> {
        let began = self.lookups_begun.fetch_add(1, Ordering::SeqCst);
        let expires = (self.clock)() + self.ttl;
        let user = read()?;
        #[cfg(feature = "test-hooks")]
        super::hooks::after_read(token_hash);
        self.remember(token_hash, user.as_deref(), began, expires);
        drop(permit);
        Ok(user)
    }

    /// Remembers an answer (even without a time to live: an entry that
    /// has expired still says the token was live once).
    fn remember(&self, token_hash: &str, user: Option<&str>, began: u64, expires: Instant) {
        let Ok(mut remembered) = self.remembered.lock() else {
            return;
        };
        if remembered
            .began(token_hash)
            .is_some_and(|later| later > began)
        {
            return;
        }
        let now = (self.clock)();
        match user {
            Some(user) => {
                remembered.unknown.remove(token_hash);
                let entry = Entry {
                    value: user.to_owned(),
                    began,
                    expires,
                };
                insert_bounded(&mut remembered.live, token_hash, entry, now);
            }
            None => {
                remembered.live.remove(token_hash);
                let entry = Entry {
                    value: (),
                    began,
                    expires,
                };
                insert_bounded(&mut remembered.unknown, token_hash, entry, now);
            }
        }
    }
}

/// Inserts `entry`, first forgetting the expired entries when the map is
/// full, and all of them when it is still full.
fn insert_bounded<T>(
    map: &mut HashMap<String, Entry<T>>,
    key: &str,
    entry: Entry<T>,
    now: Instant,
) {
    if map.len() >= CAPACITY && !map.contains_key(key) {
        map.retain(|_, e| now < e.expires);
        if map.len() >= CAPACITY {
            map.clear();
        }
    }
    map.insert(key.to_owned(), entry);
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU64;

    use super::*;
    use crate::auth::{self, KeyRef};
    use crate::db::{self, DatabaseUrl, Pool, PoolOptions};

    /// A clock the test moves.
    #[derive(Clone)]
    struct TestClock {
        start: Instant,
        elapsed_ms: Arc<AtomicU64>,
    }

    impl TestClock {
        fn new() -> Self {
            Self {
                start: Instant::now(),
                elapsed_ms: Arc::default(),
            }
        }

        fn advance(&self, by: Duration) {
            let ms = u64::try_from(by.as_millis()).unwrap();
            self.elapsed_ms.fetch_add(ms, Ordering::SeqCst);
        }

        fn cache(&self, ttl: Duration) -> TokenCache {
            let clock = self.clone();
            TokenCache::with_clock(
                ttl,
                2,
                Arc::new(move || {
                    clock.start + Duration::from_millis(clock.elapsed_ms.load(Ordering::SeqCst))
                }),
            )
        }
    }

    const TTL: Duration = Duration::from_secs(1);

    /// A migrated SQLite database of this test's own, with one key of
    /// `alice`; removed when dropped.
    struct Db {
        path: std::path::PathBuf,
        pool: Pool,
        token: String,
    }

    impl Db {
        fn new() -> Self {
            let path = std::env::temp_dir().join(format!(
                "orders-auth-cache-{}.db",
                uuid::Uuid::new_v4().simple()
            ));
            let url = DatabaseUrl::parse(&path.display().to_string()).unwrap();
            db::run_migrations(&url).unwrap();
            let options = PoolOptions {
                max_size: 2,
                connection_timeout: Duration::from_secs(10),
                lease: Duration::from_secs(30),
                write_queue: db::writer::DEFAULT_QUEUE_CAPACITY,
                shown: url.to_string(),
            };
            let pool = db::connect(&url, &options).unwrap();
            let token = auth::create(&mut pool.get().unwrap().conn(), "alice").unwrap();
            Self { path, pool, token }
        }

        fn hash(&self) -> String {
            auth::hash_token(&self.token)
        }

        /// What the database says about the token now.
        fn read(&self) -> Result<Option<String>, diesel::result::Error> {
            auth::user_of_hash(&mut self.pool.get().unwrap().conn(), &self.hash())
        }

        fn revoke(&self) {
            let key = KeyRef::parse(&self.token).unwrap();
            let revoked = auth::revoke(&mut self.pool.get().unwrap().conn(), &key).unwrap();
            assert!(matches!(revoked, auth::Revocation::Revoked { .. }));
        }
    }

    impl Drop for Db {
        fn drop(&mut self) {
            for suffix in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{}{suffix}", self.path.display()));
            }
        }
    }

    /// The interleaving of issue 29.6: a lookup reads the token live, the
    /// token is revoked, a second lookup reads it revoked and remembers
    /// that, and only then the first one remembers what it read. The
    /// revocation stands: the older read does not bring the token back.
    /// Before, the last answer remembered won, and the revoked token was
    /// accepted for a whole time to live more.
    #[test]
    fn a_lookup_that_read_before_a_revocation_never_undoes_what_a_later_lookup_remembered() {
        let db = Db::new();
        let cache = TestClock::new().cache(TTL);
        let hash = db.hash();

        let first = cache.look_up(cache.try_permit(&hash).unwrap(), &hash, || {
            let live = db.read();
            db.revoke();
            let second = cache.look_up(cache.try_permit(&hash).unwrap(), &hash, || db.read());
            assert_eq!(second.unwrap(), None, "the second lookup reads it revoked");
            assert_eq!(cache.get(&hash), Some(Cached::Unknown));
            live
        });

        assert_eq!(
            first.unwrap().as_deref(),
            Some("alice"),
            "the first read saw it live"
        );
        assert_eq!(
            cache.get(&hash),
            Some(Cached::Unknown),
            "the revocation stands"
        );
    }

    /// A lookup whose read began before a revocation remembers the token
    /// for at most a time to live from when it began: remembered a whole
    /// time to live later (a thread descheduled between its read and its
    /// remembering), it is already expired. Before, the time to live
    /// counted from the remembering, and the revoked token was accepted up
    /// to a time to live after that.
    #[test]
    fn a_token_read_live_is_remembered_for_a_time_to_live_from_when_its_lookup_began() {
        let db = Db::new();
        let clock = TestClock::new();
        let cache = clock.cache(TTL);
        let hash = db.hash();

        let read = cache.look_up(cache.try_permit(&hash).unwrap(), &hash, || {
            let live = db.read();
            db.revoke();
            clock.advance(TTL);
            live
        });

        assert_eq!(read.unwrap().as_deref(), Some("alice"));
        assert_eq!(cache.get(&hash), None, "a revoked token outlived the bound");
        let again = cache.look_up(cache.try_permit(&hash).unwrap(), &hash, || db.read());
        assert_eq!(again.unwrap(), None);
        assert_eq!(cache.get(&hash), Some(Cached::Unknown));
    }

    #[test]
    fn a_remembered_answer_is_forgotten_after_its_time_to_live() {
        let clock = TestClock::new();
        let cache = clock.cache(TTL);
        let remember = |hash: &str, user: Option<&str>| {
            let user = user.map(str::to_owned);
            let permit = cache.try_permit(hash).unwrap();
            cache.look_up(permit, hash, || Ok::<_, ()>(user)).unwrap();
        };
        remember("h", Some("alice"));
        remember("u", None);
        assert_eq!(cache.get("h"), Some(Cached::User("alice".into())));
        assert_eq!(cache.get("u"), Some(Cached::Unknown));
        assert_eq!(cache.get("other"), None);
        clock.advance(TTL - Duration::from_millis(1));
        assert_eq!(cache.get("h"), Some(Cached::User("alice".into())));
        clock.advance(Duration::from_millis(1));
        assert_eq!((cache.get("h"), cache.get("u")), (None, None));
    }

    /// Without a time to live every request is looked up, and a token seen
    /// live is still known: its lookups are never kept out by the bound.
    #[test]
    fn a_zero_time_to_live_answers_nothing_from_memory_but_still_knows_a_live_token() {
        let cache = TokenCache::new(Duration::ZERO, 1);
        let permit = cache.try_permit("h").unwrap();
        cache
            .look_up(permit, "h", || Ok::<_, ()>(Some("alice".into())))
            .unwrap();
        assert_eq!(cache.get("h"), None);
        let _flood = cache.try_permit("random").unwrap();
        assert!(cache.try_permit("h").is_some());
    }

    /// Lookups of tokens never seen live are bounded; a token seen live
    /// once is looked up again outside the bound, so a flood of unknown
    /// tokens never keeps it out.
    #[test]
    fn lookups_of_tokens_never_seen_live_are_bounded_and_a_known_token_is_never_kept_out() {
        let clock = TestClock::new();
        let cache = clock.cache(TTL);
        let known = cache.try_permit("known").unwrap();
        cache
            .look_up(known, "known", || Ok::<_, ()>(Some("alice".into())))
            .unwrap();
        clock.advance(TTL);
        assert_eq!(
            cache.get("known"),
            None,
            "expired: it must be looked up again"
        );

        let flood: Vec<LookupPermit> = (0..cache.max_first_lookups())
            .map(|i| cache.try_permit(&format!("random-{i}")).unwrap())
            .collect();
        assert!(cache.try_permit("random-more").is_none(), "past the bound");
        assert!(
            cache.try_permit("known").is_some(),
            "a known token is never kept out"
        );
        drop(flood);
        assert!(cache.try_permit("random-more").is_some());
    }

    /// Past the bound a lookup waits its turn, and gets it when a running
    /// one ends; one whose wait is over gets none.
    #[test]
    fn a_lookup_past_the_bound_waits_its_turn_for_at_most_its_wait() {
        actix_web::rt::System::new().block_on(async {
            let cache = TokenCache::new(TTL, 1);
            let running = cache.try_permit("a").unwrap();
            assert!(cache.permit("b", Duration::ZERO).await.is_none(), "no turn");

            let waiting = cache.permit("b", Duration::from_secs(60));
            let release = async {
                // The waiter is queued by now; the running lookup ends.
                actix_web::rt::task::yield_now().await;
                drop(running);
            };
            let (turn, ()) = futures_util::future::join(waiting, release).await;
            assert!(
                turn.is_some(),
                "its turn came when the running lookup ended"
            );
        });
    }

    #[test]
    fn a_full_cache_stays_within_its_capacity_and_unknown_tokens_never_evict_live_ones() {
        let cache = TokenCache::new(Duration::from_secs(60), 1);
        let remember = |hash: &str, user: Option<&str>| {
            let user = user.map(str::to_owned);
            let permit = cache.try_permit(hash).unwrap();
            cache.look_up(permit, hash, || Ok::<_, ()>(user)).unwrap();
        };
        remember("alice", Some("alice"));
        for i in 0..CAPACITY + 10 {
            remember(&format!("random-{i}"), None);
        }
        let remembered = cache.remembered.lock().unwrap();
        assert!(remembered.unknown.len() <= CAPACITY);
        assert!(remembered.live.contains_key("alice"));
    }

    #[test]
    fn a_quarter_of_the_pool_at_least_one_looks_up_tokens_never_seen_live() {
        assert_eq!(first_lookups_for_pool(10), 2);
        assert_eq!(first_lookups_for_pool(8), 2);
        assert_eq!(first_lookups_for_pool(1), 1);
    }
}
