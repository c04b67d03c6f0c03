//! [`Ledger::execute`]: how one mutating request is answered.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::result::{DatabaseErrorKind, Error as DieselError};
use tokio::time::Instant;

use crate::admission::{Admission, WriteConnections};
use crate::db::writer::{COMMIT_GRACE, write_bound};
use crate::db::{Conn, Failure, PG_LOCK_WAIT, Pool, WriteError, classify};
use crate::fingerprint::Fingerprint;
use crate::inflight::{Entered, InFlight};
use crate::key::IdempotencyKey;
use crate::remembered::RememberedEntries;
use crate::response::{RecordedResponse, Unreplayable};
use crate::row::{self, Row};
use crate::store::{self, NewEntry};

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

/// The transaction (unit of writing) in which the ledger records this
/// request's key, after the mutation, with its response. Only the ledger
/// makes one, so a function that takes it can only run as a recorded
/// mutation.
pub struct LedgerTx<'t, 'c> {
    conn: &'t mut Conn<'c>,
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
    /// How long a unit may hold its key: past it, it may not record.
    pub lease: Duration,
    /// How long a request waits for another one with its key to finish
    /// before it is answered [`Outcome::InProgress`].
    pub wait: Duration,
    /// How many requests may wait for one key at once; past it a duplicate
    /// is answered [`Outcome::InProgress`] at once.
    pub waiters_per_key: usize,
    /// How many units of writing this process admits at once.
    pub write_admission: u32,
    /// PostgreSQL: how long a unit waits for a write connection.
    pub connection_timeout: Duration,
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

/// The idempotency ledger of one process: its settings, its storage, the
/// keys it is running requests for, and its write admission. Cheap to
/// clone (one `Arc`).
#[derive(Clone)]
pub struct Ledger {
    inner: Arc<Inner>,
}

struct Inner {
    pool: Pool,
    settings: Settings,
    in_flight: Arc<InFlight>,
    admission: Admission,
    write_connections: Option<WriteConnections>,
    remembered: RememberedEntries,
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
    /// Roll back: the entry this unit found cannot be replayed.
    Unreplayable(Unreplayable),
    LeaseExpired,
    Operation(E),
    /// Another unit holds the key (PostgreSQL, any process): the mutation
    /// did not run and comes back for the next try.
    Busy(F),
}

impl<E, F> From<DieselError> for Abort<E, F> {
    /// Classified where it happened, on the thread that holds the
    /// connection, so that a lost one is dropped instead of pooled again.
    fn from(e: DieselError) -> Self {
        classify(&e);
        Abort::Database(e)
    }
}

impl Ledger {
    /// A ledger writing through `pool` (its read connections, its unit of
    /// writing), with `settings`.
    pub fn new(pool: Pool, settings: Settings) -> Self {
        let write_connections = match &pool {
            Pool::Postgres(_) => Some(WriteConnections::for_pool(pool.max_size())),
            Pool::Sqlite(_) => None,
        };
        Self {
            inner: Arc::new(Inner {
                in_flight: Arc::new(InFlight::new(settings.waiters_per_key.max(1))),
                admission: Admission::new(settings.write_admission),
                write_connections,
                remembered: RememberedEntries::new(settings.remember),
                pool,
                settings,
            }),
        }
    }

    /// Its settings.
    pub fn settings(&self) -> &Settings {
        &self.inner.settings
    }

    /// The pool it writes through (and reads from).
    pub fn pool(&self) -> &Pool {
        &self.inner.pool
    }

    /// The write admission (its bound, and how many are admitted now).
    pub fn admission(&self) -> &Admission {
        &self.inner.admission
    }

    /// Requests holding a key in this process now.
    pub fn keys_in_flight(&self) -> usize {
        self.inner.in_flight.holders()
    }

