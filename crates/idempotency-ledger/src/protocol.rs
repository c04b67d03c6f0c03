//! The protocol: how one mutating request is answered, on any storage.
//! This is the normative statement; everything else in the crate is how a
//! step is done on one backend, or made cheaper.
//!
//! # The decision
//!
//! What the key's entry — `(user, key)`, recorded with the change it
//! answers, complete or absent — says to a request ([`decide`]):
//!
//! | the key's entry                      | the answer                                       |
//! |--------------------------------------|--------------------------------------------------|
//! | recorded for the same fingerprint    | **replay** its response ([`Outcome::Replayed`])   |
//! | recorded for another fingerprint     | **refuse** the key ([`Outcome::KeyReused`])       |
//! | none, and the key is free            | **run** the change once ([`Outcome::Executed`])   |
//! | none, and another request holds it   | **in progress** ([`Outcome::InProgress`]) past the wait |
//!
//! # The steps of [`Ledger::execute`]
//!
//! Each step holds only what it needs:
//!
//! 0. **answer without writing**: while every write slot of the process is
//!    taken, shed the request ([`LedgerError::Overloaded`]); an entry a read
//!    found less than [`Settings::remember`](crate::Settings::remember) ago answers from memory; a key
//!    another request of this process holds is read first (a recorded key's
//!    retries never wait for one another);
//! 1. **wait for the key**: for the request of this process that holds it,
//!    holding nothing (no thread, no connection, no slot), at most
//!    [`Settings::wait`](crate::Settings::wait); a key with
//!    [`Settings::waiters_per_key`](crate::Settings::waiters_per_key) waiters is
//!    in progress at once;
//! 2. **read**: [`Storage::find`] the entry, and [`decide`];
//! 3. **admit**: a write slot, or [`LedgerError::Overloaded`] at once, and
//!    the backend's share ([`Storage::share`]: on PostgreSQL a write
//!    connection);
//! 4. **the unit** ([`Storage::unit`]), all of it one transaction: **lock**
//!    ([`Storage::try_lock`], tried, never waited for: a key another unit
//!    holds rolls the try back, gives back slot and share, pauses and goes
//!    back to step 2), **change** (the mutation, once), **fence** (a unit
//!    past its lease may not record), **record** ([`Storage::record`],
//!    `INSERT … ON CONFLICT DO NOTHING`: when it writes nothing another
//!    request recorded the key since the read, the change is rolled back
//!    and that entry answers), **commit**.
//!
//! So exactly one request per key ever commits its change, a change never
//! persists without its entry, and nothing of a request is committed before
//! its answer: a holder that dies leaves its key free at once. A backend
//! may do step 4 faster for a change that is one row ([`Storage::create`]:
//! PostgreSQL's one statement); whatever it cannot decide goes the way above.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use diesel::{Connection, SqliteConnection, connection::SimpleConnection};
//! use idempotency_ledger::db::{Backend, Pool, PoolOptions};
//! use idempotency_ledger::{Completion, Fingerprint, IdempotencyKey, Ledger, LedgerRequest};
//! use idempotency_ledger::{Outcome, RecordedResponse, Settings};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let file = std::env::temp_dir().join(format!("protocol-{}.db", std::process::id()));
//! let file = file.to_str().ok_or("a UTF-8 path")?;
//! let options = PoolOptions {
//!     max_size: 2,
//!     connection_timeout: Duration::from_secs(5),
//!     lease: Duration::from_secs(30),
//!     write_queue: 16,
//!     shown: "the example".into(),
//! };
//! SqliteConnection::establish(file)?.batch_execute(idempotency_ledger::SQLITE_DDL)?;
//! let pool = Pool::connect(Backend::Sqlite, file, &options)?;
//! let ledger = Ledger::new(pool, Settings {
//!     retention: Duration::from_secs(86_400),
//!     wait: Duration::from_secs(5),
//!     waiters_per_key: 16,
//!     write_admission: 64,
//!     remember: Duration::from_secs(1),
//! });
//! let key = IdempotencyKey::parse(b"k-1")?;
//! let asked = |body: &[u8]| Fingerprint::of("POST", "/pay", body, None);
//! let answer = |body: &[u8]| {
//!     let response = RecordedResponse { status: 201, headers: vec![], body: body.to_vec() };
//!     move |_: &mut idempotency_ledger::LedgerTx<'_, '_>| Ok::<_, ()>(Completion::Record(response))
//! };
//! let rt = tokio::runtime::Runtime::new()?;
//! let run = |fingerprint: &Fingerprint, body: &[u8]| {
//!     let request = LedgerRequest { user_id: "alice", key: &key, fingerprint };
//!     rt.block_on(ledger.execute(request, answer(body)))
//! };
//! let (first, second) = (asked(b"1"), asked(b"2"));
//! assert!(matches!(run(&first, b"paid")?, Outcome::Executed(r) if r.body == b"paid"));
//! // A retry replays what the first answered; its own change never runs.
//! assert!(matches!(run(&first, b"again")?, Outcome::Replayed(r) if r.body == b"paid"));
//! // The key with another request is refused.
//! assert_eq!(run(&second, b"other")?, Outcome::KeyReused);
//! # drop(ledger);
//! # for suffix in ["", "-wal", "-shm"] { let _ = std::fs::remove_file(format!("{file}{suffix}")); }
//! # Ok(())
//! # }
//! ```

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use diesel::result::Error as DieselError;
use tokio::time::Instant;

