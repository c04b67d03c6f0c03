//! The generic idempotency ledger. It knows requests (a user, a key, a
//! fingerprint) and responses (status, allow-listed headers, body); it knows
//! nothing of orders.
//!
//! A mutation runs through [`Ledger::execute`]:
//!
//! 1. **read**: a completed entry for `(key, user)` is answered at once —
//!    replayed when the fingerprint matches, refused when it does not. No
//!    write, no lock: a replay costs what a read costs.
//! 2. **execute**: otherwise the mutation runs as one unit of writing
//!    ([`Pool::write`]: a savepoint of a group-committed transaction on
//!    SQLite, a transaction on PostgreSQL).
//! 3. **record**: in the same unit, after the change, the response is
//!    written as the key's entry with `INSERT … ON CONFLICT DO NOTHING`.
//!    When that inserts nothing, another request recorded this key since the
//!    read: the unit is rolled back — its change with it — and that entry
//!    answers (a replay, or a refusal). So exactly one request per key ever
//!    commits its change, and a change never persists without its entry.
//!
//! Concurrent requests with one key never run their mutations side by side,
//! and a duplicate waits for the first without a database connection:
//! within a process the second waits on the key's entry in `InFlight` (one
//! request per key enters the ledger at a time); on SQLite units also run
//! one at a time; on PostgreSQL each unit first tries a transaction-scoped
//! advisory lock on the key (`store::lock_key`), and a unit that finds it
//! held — by another process — rolls back at once, releasing its
//! connection, and the request looks again after a doubling pause. Either
//! way it finds the first's entry once that commits (a replay or a
//! refusal), or runs when the first recorded nothing; still held after
//! [`Ledger::wait`]: `IDEMPOTENCY_IN_PROGRESS`.
//!
//! On PostgreSQL a mutation whose whole change is one `INSERT`, with an
//! answer known before it runs (a create), may go through
//! [`Ledger::execute_insert`]: after the read, the key's lock, the change and
//! the entry are one autocommitted statement (`store::RecordedInsert`), so
//! a fresh key costs two round trips instead of six. The statement only
//! tries the lock: a key another unit holds makes it write nothing. Whatever
//! it cannot decide (the change wrote nothing, or another request recorded
//! the key meanwhile) goes through the general path above, waiting included.
//!
//! Nothing of a request is committed before its response, so a holder that
//! dies takes everything with it and its key is free at once. The lease
//! bounds a holder that is alive but hung: it may not record after its lease
//! has run out (the fence, checked in the unit before the record), and on
//! PostgreSQL the server ends any session idle in a transaction, or in one
//! statement, for longer than the lease.

mod fingerprint;
mod inflight;
mod key;
pub(crate) mod store;

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use diesel::pg::Pg;
use diesel::query_builder::{QueryFragment, QueryId};
use diesel::result::{DatabaseErrorKind, Error as DieselError};
use diesel::{PgConnection, QueryResult};

pub use fingerprint::Fingerprint;
use inflight::InFlight;
pub use key::{HEADER, IdempotencyKey, KeyError, MAX_LEN};
pub use store::HELD;

use crate::db::{self, Conn, Failure, Pool, WriteError};

/// The only response headers recorded and replayed.
pub const RECORDED_HEADERS: [&str; 3] = ["location", "content-type", "etag"];