    /// Answers one mutating request: replays, refuses, or runs `mutation`
    /// exactly once and records its response in the same unit of writing
    /// (see [`Pool::write`]). `mutation`'s `Err` rolls the unit back and
    /// frees the key (give it only for answers that must not be recorded,
    /// such as a `5xx`).
    ///
    /// In order, each step holding only what it needs:
    ///
    /// 0. **shed**: while every write slot of the process is taken, the
    ///    request is answered [`LedgerError::Overloaded`] on arrival, before
    ///    it reads or waits — a replay and a duplicate too (their retries
    ///    are answered once a slot is free): shedding takes no thread and no
    ///    connection, and nothing that admitted writes need;
    /// 1. **wait for the key**: a request whose key another request of this
    ///    process holds reads the key's entry first, and a recorded one
    ///    answers at once (retries of a recorded key never wait for one
    ///    another); otherwise it waits for the key holding nothing (no
    ///    thread, no connection, no write slot), at most [`Settings::wait`];
    ///    a key with [`Settings::waiters_per_key`] waiters already is
    ///    answered [`Outcome::InProgress`] at once;
    /// 2. **read**: a completed entry for `(key, user)` answers at once —
    ///    replayed when the fingerprint matches, refused when it does not.
    ///    A read: no write slot, no write connection. What a read found
    ///    less than [`Settings::remember`] ago answers without another
    ///    (from memory, never past the entry's expiry), and before step 1;
    /// 3. **admit**: a write slot, or [`LedgerError::Overloaded`] at once;
    ///    on PostgreSQL then a write connection;
    /// 4. **unit**: the mutation runs as one unit of writing, which takes
    ///    the key's lock (PostgreSQL: tries a transaction-scoped advisory
    ///    lock; one held by another process rolls the unit back, and the
    ///    request gives back its slot and connection, pauses and goes back
    ///    to step 2), runs the change, checks the lease, and records the
    ///    response with `INSERT … ON CONFLICT DO NOTHING` — when that
    ///    inserts nothing another request recorded the key since the read,
    ///    and the unit is rolled back with its change: that entry answers.
    ///
    /// So exactly one request per key ever commits its change, a change
    /// never persists without its entry, and nothing of a request is
    /// committed before its answer: a holder that dies leaves its key free
    /// at once.
    pub async fn execute<E, F>(
        &self,
        request: LedgerRequest<'_>,
        mutation: F,
    ) -> Result<Outcome, LedgerError<E>>
    where
        F: FnOnce(&mut LedgerTx<'_, '_>) -> Result<Completion, E> + Send + 'static,
        E: Send + 'static,
    {
        self.run(request, move || (None, mutation)).await
    }

    /// [`Ledger::execute`] for a mutation whose whole change is inserting
    /// `row`, answered `created` when it is written. The ledger inserts it
    /// itself, the same row on every path: on PostgreSQL the key's lock,
    /// the row and the entry go as one autocommitted statement after the
    /// read (one round trip for a fresh key); otherwise, and for whatever
    /// that statement leaves undecided, as a unit of writing. When the row
    /// exists already (its unique constraint), `found` decides in the unit
    /// what that means: a replay of the existing effect, or a reused key.
    pub async fn execute_insert<R, E, F>(
        &self,
        request: LedgerRequest<'_>,
        row: R,
        created: RecordedResponse,
        found: F,
    ) -> Result<Outcome, LedgerError<E>>
    where
        R: Row,
        F: FnOnce(&mut LedgerTx<'_, '_>) -> Result<Completion, E> + Send + 'static,
        E: Send + 'static,
    {
        self.execute_insert_with(request, move || (row, created), found)
            .await
    }

    /// [`Ledger::execute_insert`] with the row and its answer made by
    /// `make` only once the read found no entry for the key: a replay or a
    /// refusal never builds what it will not write (a new id, the answer's
    /// body).
    pub async fn execute_insert_with<R, E, F, M>(
        &self,
        request: LedgerRequest<'_>,
        make: M,
        found: F,
    ) -> Result<Outcome, LedgerError<E>>
    where
        R: Row,
        M: FnOnce() -> (R, RecordedResponse) + Send,
        F: FnOnce(&mut LedgerTx<'_, '_>) -> Result<Completion, E> + Send + 'static,
        E: Send + 'static,
    {
        let build = move || {
            let (row, created) = make();
            let row = Arc::new(row);
            let fast = OneStatement {
                row: Arc::clone(&row) as Arc<dyn RecordedInsert>,
                response: created.clone(),
            };
            let mutation = move |tx: &mut LedgerTx<'_, '_>| -> Result<Completion, InsertError<E>> {
                if tx.insert(&*row).map_err(InsertError::Database)? {
                    return Ok(Completion::Record(created));
                }
                found(tx).map_err(InsertError::Found)
            };
            (Some(fast), mutation)
        };
        match self.run(request, build).await {
            Ok(outcome) => Ok(outcome),
            Err(LedgerError::Operation(InsertError::Found(e))) => Err(LedgerError::Operation(e)),
            Err(LedgerError::Operation(InsertError::Database(e))) => Err(database_error(e)),
            Err(other) => Err(other.map_operation()),
        }
    }

