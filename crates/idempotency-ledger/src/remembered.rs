//! Recorded entries remembered for a short time, so that the retries of a
//! recorded key are answered without a trip to the database.
//!
//! **Why an entry may be remembered at all.** A committed entry never
//! changes: it is written once, complete, with the change it answers, and
//! it only goes when the purge deletes it after it expired. So what a read
//! found answers every retry of its key — a replay when the fingerprint
//! matches, a refusal when it does not — for as long as the entry exists.
//!
//! **For how long.** At most [`Settings::remember`](crate::Settings) (one
//! second in the service) counted from the moment the read *began*, and
//! never past the entry's own expiry: an entry read after it expired (the
//! purge had not come yet) is not remembered, so the purge's "after it a
//! key is new again" holds exactly. What the bound is for: a change made to
//! the table behind the ledger's back — an entry deleted by hand, a backup
//! restored — is seen by every process within that time.
//!
//! **What is remembered.** Only what a read found: never an entry this
//! process wrote (a create is not followed by its retry often enough to pay
//! for the memory), never an entry that cannot be replayed, never the
//! absence of one (a key with no entry is about to get one). At most
//! [`CAPACITY_BYTES`] of them at once, the least useful forgotten first.

use std::hash::Hash;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use quick_cache::sync::Cache;
use quick_cache::{Equivalent, Weighter};

use crate::Outcome;
use crate::response::RecordedResponse;

/// The most bytes of recorded answers (body, headers, fingerprint, key) one
/// process remembers at once.
pub const CAPACITY_BYTES: u64 = 4 << 20;

/// What a key's entry answers, and until when it may be answered from here.
struct Remembered {
    fingerprint: String,
    response: RecordedResponse,
    until: Instant,
}

#[derive(Hash, PartialEq, Eq)]
struct EntryKey {
    user: String,
    key: String,
}

/// [`EntryKey`] borrowed, to look one up without copying it (hashed the
/// same way: the fields in the same order).
#[derive(Hash)]
struct Lookup<'a> {
    user: &'a str,
    key: &'a str,
}

impl Equivalent<EntryKey> for Lookup<'_> {
    fn equivalent(&self, stored: &EntryKey) -> bool {
        self.user == stored.user && self.key == stored.key
    }
}

/// Weighs a remembered entry by the bytes it holds.
#[derive(Clone)]
struct Bytes;

impl Weighter<EntryKey, Arc<Remembered>> for Bytes {
    fn weight(&self, key: &EntryKey, entry: &Arc<Remembered>) -> u64 {
        let headers: usize = entry
            .response
            .headers
            .iter()
            .map(|(name, value)| name.len().saturating_add(value.len()))
            .sum();
        let bytes = key
            .user
            .len()
            .saturating_add(key.key.len())
            .saturating_add(entry.fingerprint.len())
            .saturating_add(entry.response.body.len())
            .saturating_add(headers)
            // The bookkeeping of an entry: never weighs nothing.
            .saturating_add(128);
        u64::try_from(bytes).unwrap_or(u64::MAX)
    }
}

/// The entries one ledger remembers (none when its time is zero).
pub(crate) struct RememberedEntries {
    time: Duration,
    entries: Option<Cache<EntryKey, Arc<Remembered>, Bytes>>,
}

impl RememberedEntries {
    /// Remembers what reads found for at most `time` (zero: nothing).
    pub(crate) fn new(time: Duration) -> Self {
        let entries = (!time.is_zero()).then(|| Cache::with_weighter(4_096, CAPACITY_BYTES, Bytes));
        Self { time, entries }
    }

    /// The answer the remembered entry of `(user, key)` gives a request
    /// with `fingerprint`, while it may still be given from here.
    pub(crate) fn answer(&self, user: &str, key: &str, fingerprint: &str) -> Option<Outcome> {
        let entries = self.entries.as_ref()?;
        let entry = entries.get(&Lookup { user, key })?;
        if Instant::now() >= entry.until {
            return None;
        }
        if entry.fingerprint != fingerprint {
            return Some(Outcome::KeyReused);
        }
        Some(Outcome::Replayed(entry.response.clone()))
    }

    /// Remembers what a read that began at `began` found for `(user, key)`:
    /// an entry recorded for `fingerprint`, answering `response`, expiring
    /// at `expires_at`.
    pub(crate) fn remember(
        &self,
        user: &str,
        key: &str,
        fingerprint: &str,
        response: &RecordedResponse,
        expires_at: DateTime<Utc>,
        began: Instant,
    ) {
        let Some(entries) = &self.entries else {
            return;
        };
        let Some(until) = until(began, self.time, expires_at, Utc::now(), Instant::now()) else {
            return;
        };
        entries.insert(
            EntryKey {
                user: user.to_owned(),
                key: key.to_owned(),
            },
            Arc::new(Remembered {
                fingerprint: fingerprint.to_owned(),
                response: response.clone(),
                until,
            }),
        );
    }

    /// How many entries are remembered now (expired ones included until
    /// they are forgotten).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.as_ref().map_or(0, Cache::len)
    }
}