/// A response as the ledger stores and replays it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl RecordedResponse {
    /// The allow-listed headers as the ledger stores them (JSON pairs); the
    /// others are never recorded.
    fn recorded_headers_json(&self) -> String {
        let recorded: Vec<&(String, String)> = self
            .headers
            .iter()
            .filter(|(name, _)| {
                RECORDED_HEADERS
                    .iter()
                    .any(|h| h.eq_ignore_ascii_case(name))
            })
            .collect();
        serde_json::to_string(&recorded).unwrap_or_else(|_| "[]".to_owned())
    }

    /// A response as [`store::record`] wrote it; a row this service did not
    /// write (a status out of range, headers that are not JSON pairs) is a
    /// deserialization error, answered `500`.
    fn from_stored(status: i32, headers: &str, body: Vec<u8>) -> Result<Self, DieselError> {
        let unreadable =
            |e: Box<dyn std::error::Error + Send + Sync>| DieselError::DeserializationError(e);
        Ok(Self {
            status: u16::try_from(status).map_err(|e| unreadable(e.into()))?,
            headers: serde_json::from_str(headers).map_err(|e| unreadable(e.into()))?,
            body,
        })
    }
}

/// What a mutation asks the ledger to do with its answer.
#[derive(Debug)]
pub enum Completion {
    /// Record the response with the change and commit.
    Record(RecordedResponse),
    /// Roll back the unit and answer this as a replay: the mutation
    /// found its effect already made elsewhere (by an earlier request with
    /// this key whose ledger entry is gone) and changed nothing. The key
    /// stays unrecorded, so that earlier effect remains its only record.
    ReplayFound(RecordedResponse),
    /// Roll back the unit and refuse the key as reused: the mutation
    /// found it spent elsewhere on a different request.
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
    /// A request with this key is still running.
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

/// Why the ledger could not answer.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError<E> {
    #[error("database unavailable: {0}")]
    Unavailable(String),
    #[error("database error: {0}")]
    Database(DieselError),
    #[error("internal error: {0}")]
    Internal(String),
    #[error("the lease ran out before the mutation finished")]
    LeaseExpired,
    #[error("the mutation failed")]
    Operation(E),
}

impl<E> From<WriteError> for LedgerError<E> {
    fn from(e: WriteError) -> Self {
        match e {
            WriteError::Unavailable(_) | WriteError::Overloaded => {
                LedgerError::Unavailable(e.to_string())
            }
            WriteError::Panicked(_) => LedgerError::Internal(e.to_string()),
        }
    }
}

/// The transaction (unit of writing) in which the ledger records this
/// request's key, after the mutation, with its response. Only the ledger makes
/// one, so a function that takes it can only run as a recorded mutation.
pub struct LedgerTx<'t, 'c> {
    conn: &'t mut Conn<'c>,
}

impl<'c> LedgerTx<'_, 'c> {
    pub fn conn(&mut self) -> &mut Conn<'c> {
        self.conn
    }
}

/// One request as the ledger sees it.
#[derive(Debug, Clone, Copy)]
pub struct LedgerRequest<'a> {
    pub user_id: &'a str,
    pub key: &'a IdempotencyKey,
    pub fingerprint: &'a Fingerprint,
}

/// The ledger's settings, and the keys this process is running requests for.
#[derive(Debug, Clone)]
pub struct Ledger {
    pub retention: Duration,
    pub lease: Duration,
    /// How long a request waits for another one with its key to finish
    /// before it is answered [`Outcome::InProgress`].
    pub wait: Duration,
    in_flight: Arc<InFlight>,
}

/// The first pause between two looks at a key another process holds; it
/// doubles up to [`POLL_MAX`].
const POLL_FIRST: Duration = Duration::from_millis(10);
const POLL_MAX: Duration = Duration::from_millis(200);

/// Why the unit of writing was rolled back.
enum Abort<E, F> {
    Database(DieselError),
    /// Roll back and answer with this outcome.
    Answer(Outcome),
    LeaseExpired,
    Operation(E),
    /// Another unit holds the key (PostgreSQL, any process): the mutation
    /// did not run and comes back for the next try.
    Busy(F),
}

impl<E, F> From<DieselError> for Abort<E, F> {
    fn from(e: DieselError) -> Self {
        Abort::Database(e)
    }
}

impl Ledger {
    pub fn new(retention: Duration, lease: Duration, wait: Duration) -> Self {
        Self {
            retention,
            lease,
            wait,
            in_flight: Arc::default(),
        }
    }