    /// `build` makes the mutation (and, for an insert, its one statement)
    /// once the first read found no entry: never for a replay or a refusal.
    async fn run<E, F, B>(
        &self,
        request: LedgerRequest<'_>,
        build: B,
    ) -> Result<Outcome, LedgerError<E>>
    where
        B: FnOnce() -> (Option<OneStatement>, F) + Send,
        F: FnOnce(&mut LedgerTx<'_, '_>) -> Result<Completion, E> + Send + 'static,
        E: Send + 'static,
    {
        let inner = &*self.inner;
        let settings = &inner.settings;
        let deadline = Instant::now() + settings.wait;
        if inner.admission.is_full() {
            return Err(LedgerError::Overloaded);
        }
        // An entry a read found a moment ago answers as that read would.
        if let Some(outcome) = inner.remembered.answer(
            request.user_id,
            request.key.as_str(),
            request.fingerprint.as_str(),
        ) {
            return Ok(outcome);
        }
        // A key another request of this process holds now: an entry it has
        // already answers at once (a recorded entry never changes), so the
        // retries of a recorded key never queue behind one another, nor
        // count against the key's waiters. Only a key with no entry yet
        // waits for its holder.
        if inner
            .in_flight
            .is_held(request.user_id, request.key.as_str())
            && let Some(outcome) = self.read(request).await?
        {
            return Ok(outcome);
        }
        let _running = match inner
            .in_flight
            .enter(
                request.user_id,
                request.key.as_str(),
                deadline,
                settings.lease,
            )
            .await
        {
            Entered::Holder(running) => running,
            Entered::GaveUp | Entered::Crowded => return Ok(Outcome::InProgress),
        };
        #[cfg(feature = "fault-points")]
        crate::fault::pass(crate::fault::Point::AfterEnter, request.key.as_str()).await;
        let mut build = Some(build);
        let mut fast = None;
        let mut mutation = None;
        let mut pause = POLL_FIRST;
        loop {
            if let Some(outcome) = self.read(request).await? {
                return Ok(outcome);
            }
            let Some(admitted) = inner.admission.try_admit() else {
                return Err(LedgerError::Overloaded);
            };
            if let Some(build) = build.take() {
                let (one, built) = build();
                fast = one;
                mutation = Some(built);
            }
            let connection = match &inner.write_connections {
                Some(share) => Some(
                    share
                        .acquire(settings.connection_timeout)
                        .await
                        .ok_or_else(|| {
                            LedgerError::Unavailable("no write connection came free".into())
                        })?,
                ),
                None => None,
            };
            if let (Some(one), Pool::Postgres(_)) = (fast.take(), &inner.pool)
                && let Some(outcome) = self.insert_recorded(request, one).await?
            {
                return Ok(outcome);
            }
            // Built above on the first pass, given back by every `Busy`.
            let Some(this_try) = mutation.take() else {
                return Err(LedgerError::Internal(
                    "the mutation was not given back".into(),
                ));
            };
            let unit = self.unit(request, this_try);
            match inner.pool.write(unit).await? {
                Ok(outcome) => return Ok(outcome),
                Err(Abort::Busy(back)) => {
                    mutation = Some(back);
                    let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                        return Ok(Outcome::InProgress);
                    };
                    // Slot and connection go back while this request waits.
                    drop(connection);
                    drop(admitted);
                    tokio::time::sleep(pause.min(left)).await;
                    pause = pause.saturating_mul(2).min(POLL_MAX);
                }
                Err(Abort::Answer(outcome)) => return Ok(outcome),
                Err(Abort::Unreplayable(cause)) => return Err(self.unreplayable(request, cause)),
                Err(Abort::LeaseExpired) => return Err(LedgerError::LeaseExpired),
                Err(Abort::Operation(e)) => return Err(LedgerError::Operation(e)),
                // A writer outside this protocol holds a row of this key.
                Err(Abort::Database(e)) if classify(&e) == Failure::LockTimeout => {
                    return Ok(Outcome::InProgress);
                }
                Err(Abort::Database(e)) => return Err(database_error(e)),
            }
        }
    }

