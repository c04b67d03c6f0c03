//! Live tokens remembered in memory for a short time, so that a request
//! authenticates without a trip to the database.
//!
//! The bound this trades for speed: a token revoked (by `keys revoke`, in
//! any process) keeps working in a process that saw it in use for at most
//! the cache's time to live — one second by default
//! (`AUTH_CACHE_SECS`; `0` turns the cache off). Only tokens the database
//! accepted are remembered; an unknown token is looked up every time, so a
//! key works the moment it is created.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The most tokens remembered at once; past that the oldest are dropped.
pub const CAPACITY: usize = 10_000;

/// Token hashes → the user they belong to, each until its expiry.
#[derive(Debug)]
pub struct TokenCache {
    ttl: Duration,
    entries: Mutex<HashMap<String, (String, Instant)>>,
}

impl TokenCache {
    pub fn new(ttl: Duration) -> Self {
        Self {
            ttl,
            entries: Mutex::new(HashMap::new()),
        }
    }

    /// The user of a token hash the database accepted less than the time to
    /// live ago.
    pub fn get(&self, token_hash: &str) -> Option<String> {
        if self.ttl.is_zero() {
            return None;
        }
        let entries = self.entries.lock().ok()?;
        entries
            .get(token_hash)
            .filter(|(_, expires)| Instant::now() < *expires)
            .map(|(user, _)| user.clone())
    }

    /// Remembers that the database accepted `token_hash` for `user` just now.
    pub fn insert(&self, token_hash: &str, user: &str) {
        if self.ttl.is_zero() {
            return;
        }
        let Ok(mut entries) = self.entries.lock() else {
            return;
        };
        let now = Instant::now();
        if entries.len() >= CAPACITY {
            entries.retain(|_, (_, expires)| now < *expires);
            if entries.len() >= CAPACITY {
                entries.clear();
            }
        }
        entries.insert(token_hash.to_owned(), (user.to_owned(), now + self.ttl));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_remembered_token_is_forgotten_after_its_time_to_live() {
        let cache = TokenCache::new(Duration::from_millis(50));
        cache.insert("h", "alice");
        assert_eq!(cache.get("h").as_deref(), Some("alice"));
        assert_eq!(cache.get("other"), None);
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(cache.get("h"), None);
    }

    #[test]
    fn a_zero_time_to_live_remembers_nothing() {
        let cache = TokenCache::new(Duration::ZERO);
        cache.insert("h", "alice");
        assert_eq!(cache.get("h"), None);
    }

    #[test]
    fn a_full_cache_stays_within_its_capacity() {
        let cache = TokenCache::new(Duration::from_secs(60));
        for i in 0..CAPACITY + 10 {
            cache.insert(&i.to_string(), "u");
        }
        assert!(cache.entries.lock().unwrap().len() <= CAPACITY);
    }
}