    /// Answers one mutating request: replays, refuses, or runs `mutation`
    /// exactly once and records its response in the same unit of writing
    /// (see [`Pool::write`]). `mutation`'s `Err` (a 5xx) rolls the unit back
    /// and frees the key.
    ///
    /// A request whose key another one is running waits for it, at most
    /// [`Ledger::wait`], without holding a database connection: in this
    /// process on the key's entry in `InFlight` (woken when the first is
    /// over), across processes (PostgreSQL) by looking again with a
    /// doubling pause; then it answers what the first recorded — or runs,
    /// when the first recorded nothing. Still held at the deadline:
    /// [`Outcome::InProgress`].
    pub fn execute<E, F>(
        &self,
        pool: &Pool,
        request: LedgerRequest<'_>,
        mutation: F,
    ) -> Result<Outcome, LedgerError<E>>
    where
        F: FnOnce(&mut LedgerTx<'_, '_>) -> Result<Completion, E> + Send + 'static,
        E: Send + 'static,
    {
        self.run(
            pool,
            request,
            None::<(FastInsert, RecordedResponse)>,
            mutation,
        )
    }

    /// [`Ledger::execute`] for a mutation whose whole change is `change`,
    /// one PostgreSQL `INSERT … SELECT … FROM` [`HELD`] `… RETURNING 1`
    /// (a row returned per row written), answered `response` when it writes.
    /// On PostgreSQL the key's lock, `change` and the entry then run as one
    /// autocommitted statement (`store::RecordedInsert`); when it writes
    /// nothing (the effect exists already, or another unit holds the key) or
    /// another request recorded the key since the read, the request goes the
    /// general way, with `mutation` (which must make the same change). On
    /// SQLite `mutation` runs as in [`Ledger::execute`].
    pub fn execute_insert<E, F, C>(
        &self,
        pool: &Pool,
        request: LedgerRequest<'_>,
        change: &C,
        response: RecordedResponse,
        mutation: F,
    ) -> Result<Outcome, LedgerError<E>>
    where
        F: FnOnce(&mut LedgerTx<'_, '_>) -> Result<Completion, E> + Send + 'static,
        E: Send + 'static,
        C: QueryFragment<Pg> + QueryId,
    {
        let fast = |conn: &mut PgConnection, entry: &store::NewEntry<'_>| {
            store::insert_recorded(conn, change, entry)
        };
        self.run(pool, request, Some((fast, response)), mutation)
    }

    /// Both ways in: the read, then (once) the one-statement insert when there
    /// is one and the backend is PostgreSQL, then the unit of writing; a key
    /// another unit holds is waited for, in this process on its entry in
    /// [`InFlight`], across processes by looking again with a doubling pause.
    fn run<E, F, G>(
        &self,
        pool: &Pool,
        request: LedgerRequest<'_>,
        mut fast: Option<(G, RecordedResponse)>,
        mutation: F,
    ) -> Result<Outcome, LedgerError<E>>
    where
        F: FnOnce(&mut LedgerTx<'_, '_>) -> Result<Completion, E> + Send + 'static,
        E: Send + 'static,
        G: FnOnce(&mut PgConnection, &store::NewEntry<'_>) -> QueryResult<bool>,
    {
        let key = request.key.as_str();
        let user = request.user_id;
        let fingerprint = request.fingerprint.as_str();
        let deadline = Instant::now() + self.wait;
        let Some(_running) = self.in_flight.enter(user, key, deadline, self.lease) else {
            return Ok(Outcome::InProgress);
        };
        let mut mutation = mutation;
        let mut pause = POLL_FIRST;
        loop {
            if let Some(outcome) = read(pool, request)? {
                return Ok(outcome);
            }
            if let (Some((insert, response)), Pool::Postgres(_)) = (fast.take(), pool)
                && let Some(outcome) = self.insert_recorded(pool, request, insert, response)?
            {
                return Ok(outcome);
            }
            match pool.write(self.unit(key, user, fingerprint, mutation))? {
                Ok(outcome) => return Ok(outcome),
                Err(Abort::Busy(back)) => {
                    mutation = back;
                    let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                        return Ok(Outcome::InProgress);
                    };
                    std::thread::sleep(pause.min(left));
                    pause = pause.saturating_mul(2).min(POLL_MAX);
                }
                Err(Abort::Answer(outcome)) => return Ok(outcome),
                Err(Abort::LeaseExpired) => return Err(LedgerError::LeaseExpired),
                Err(Abort::Operation(e)) => return Err(LedgerError::Operation(e)),
                // A writer outside this protocol holds a row of this key.
                Err(Abort::Database(e)) if db::classify(&e) == Failure::LockTimeout => {
                    return Ok(Outcome::InProgress);
                }
                Err(Abort::Database(e)) => return Err(database_error(e)),
            }
        }
    }

    /// PostgreSQL: the one-statement insert. `Some` when it decided the
    /// request (written and committed), `None` when it wrote nothing and the
    /// general way must decide.
    fn insert_recorded<E, G>(
        &self,
        pool: &Pool,
        request: LedgerRequest<'_>,
        insert: G,
        response: RecordedResponse,
    ) -> Result<Option<Outcome>, LedgerError<E>>
    where
        G: FnOnce(&mut PgConnection, &store::NewEntry<'_>) -> QueryResult<bool>,
    {
        let (now, expires_at) = self.entry_times();
        let entry = store::NewEntry {
            key: request.key.as_str(),
            user_id: request.user_id,
            fingerprint: request.fingerprint.as_str(),
            response: &response,
            created_at: now,
            expires_at,
        };
        let mut pooled = pool
            .get()
            .map_err(|e| LedgerError::Unavailable(e.to_string()))?;
        let written = match pooled.conn() {
            Conn::Postgres(c) => insert(c, &entry),
            Conn::Sqlite(_) => Ok(false),
        };
        // Classified while the connection is still held: one that lost its
        // server is then dropped instead of going back to the pool.
        let failure = written.as_ref().err().map(db::classify);
        drop(pooled);
        match (written, failure) {
            (Ok(true), _) => Ok(Some(Outcome::Executed(response))),
            // The effect exists already, or another unit holds the key:
            // the general way finds out which.
            (Ok(false), _) => Ok(None),
            // Another request recorded the key since the read; nothing of
            // this statement persisted.
            (Err(DieselError::DatabaseError(DatabaseErrorKind::UniqueViolation, _)), _) => Ok(None),
            (Err(_), Some(Failure::LockTimeout)) => Ok(Some(Outcome::InProgress)),
            (Err(e), _) => Err(database_error(e)),
        }
    }

    /// When an entry recorded now is written, and when it may go. Every
    /// committed entry is complete (the change and its response commit
    /// together), so retention alone decides.
    fn entry_times(&self) -> (DateTime<Utc>, DateTime<Utc>) {
        let now = Utc::now();
        let keep = chrono::Duration::from_std(self.retention).unwrap_or(chrono::Duration::MAX);
        let expires_at = now
            .checked_add_signed(keep)
            .unwrap_or(DateTime::<Utc>::MAX_UTC);
        (now, expires_at)
    }

    /// One try at running `mutation` for the key as a unit of writing.
    fn unit<E, F>(
        &self,
        key: &str,
        user: &str,
        fingerprint: &str,
        mutation: F,
    ) -> impl FnOnce(&mut Conn<'_>) -> Result<Outcome, Abort<E, F>> + Send + 'static
    where
        F: FnOnce(&mut LedgerTx<'_, '_>) -> Result<Completion, E> + Send + 'static,
        E: Send + 'static,
    {
        let (key, user, fingerprint) = (key.to_owned(), user.to_owned(), fingerprint.to_owned());
        let (now, expires_at) = self.entry_times();
        let lease = self.lease;
        move |conn: &mut Conn<'_>| -> Result<Outcome, Abort<E, F>> {
            let entry = |conn: &mut Conn<'_>| -> Result<Option<Outcome>, DieselError> {
                Ok(store::find(conn, &key, &user)?.map(|e| decide(e, &fingerprint)))
            };
            if !store::lock_key(conn, &key, &user)? {
                return Err(Abort::Busy(mutation));
            }
            // The lease runs from the moment the unit holds the key, not
            // from the request's start: a request that waited for a dying
            // holder still gets its whole lease.
            let started = Instant::now();
            let completion = mutation(&mut LedgerTx { conn }).map_err(Abort::Operation)?;
            let found = match completion {
                // The effect exists already; the key's own entry, when it
                // has one by now, is the answer it recorded.
                Completion::ReplayFound(response) => {
                    entry(conn)?.unwrap_or(Outcome::Replayed(response))
                }
                Completion::KeyReusedFound => entry(conn)?.unwrap_or(Outcome::KeyReused),
                Completion::Record(response) => {
                    // The fence: a holder past its lease must not commit.
                    if started.elapsed() >= lease {
                        return Err(Abort::LeaseExpired);
                    }
                    let new = store::NewEntry {
                        key: &key,
                        user_id: &user,
                        fingerprint: &fingerprint,
                        response: &response,
                        created_at: now,
                        expires_at,
                    };
                    if store::record(conn, &new)? {
                        return Ok(Outcome::Executed(response));
                    }
                    // Recorded by another request since the read: this
                    // unit's change must not persist; that entry answers.
                    entry(conn)?.unwrap_or(Outcome::InProgress)
                }
            };
            // Roll back: what the mutation did (if anything) must not stay.
            Err(Abort::Answer(found))
        }
    }

    /// Deletes expired entries in batches of `batch` rows, each batch its own
    /// short transaction so live requests interleave. Stops after
    /// `max_batches` batches (or when nothing expired is left); returns how
    /// many entries went.
    pub fn purge_expired<E>(
        pool: &Pool,
        batch: i64,
        max_batches: usize,
    ) -> Result<usize, LedgerError<E>> {
        let mut total = 0;
        for _ in 0..max_batches {
            let now = Utc::now();
            let deleted = pool
                .write(move |conn| store::purge_batch(conn, now, batch))?
                .map_err(database_error)?;
            total += deleted;
            if (deleted as i64) < batch {
                break;
            }
        }
        Ok(total)
    }
}