    /// The read before any write: the key's completed entry decides at once
    /// (a replay or a refusal), without a lock, on a pooled read connection;
    /// what it finds is remembered ([`Settings::remember`]). Memory is
    /// looked at once, on arrival: a request that came on to a read found
    /// nothing there, and only a read can put something there since. No
    /// answer within [`Pool::read_bound`] is [`LedgerError::Unavailable`].
    async fn read<E>(&self, request: LedgerRequest<'_>) -> Result<Option<Outcome>, LedgerError<E>> {
        let remembered = &self.inner.remembered;
        let began = std::time::Instant::now();
        let pool = self.inner.pool.clone();
        let (key, user) = (request.key.as_str().to_owned(), request.user_id.to_owned());
        let bound = pool.read_bound();
        let read = tokio::task::spawn_blocking(move || {
            let mut pooled = pool.get().map_err(ReadFailure::Unavailable)?;
            store::find(&mut pooled.conn(), &key, &user).map_err(|e| {
                // Classified before the connection goes back (see `pg.rs`).
                classify(&e);
                ReadFailure::Database(e)
            })
        });
        // A read that does not come back (a frozen file system, a server
        // that stopped answering) is answered unavailable at the pool's
        // read bound; its thread keeps its connection until it returns.
        let found = tokio::time::timeout(bound, read)
            .await
            .map_err(|_| {
                LedgerError::Unavailable(format!(
                    "the read of the key had no answer within {} s",
                    bound.as_secs()
                ))
            })?
            .map_err(|e| LedgerError::Internal(e.to_string()))?;
        match found {
            Err(ReadFailure::Unavailable(e)) => Err(LedgerError::Unavailable(e.to_string())),
            Err(ReadFailure::Database(e)) => Err(database_error(e)),
            Ok(None) => Ok(None),
            Ok(Some(entry)) => {
                if let Ok(response) = &entry.response {
                    remembered.remember(
                        request.user_id,
                        request.key.as_str(),
                        &entry.fingerprint,
                        response,
                        entry.expires_at,
                        began,
                    );
                }
                decide(entry, request.fingerprint.as_str())
                    .map(Some)
                    .map_err(|cause| self.unreplayable(request, cause))
            }
        }
    }