/// Until when an entry read from `began` on may answer from memory: `time`
/// after `began`, and never past `expires_at` (on the wall clock, read as
/// `now` at the monotonic `instant`). `None` when that moment has passed.
fn until(
    began: Instant,
    time: Duration,
    expires_at: DateTime<Utc>,
    now: DateTime<Utc>,
    instant: Instant,
) -> Option<Instant> {
    let left = expires_at.signed_duration_since(now).to_std().ok()?;
    let by_expiry = instant.checked_add(left)?;
    let by_time = began.checked_add(time)?;
    let until = by_expiry.min(by_time);
    (until > instant).then_some(until)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn created() -> RecordedResponse {
        RecordedResponse {
            status: 201,
            headers: vec![("Location".into(), "/v1/payments/1".into())],
            body: b"{\"id\":\"1\"}".to_vec(),
        }
    }

    fn in_a_day() -> DateTime<Utc> {
        Utc::now() + chrono::Duration::days(1)
    }

    #[test]
    fn a_remembered_entry_replays_its_request_and_refuses_another() {
        let remembered = RememberedEntries::new(Duration::from_secs(60));
        remembered.remember("alice", "k", "fp", &created(), in_a_day(), Instant::now());
        assert_eq!(
            remembered.answer("alice", "k", "fp"),
            Some(Outcome::Replayed(created()))
        );
        assert_eq!(
            remembered.answer("alice", "k", "other"),
            Some(Outcome::KeyReused)
        );
    }

    #[test]
    fn an_entry_is_remembered_for_its_user_and_key_only() {
        let remembered = RememberedEntries::new(Duration::from_secs(60));
        remembered.remember("alice", "k", "fp", &created(), in_a_day(), Instant::now());
        assert_eq!(remembered.answer("bob", "k", "fp"), None);
        assert_eq!(remembered.answer("alice", "k2", "fp"), None);
        // A user and a key that concatenate to the same text are another pair.
        assert_eq!(remembered.answer("alicek", "", "fp"), None);
    }

    #[test]
    fn a_lookup_never_answers_with_another_keys_entry() {
        // Many entries, many lookups of pairs never remembered: some share
        // a hash table slot's tag with a remembered pair, and only the
        // comparison of the pair itself tells them apart.
        let remembered = RememberedEntries::new(Duration::from_secs(60));
        for i in 0..1_000 {
            remembered.remember(
                "alice",
                &format!("k{i}"),
                "fp",
                &created(),
                in_a_day(),
                Instant::now(),
            );
        }
        for i in 0..1_000 {
            assert_eq!(remembered.answer("bob", &format!("k{i}"), "fp"), None);
            assert_eq!(remembered.answer("alice", &format!("x{i}"), "fp"), None);
        }
        assert!(remembered.answer("alice", "k999", "fp").is_some());
    }

    #[test]
    fn with_no_time_nothing_is_remembered() {
        let remembered = RememberedEntries::new(Duration::ZERO);
        remembered.remember("alice", "k", "fp", &created(), in_a_day(), Instant::now());
        assert_eq!(remembered.answer("alice", "k", "fp"), None);
        assert_eq!(remembered.len(), 0);
    }

    #[test]
    fn an_entry_read_after_its_expiry_is_not_remembered() {
        let remembered = RememberedEntries::new(Duration::from_secs(60));
        let expired = Utc::now() - chrono::Duration::seconds(1);
        remembered.remember("alice", "k", "fp", &created(), expired, Instant::now());
        assert_eq!(remembered.answer("alice", "k", "fp"), None);
        assert_eq!(remembered.len(), 0);
    }

    #[test]
    fn a_read_that_began_longer_ago_than_the_time_is_not_remembered() {
        let remembered = RememberedEntries::new(Duration::from_millis(1));
        let began = Instant::now();
        std::thread::sleep(Duration::from_millis(5));
        remembered.remember("alice", "k", "fp", &created(), in_a_day(), began);
        assert_eq!(remembered.answer("alice", "k", "fp"), None);
    }

    #[test]
    fn an_entry_answers_until_the_earlier_of_its_time_and_its_expiry() {
        let instant = Instant::now();
        let now = Utc::now();
        let minute = Duration::from_secs(60);
        // The time ends first.
        assert_eq!(
            until(
                instant,
                minute,
                now + chrono::Duration::days(1),
                now,
                instant
            ),
            Some(instant + minute)
        );
        // The expiry comes first.
        assert_eq!(
            until(
                instant,
                minute,
                now + chrono::Duration::seconds(5),
                now,
                instant
            ),
            Some(instant + Duration::from_secs(5))
        );
        // Expired, or expiring right now.
        assert_eq!(until(instant, minute, now, now, instant), None);
        assert_eq!(
            until(
                instant,
                minute,
                now - chrono::Duration::seconds(5),
                now,
                instant
            ),
            None
        );
    }

    #[test]
    fn what_is_remembered_stays_within_its_bytes() {
        let remembered = RememberedEntries::new(Duration::from_secs(60));
        let big = RecordedResponse {
            status: 201,
            headers: vec![],
            body: vec![b'x'; 64 * 1024],
        };
        for i in 0..200 {
            remembered.remember(
                "alice",
                &format!("k{i}"),
                "fp",
                &big,
                in_a_day(),
                Instant::now(),
            );
        }
        let held = u64::try_from(remembered.len()).unwrap_or(u64::MAX) * (64 * 1024);
        assert!(
            held <= CAPACITY_BYTES,
            "{} entries of 64 KiB",
            remembered.len()
        );
        assert!(remembered.len() > 0);
    }
}
