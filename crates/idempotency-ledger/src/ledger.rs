//! The ledger's types: what a request asks, what a mutation answers, how
//! the ledger answers, and the [`Ledger`] itself. How it answers is
//! `protocol.rs`.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::result::Error as DieselError;

use crate::Ledger;
use crate::admission::Admission;
use crate::conn::{Conn, Failure, StorageError, WriteError};
use crate::failure::classify;
use crate::fingerprint::Fingerprint;
use crate::inflight::InFlight;
use crate::key::IdempotencyKey;
use crate::remembered::RememberedEntries;
use crate::response::{RecordedResponse, Unreplayable};
use crate::row::{self, Row};

/// What a mutation asks the ledger to do with its answer.
#[derive(Debug)]
pub enum Completion {
    /// Record the response with the change and commit.
    Record(RecordedResponse),
    /// Roll back the unit and answer this as a replay: the mutation found
    /// its effect already made (by an earlier request with this key whose
    /// ledger entry is gone) and changed nothing. The key stays unrecorded,
    /// so that earlier effect remains its only record.
    ReplayFound(RecordedResponse),
    /// Roll back the unit and refuse the key as reused: the mutation found
    /// it spent on a different request.
    KeyReusedFound,
}

/// How the ledger answered a request.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The mutation ran now; this is its response.
    Executed(RecordedResponse),
    /// An earlier request with this key and fingerprint answered this: the
    /// recorded response, or one the mutation found (see
    /// [`Completion::ReplayFound`]).
    Replayed(RecordedResponse),
    /// The key was used for a different request.
    KeyReused,
    /// A request with this key is still running (waited for until the
    /// deadline, or its key already had its full count of waiters).
    InProgress,
}

impl Outcome {
    /// A stable label for logs and metrics.
    pub fn label(&self) -> &'static str {
        match self {
            Outcome::Executed(_) => "executed",
            Outcome::Replayed(_) => "replayed",
            Outcome::KeyReused => "key_reused",
            Outcome::InProgress => "in_progress",
        }
    }
}

/// Why the ledger could not answer. Every variant but
/// [`LedgerError::Operation`] left the key free, nothing of the request
/// committed.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError<E> {
    /// The database cannot be reached or cannot write now: retry later.
    #[error("database unavailable: {0}")]
    Unavailable(String),
    /// This process admits no more writes now: retry later.
    #[error("too many writes are admitted")]
    Overloaded,
    /// A defect: a query failed in a way no client can avoid.
    #[error("database error: {0}")]
    Database(DieselError),
    /// A defect of the ledger's own (a unit that panicked, a task lost).
    #[error("internal error: {0}")]
    Internal(String),
    /// The unit ran past its lease and was rolled back.
    #[error("the lease ran out before the mutation finished")]
    LeaseExpired,
    /// The key's stored entry cannot be replayed as it was recorded.
    #[error("the entry of key {key:?} cannot be replayed: {cause}")]
    Unreplayable {
        /// The key whose entry it is.
        key: String,
        /// What does not read back.
        cause: Unreplayable,
    },
    /// The mutation failed (its error, for the application to answer).
    #[error("the mutation failed")]
    Operation(E),
}

impl<E> From<WriteError> for LedgerError<E> {
    fn from(e: WriteError) -> Self {
        match e {
            WriteError::Unavailable(_) => LedgerError::Unavailable(e.to_string()),
            WriteError::Overloaded => LedgerError::Overloaded,
            WriteError::Panicked(_) => LedgerError::Internal(e.to_string()),
        }
    }
}

impl<E> From<StorageError> for LedgerError<E> {
    fn from(e: StorageError) -> Self {
        match e {
            StorageError::Unavailable(cause) => LedgerError::Unavailable(cause),
            StorageError::Database(e) => LedgerError::database(e),
            StorageError::Internal(cause) => LedgerError::Internal(cause),
        }
    }
}

impl<E> LedgerError<E> {
    /// A failed query, answered by what the client can do about it.
    pub(crate) fn database(e: DieselError) -> Self {
        match classify(&e) {
            Failure::Unavailable | Failure::LockTimeout => LedgerError::Unavailable(e.to_string()),
            Failure::Internal => LedgerError::Database(e),
        }
    }
}

/// The transaction (unit of writing) in which the ledger records this
/// request's key, after the mutation, with its response. Only the ledger
/// makes one, so a function that takes it can only run as a recorded
/// mutation.
pub struct LedgerTx<'t, 'c> {
    pub(crate) conn: &'t mut Conn<'c>,
}