    /// PostgreSQL: the one-statement insert. `Some` when it decided the
    /// request (written and committed), `None` when it wrote nothing and the
    /// general way must decide.
    ///
    /// Bounded like [`Pool::write`]: no answer within the lease plus
    /// [`COMMIT_GRACE`](crate::db::writer::COMMIT_GRACE) is
    /// [`LedgerError::Unavailable`], the outcome unknown. The statement's
    /// own work is cut at the lease (`statement_timeout`), but not its
    /// commit (a wait for a synchronous standby), nor a server that stops
    /// answering; the blocking thread then still waits with its connection,
    /// and a retry finds the key recorded (a replay) or free (it runs).
    async fn insert_recorded<E>(
        &self,
        request: LedgerRequest<'_>,
        one: OneStatement,
    ) -> Result<Option<Outcome>, LedgerError<E>> {
        let (now, expires_at) = self.entry_times();
        let entry = NewEntry::new(
            request.key.as_str().to_owned(),
            request.user_id.to_owned(),
            request.fingerprint.as_str().to_owned(),
            &one.response,
            now,
            expires_at,
        );
        let pool = self.inner.pool.clone();
        let row = one.row;
        #[cfg(feature = "fault-points")]
        let key = request.key.as_str().to_owned();
        let statement = tokio::task::spawn_blocking(move || {
            let mut pooled = pool.get().map_err(|e| e.to_string())?;
            let written = match pooled.conn() {
                Conn::Postgres(c) => row.insert_recorded(c, &entry),
                Conn::Sqlite(_) => Ok(false),
            };
            // Classified while the connection is still held: one that lost
            // its server is then dropped instead of going back to the pool.
            let failure = written.as_ref().err().map(classify);
            #[cfg(feature = "fault-points")]
            crate::fault::pass_blocking(crate::fault::Point::AfterOneStatement, &key)
                .map_err(|e| e.to_string())?;
            drop(pooled);
            Ok::<_, String>((written, failure))
        });
        let written = tokio::time::timeout(write_bound(self.inner.settings.lease), statement)
            .await
            .map_err(|_| {
                LedgerError::Unavailable(format!(
                    "no answer within the lease plus {} s: the outcome is unknown",
                    COMMIT_GRACE.as_secs()
                ))
            })?
            .map_err(|e| LedgerError::Internal(e.to_string()))?
            .map_err(LedgerError::Unavailable)?;
        match written {
            (Ok(true), _) => Ok(Some(Outcome::Executed(one.response))),
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
        let keep = chrono::Duration::from_std(self.inner.settings.retention)
            .unwrap_or(chrono::Duration::MAX);
        let expires_at = now
            .checked_add_signed(keep)
            .unwrap_or(DateTime::<Utc>::MAX_UTC);
        (now, expires_at)
    }

    /// Logged with its key, answered as a defect: never a made-up answer.
    fn unreplayable<E>(&self, request: LedgerRequest<'_>, cause: Unreplayable) -> LedgerError<E> {
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

    /// One try at running `mutation` for the key as a unit of writing.
    fn unit<E, F>(
        &self,
        request: LedgerRequest<'_>,
        mutation: F,
    ) -> impl FnOnce(&mut Conn<'_>) -> Result<Outcome, Abort<E, F>> + Send + 'static
    where
        F: FnOnce(&mut LedgerTx<'_, '_>) -> Result<Completion, E> + Send + 'static,
        E: Send + 'static,
    {
        let key = request.key.as_str().to_owned();
        let user = request.user_id.to_owned();
        let fingerprint = request.fingerprint.as_str().to_owned();
        let (now, expires_at) = self.entry_times();
        let lease = self.inner.settings.lease;
        let lock_wait = pg_lock_wait(lease);
        move |conn: &mut Conn<'_>| -> Result<Outcome, Abort<E, F>> {
            let entry =
                |conn: &mut Conn<'_>, fingerprint: &str| -> Result<Option<Outcome>, Abort<E, F>> {
                    match store::find(conn, &key, &user)? {
                        Some(found) => decide(found, fingerprint)
                            .map(Some)
                            .map_err(Abort::Unreplayable),
                        None => Ok(None),
                    }
                };
            // The unit's own bound on a wait for a row lock, which a
            // distributed backend carries to every node it touches.
            store::bound_lock_waits(conn, lock_wait)?;
            if !store::lock_key(conn, &key, &user)? {
                return Err(Abort::Busy(mutation));
            }
            // The lease runs from the moment the unit holds the key, not
            // from the request's start: a request that waited for a dying
            // holder still gets its whole lease.
            let started = std::time::Instant::now();
            let completion = mutation(&mut LedgerTx { conn }).map_err(Abort::Operation)?;
            let found = match completion {
                // The effect exists already; the key's own entry, when it
                // has one by now, is the answer it recorded.
                Completion::ReplayFound(response) => {
                    entry(conn, &fingerprint)?.unwrap_or(Outcome::Replayed(response))
                }
                Completion::KeyReusedFound => {
                    entry(conn, &fingerprint)?.unwrap_or(Outcome::KeyReused)
                }
                Completion::Record(response) => {
                    // The fence: a holder past its lease must not record.
                    if started.elapsed() >= lease {
                        return Err(Abort::LeaseExpired);
                    }
                    let new = NewEntry::new(
                        key.clone(),
                        user.clone(),
                        fingerprint.clone(),
                        &response,
                        now,
                        expires_at,
                    );
                    if store::record(conn, &new)? {
                        return Ok(Outcome::Executed(response));
                    }
                    // Recorded by another request since the read: this
                    // unit's change must not persist; that entry answers.
                    entry(conn, &fingerprint)?.unwrap_or(Outcome::InProgress)
                }
            };
            // Roll back: what the mutation did (if anything) must not stay.
            Err(Abort::Answer(found))
        }
    }

    /// Deletes expired entries in batches of `batch` rows, each batch its
    /// own short unit of writing so live requests interleave. Stops after
    /// `max_batches` batches (or when nothing expired is left); returns how
    /// many entries went. It blocks: call it off the async workers.
    pub fn purge_expired(
        pool: &Pool,
        batch: i64,
        max_batches: usize,
    ) -> Result<usize, LedgerError<std::convert::Infallible>> {
        let mut total: usize = 0;
        for _ in 0..max_batches {
            let now = Utc::now();
            let deleted = pool
                .write_blocking(move |conn| store::purge_batch(conn, now, batch))?
                .map_err(database_error)?;
            total = total.saturating_add(deleted);
            if i64::try_from(deleted).unwrap_or(i64::MAX) < batch {
                break;
            }
        }
        Ok(total)
    }
}

impl<E> LedgerError<E> {
    /// The same error for a mutation of another error type; only for
    /// variants other than [`LedgerError::Operation`].
    fn map_operation<G>(self) -> LedgerError<G> {
        match self {
            LedgerError::Unavailable(s) => LedgerError::Unavailable(s),
            LedgerError::Overloaded => LedgerError::Overloaded,
            LedgerError::Database(e) => LedgerError::Database(e),
            LedgerError::Internal(s) => LedgerError::Internal(s),
            LedgerError::LeaseExpired => LedgerError::LeaseExpired,
            LedgerError::Unreplayable { key, cause } => LedgerError::Unreplayable { key, cause },
            LedgerError::Operation(_) => {
                LedgerError::Internal("a mutation's error crossed mutations".into())
            }
        }
    }
}

/// The row and answer of [`Ledger::execute_insert`]'s one-statement path.
struct OneStatement {
    row: Arc<dyn RecordedInsert>,
    response: RecordedResponse,
}

/// A row the one-statement path inserts with its entry, its type erased.
trait RecordedInsert: Send + Sync {
    fn insert_recorded(
        &self,
        conn: &mut diesel::PgConnection,
        entry: &NewEntry,
    ) -> Result<bool, DieselError>;
}

impl<R: Row> RecordedInsert for R {
    fn insert_recorded(
        &self,
        conn: &mut diesel::PgConnection,
        entry: &NewEntry,
    ) -> Result<bool, DieselError> {
        store::insert_recorded(conn, self, entry)
    }
}

/// Why the read could not look.
enum ReadFailure {
    Unavailable(crate::db::Unavailable),
    Database(DieselError),
}

/// How [`Ledger::execute_insert`]'s unit failed.
enum InsertError<E> {
    Database(DieselError),
    Found(E),
}

/// The decision for an existing entry: every entry is complete, so it is a
/// replay or a refusal — unless it cannot be replayed as recorded.
fn decide(entry: store::Entry, fingerprint: &str) -> Result<Outcome, Unreplayable> {
    if entry.fingerprint != fingerprint {
        return Ok(Outcome::KeyReused);
    }
    entry.response.map(Outcome::Replayed)
}

/// How long a PostgreSQL statement waits for a lock another transaction
/// holds before it gives up (then [`Outcome::InProgress`]): [`PG_LOCK_WAIT`],
/// or half the lease when that is shorter — strictly below the lease's
/// `statement_timeout`, so that the lock wait, started later, fires first
/// (with equal timeouts the statement's would, and a duplicate would be
/// answered 503 instead of "in progress"). Every pooled session starts with
/// it, and every unit of writing sets it again for its own transaction.
pub(crate) fn pg_lock_wait(lease: Duration) -> Duration {
    PG_LOCK_WAIT.min(lease / 2).max(Duration::from_millis(1))
}

fn database_error<E>(e: DieselError) -> LedgerError<E> {
    match classify(&e) {
        Failure::Unavailable | Failure::LockTimeout => LedgerError::Unavailable(e.to_string()),
        Failure::Internal => LedgerError::Database(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A statement that waits for a lock gives up before the lease's
    /// `statement_timeout` would cut it, whatever the lease: the duplicate
    /// is answered "in progress", never `503`.
    #[test]
    fn the_lock_wait_is_below_the_lease_and_at_most_its_own_bound() {
        for millis in [4, 100, 1_000, 2_000, 3_999, 4_000, 30_000, 600_000] {
            let lease = Duration::from_millis(millis);
            let wait = pg_lock_wait(lease);
            assert!(wait < lease, "{wait:?} for a lease of {lease:?}");
            assert!(wait <= PG_LOCK_WAIT, "{wait:?} for a lease of {lease:?}");
            assert!(
                wait >= (lease / 2).min(PG_LOCK_WAIT),
                "{wait:?} for a lease of {lease:?}"
            );
        }
    }
}