use crate::Ledger;
use crate::admission::Admitted;
use crate::conn::{Conn, Failure, WriteError};
pub use crate::conn::{Created, StorageError};
pub use crate::entry::{Entry, NewEntry};
use crate::failure::classify;
use crate::inflight::{Entered, Running};
use crate::ledger::{Completion, LedgerError, LedgerRequest, LedgerTx, Outcome, unreplayable};
use crate::response::Unreplayable;
use crate::row::Row;
use crate::work::{Abort, Change, Insert, Work};

/// What the protocol asks of a database: find the entry, run a unit, and
/// inside a unit try the key's lock and record. Each backend implements it
/// in its own folder (`sqlite/`, `pg/`); [`Pool`](crate::db::Pool) is
/// either.
pub trait Storage: Send + Sync + 'static {
    /// What admission holds of the storage while a unit may write.
    type Share: Send;

    /// How long a unit may hold its key (the pool's lease).
    fn lease(&self) -> Duration;

    /// **Find the entry** of `(user, key)`, outside any unit; unavailable
    /// past the pool's read bound ([`Pool::read_bound`](crate::db::Pool::read_bound)).
    fn find(
        &self,
        user: &str,
        key: &str,
    ) -> impl Future<Output = Result<Option<Entry>, StorageError>> + Send;

    /// **Run a unit**: `work` as one transaction — `Ok` commits durably,
    /// `Err` rolls back; an outer `Err` leaves its fate that of a rolled
    /// back unit, unless it says the outcome is unknown.
    fn unit<F, T, E>(
        &self,
        work: F,
    ) -> impl Future<Output = Result<Result<T, E>, WriteError>> + Send
    where
        F: FnOnce(&mut Conn<'_>) -> Result<T, E> + Send + 'static,
        T: Send + 'static,
        E: From<DieselError> + Send + 'static;

    /// **Try the key's lock**, first in a unit: `false` at once when
    /// another unit holds it.
    fn try_lock(
        conn: &mut Conn<'_>,
        user: &str,
        key: &str,
        lease: Duration,
    ) -> Result<bool, DieselError>;

    /// **Record** the key's entry in the unit: `false` when it has one.
    fn record(conn: &mut Conn<'_>, entry: &NewEntry) -> Result<bool, DieselError>;

    /// Admission's share of the storage; `None` when none came in time.
    fn share(&self) -> impl Future<Output = Option<Self::Share>> + Send;

    /// A unit that only inserts `row`, done in one go when the backend can
    /// (lock, row and entry; `entry` is made only then).
    fn create<R: Row>(
        &self,
        row: Arc<R>,
        entry: impl FnOnce() -> NewEntry + Send,
    ) -> impl Future<Output = Result<Created, StorageError>> + Send {
        let _ = (row, entry);
        async { Ok(Created::Undecided) }
    }
}

/// How one try of the unit ended.
pub(crate) enum Attempt {
    /// Answered (committed, or rolled back with its answer).
    Done(Outcome),
    /// Another unit holds the key: rolled back before the change ran.
    Busy,
}

/// The decision for the key's entry: every entry is complete, so it is a
/// replay or a refusal — unless it cannot be replayed as recorded.
pub fn decide(entry: Entry, fingerprint: &str) -> Result<Outcome, Unreplayable> {
    if entry.fingerprint != fingerprint {
        return Ok(Outcome::KeyReused);
    }
    entry.response.map(Outcome::Replayed)
}

/// The first pause after a busy try; it doubles up to [`POLL_MAX`].
const POLL_FIRST: Duration = Duration::from_millis(10);
const POLL_MAX: Duration = Duration::from_millis(200);

impl<S: Storage> Ledger<S> {
    /// Answers one mutating request by the steps above: replays, refuses,
    /// or runs `mutation` exactly once and records its response in the same
    /// unit. `mutation`'s `Err` rolls the unit back and frees the key (give
    /// it only for answers that must not be recorded, such as a `5xx`).
    pub async fn execute<E, F>(
        &self,
        request: LedgerRequest<'_>,
        mutation: F,
    ) -> Result<Outcome, LedgerError<E>>
    where
        F: FnOnce(&mut LedgerTx<'_, '_>) -> Result<Completion, E> + Send + 'static,
        E: Send + 'static,
    {
        self.run(request, move || Change(mutation)).await
    }

    /// [`Ledger::execute`] for a change that is inserting one row: `make`
    /// builds the row and its answer once the read found no entry (a
    /// replay builds neither); the ledger inserts it, and when the row
    /// exists already (its unique constraint) `found` decides in the unit
    /// what that means: a replay of that effect, or a reused key.
    pub async fn execute_insert<R, E, F, M>(
        &self,
        request: LedgerRequest<'_>,
        make: M,
        found: F,
    ) -> Result<Outcome, LedgerError<E>>
    where
        R: Row,
        M: FnOnce() -> (R, crate::RecordedResponse) + Send,
        F: FnOnce(&mut LedgerTx<'_, '_>) -> Result<Completion, E> + Send + 'static,
        E: Send + 'static,
    {
        self.run(request, move || Insert::new(make(), found)).await
    }

    /// The steps, in order; `build` makes the change once the read found
    /// no entry (a replay or a refusal never builds it).
    async fn run<E: Send + 'static, W: Work<E>>(
        &self,
        request: LedgerRequest<'_>,
        build: impl FnOnce() -> W + Send,
    ) -> Result<Outcome, LedgerError<E>> {
        let deadline = Instant::now() + self.settings().wait;
        if let Some(outcome) = self.answer_without_writing(request).await? {
            return Ok(outcome);
        }
        let Some(_holder) = self.wait_for_key(request, deadline).await else {
            return Ok(Outcome::InProgress);
        };
        if let Some(outcome) = self.read(request).await? {
            return Ok(outcome);
        }
        let (mut slot, mut share) = self.admit().await?;
        let work = build();
        if let Some(outcome) = self.create(request, work.insert()).await? {
            return Ok(outcome);
        }
        // Taken by the unit once it holds the key: a busy try leaves it.
        let work = Arc::new(Mutex::new(Some(work)));
        let mut pause = POLL_FIRST;
        loop {
            if let Attempt::Done(outcome) = self.attempt(request, &work).await? {
                return Ok(outcome);
            }
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                return Ok(Outcome::InProgress);
            };
            drop((slot, share)); // given back while this request waits
            tokio::time::sleep(pause.min(left)).await;
            pause = pause.saturating_mul(2).min(POLL_MAX);
            if let Some(outcome) = self.read(request).await? {
                return Ok(outcome);
            }
            (slot, share) = self.admit().await?;
        }
    }

    /// Step 0: shed, memory, and the read of a key held here.
    async fn answer_without_writing<E>(
        &self,
        request: LedgerRequest<'_>,
    ) -> Result<Option<Outcome>, LedgerError<E>> {
        let inner = &*self.inner;
        let (user, key) = (request.user_id, request.key.as_str());
        if inner.admission.is_full() {
            return Err(LedgerError::Overloaded);
        }
        if let Some(outcome) = inner
            .remembered
            .answer(user, key, request.fingerprint.as_str())
        {
            return Ok(Some(outcome));
        }
        if inner.in_flight.is_held(user, key) {
            return self.read(request).await;
        }
        Ok(None)
    }

    /// Step 1: the key, once no other request of this process holds it.
    async fn wait_for_key(&self, request: LedgerRequest<'_>, until: Instant) -> Option<Running> {
        let (user, key) = (request.user_id, request.key.as_str());
        let lease = self.pool().lease();
        match self.inner.in_flight.enter(user, key, until, lease).await {
            Entered::Holder(running) => {
                #[cfg(feature = "fault-points")]
                crate::fault::pass(crate::fault::Point::AfterEnter, key).await;
                Some(running)
            }
            Entered::GaveUp | Entered::Crowded => None,
        }
    }

    /// Step 2: the entry decides, if there is one; what it answers is
    /// remembered ([`Settings::remember`](crate::Settings::remember)).
    async fn read<E>(&self, request: LedgerRequest<'_>) -> Result<Option<Outcome>, LedgerError<E>> {
        let began = std::time::Instant::now();
        let (user, key) = (request.user_id, request.key.as_str());
        let Some(entry) = self.pool().find(user, key).await? else {
            return Ok(None);
        };
        if let Ok(response) = &entry.response {
            let (fingerprint, expires_at) = (&entry.fingerprint, entry.expires_at);
            let remembered = &self.inner.remembered;
            remembered.remember(user, key, fingerprint, response, expires_at, began);
        }
        decide(entry, request.fingerprint.as_str())
            .map(Some)
            .map_err(|cause| unreplayable(request, cause))
    }

    /// Step 3: a write slot, and the storage's share.
    async fn admit<E>(&self) -> Result<(Admitted, S::Share), LedgerError<E>> {
        let slot = self
            .admission()
            .try_admit()
            .ok_or(LedgerError::Overloaded)?;
        let no_share = || LedgerError::Unavailable("no write connection came free".into());
        Ok((slot, self.pool().share().await.ok_or_else(no_share)?))
    }

    /// Step 4 in one go, where the backend can: a change that is one row.
    async fn create<E, R: Row>(
        &self,
        request: LedgerRequest<'_>,
        insert: Option<(Arc<R>, crate::RecordedResponse)>,
    ) -> Result<Option<Outcome>, LedgerError<E>> {
        let Some((row, created)) = insert else {
            return Ok(None);
        };
        let entry = || {
            let (key, user) = (request.key.as_str().to_owned(), request.user_id.to_owned());
            let fingerprint = request.fingerprint.as_str().to_owned();
            let (now, expires_at) = self.entry_times();
            NewEntry::new(key, user, fingerprint, &created, now, expires_at)
        };
        Ok(match self.pool().create(row, entry).await? {
            Created::Written => Some(Outcome::Executed(created)),
            Created::InProgress => Some(Outcome::InProgress),
            Created::Undecided => None,
        })
    }

    /// Step 4, one try.
    async fn attempt<E: Send + 'static, W: Work<E>>(
        &self,
        request: LedgerRequest<'_>,
        work: &Arc<Mutex<Option<W>>>,
    ) -> Result<Attempt, LedgerError<E>> {
        let unit = self.unit(request, Arc::clone(work));
        Ok(Attempt::Done(match self.pool().unit(unit).await? {
            Ok(outcome) | Err(Abort::Answer(outcome)) => outcome,
            Err(Abort::Busy) => return Ok(Attempt::Busy),
            Err(Abort::Unreplayable(cause)) => return Err(unreplayable(request, cause)),
            Err(Abort::Fail(e)) => return Err(e),
            // A writer outside this protocol holds a row of this key.
            Err(Abort::Database(e)) if classify(&e) == Failure::LockTimeout => Outcome::InProgress,
            Err(Abort::Database(e)) => return Err(LedgerError::database(e)),
        }))
    }

    /// The unit: lock, change, fence, record. `Ok` commits; every `Err`
    /// rolls back, an [`Abort::Answer`] with the answer it found.
    fn unit<E: Send + 'static, W: Work<E>>(
        &self,
        request: LedgerRequest<'_>,
        work: Arc<Mutex<Option<W>>>,
    ) -> impl FnOnce(&mut Conn<'_>) -> Result<Outcome, Abort<E>> + Send + 'static {
        let (key, user) = (request.key.as_str().to_owned(), request.user_id.to_owned());
        let fingerprint = request.fingerprint.as_str().to_owned();
        let (now, expires_at) = self.entry_times();
        let lease = self.pool().lease();
        move |conn: &mut Conn<'_>| {
            if !S::try_lock(conn, &user, &key, lease)? {
                return Err(Abort::Busy);
            }
            // The lease runs from the moment the unit holds the key.
            let started = std::time::Instant::now();
            let work = work.lock().ok().and_then(|mut work| work.take());
            let work =
                work.ok_or_else(|| Abort::Fail(LedgerError::Internal("ran twice".into())))?;
            let found = match work.run(&mut LedgerTx { conn })? {
                Completion::ReplayFound(response) => Outcome::Replayed(response),
                Completion::KeyReusedFound => Outcome::KeyReused,
                Completion::Record(_) if started.elapsed() >= lease => {
                    return Err(Abort::Fail(LedgerError::LeaseExpired));
                }
                Completion::Record(response) => {
                    let (k, u, f) = (key.clone(), user.clone(), fingerprint.clone());
                    if S::record(conn, &NewEntry::new(k, u, f, &response, now, expires_at))? {
                        return Ok(Outcome::Executed(response));
                    }
                    Outcome::InProgress
                }
            };
            // Rolled back: the key's own entry, when it has one by now, answers.
            let entry = crate::entry::find(conn, &key, &user)?;
            Err(Abort::Answer(match entry {
                Some(entry) => decide(entry, &fingerprint).map_err(Abort::Unreplayable)?,
                None => found,
            }))
        }
    }
}