impl<'c> LedgerTx<'_, 'c> {
    /// The unit's connection: every write of the mutation goes through it.
    pub fn conn(&mut self) -> &mut Conn<'c> {
        self.conn
    }

    /// Inserts `row` unless its unique constraint holds one already
    /// (`INSERT … ON CONFLICT DO NOTHING`): `true` when it was written.
    pub fn insert<R: Row>(&mut self, row: &R) -> Result<bool, DieselError> {
        row::insert(self.conn, row)
    }
}

/// One request as the ledger sees it.
#[derive(Debug, Clone, Copy)]
pub struct LedgerRequest<'a> {
    /// Who sent it: keys are scoped by user (one key of two users is two keys).
    pub user_id: &'a str,
    /// Its `Idempotency-Key`.
    pub key: &'a IdempotencyKey,
    /// What it asked for.
    pub fingerprint: &'a Fingerprint,
}

/// The ledger's settings.
#[derive(Debug, Clone)]
pub struct Settings {
    /// How long an entry answers its key.
    pub retention: Duration,
    /// How long a request waits for another one with its key to finish
    /// before it is answered [`Outcome::InProgress`]. (The lease, how long
    /// a unit may hold its key, is the pool's: [`PoolOptions::lease`].)
    ///
    /// [`PoolOptions::lease`]: crate::db::PoolOptions::lease
    pub wait: Duration,
    /// How many requests may wait for one key at once; past it a duplicate
    /// is answered [`Outcome::InProgress`] at once.
    pub waiters_per_key: usize,
    /// How many units of writing this process admits at once.
    pub write_admission: u32,
    /// How long what a read found for a key answers that key's retries
    /// from memory, without another read (zero: every retry reads). An
    /// entry never changes once committed, so this only bounds how long a
    /// change made behind the ledger's back (an entry deleted by hand, a
    /// backup restored) goes unseen; an entry is never answered from memory
    /// past its expiry.
    pub remember: Duration,
}

/// The default of [`Settings::waiters_per_key`].
pub const DEFAULT_WAITERS_PER_KEY: usize = 16;

/// What a [`Ledger`] holds, behind its one `Arc`.
pub(crate) struct Inner<S> {
    pub(crate) storage: S,
    pub(crate) settings: Settings,
    pub(crate) in_flight: Arc<InFlight>,
    pub(crate) admission: Admission,
    pub(crate) remembered: RememberedEntries,
}

impl<S> Ledger<S> {
    /// A ledger writing through `storage` (its reads, its units of
    /// writing), with `settings`.
    pub fn new(storage: S, settings: Settings) -> Self {
        Self {
            inner: Arc::new(Inner {
                in_flight: Arc::new(InFlight::new(settings.waiters_per_key.max(1))),
                admission: Admission::new(settings.write_admission),
                remembered: RememberedEntries::new(settings.remember),
                storage,
                settings,
            }),
        }
    }

    /// Its settings.
    pub fn settings(&self) -> &Settings {
        &self.inner.settings
    }

    /// The storage it writes through (and reads from).
    pub fn pool(&self) -> &S {
        &self.inner.storage
    }

    /// The write admission (its bound, and how many are admitted now).
    pub fn admission(&self) -> &Admission {
        &self.inner.admission
    }

    /// Requests holding a key in this process now.
    pub fn keys_in_flight(&self) -> usize {
        self.inner.in_flight.holders()
    }

    /// When an entry recorded now is written, and when it may go. Every
    /// committed entry is complete (the change and its response commit
    /// together), so retention alone decides.
    pub(crate) fn entry_times(&self) -> (DateTime<Utc>, DateTime<Utc>) {
        let now = Utc::now();
        let keep = chrono::Duration::from_std(self.inner.settings.retention)
            .unwrap_or(chrono::Duration::MAX);
        let expires_at = now
            .checked_add_signed(keep)
            .unwrap_or(DateTime::<Utc>::MAX_UTC);
        (now, expires_at)
    }
}

/// Logged with its key, answered as a defect: never a made-up answer.
pub(crate) fn unreplayable<E>(request: LedgerRequest<'_>, cause: Unreplayable) -> LedgerError<E> {
    tracing::error!(
        key = request.key.as_str(),
        user = request.user_id,
        %cause,
        "a stored idempotency entry cannot be replayed"
    );
    LedgerError::Unreplayable {
        key: request.key.as_str().to_owned(),
        cause,
    }
}