/// The one-statement insert of a request that has none ([`Ledger::execute`]).
type FastInsert = fn(&mut PgConnection, &store::NewEntry<'_>) -> QueryResult<bool>;

/// The read before any write: the key's completed entry decides at once
/// (a replay or a refusal), without a lock.
fn read<E>(pool: &Pool, request: LedgerRequest<'_>) -> Result<Option<Outcome>, LedgerError<E>> {
    let mut pooled = pool
        .get()
        .map_err(|e| LedgerError::Unavailable(e.to_string()))?;
    let existing = store::find(&mut pooled.conn(), request.key.as_str(), request.user_id)
        .map_err(database_error)?;
    Ok(existing.map(|entry| decide(entry, request.fingerprint.as_str())))
}

/// The decision for an existing entry: every entry is complete, so it is
/// a replay or a refusal.
fn decide(entry: store::Entry, fingerprint: &str) -> Outcome {
    if entry.fingerprint != fingerprint {
        return Outcome::KeyReused;
    }
    Outcome::Replayed(entry.response)
}

fn database_error<E>(e: DieselError) -> LedgerError<E> {
    match db::classify(&e) {
        Failure::Unavailable | Failure::LockTimeout => LedgerError::Unavailable(e.to_string()),
        Failure::Internal => LedgerError::Database(e),
    }
}
