//! An `Idempotency-Key` ledger for diesel services, on SQLite and
//! PostgreSQL: a retried request replays the first answer and changes
//! nothing, the same key with another request is refused, concurrent
//! duplicates never both run, and a crash never leaves a key stuck or a
//! change without its answer.
//!
//! What a response cache cannot promise, this does: the change and the
//! answer recorded for its key **commit in one transaction** (both persist
//! or neither does), so a crash between them is impossible, and nothing of
//! a request is committed before its answer is known — a process killed
//! mid-request leaves its key free at once.
//!
//! # How a request is answered
//!
//! [`Ledger::execute`] takes a request — a user, an [`IdempotencyKey`], a
//! [`Fingerprint`] of what was asked — and the mutation to run for it. It
//! waits for another request of this process holding the key (holding
//! nothing meanwhile), reads the key's entry (a replay, or a refusal of a
//! different request), and otherwise runs the mutation as one unit of
//! writing that records its response with it. The protocol — its decision
//! table and its steps — is stated once, in `src/protocol.rs`
//! ([`protocol`]); [`Ledger::execute_insert`] is the path of a mutation
//! that inserts one row.
//!
//! # What it asks of the application
//!
//! - **Its tables**: the ledger's own ([`SQLITE_DDL`], [`POSTGRES_DDL`]),
//!   created by the application's migrations beside its own tables.
//! - **A transaction per unit**: the mutation gets a [`LedgerTx`] and does
//!   all its writing through `tx.conn()` (or [`LedgerTx::insert`]), with
//!   no transaction of its own, no other connection, and no effect outside
//!   the database (it may be rolled back after it ran).
//! - **Its effect keyed too**, when it must outlive the ledger's retention:
//!   a unique constraint that includes the key (an order's
//!   `UNIQUE (user_id, idempotency_key)`), so a retry after the purge finds
//!   the effect ([`Completion::ReplayFound`]) instead of making a second.
//! - **SQLite's single writer**: every unit of a process runs on one writer
//!   thread, many units to a transaction, answered after one `COMMIT`
//!   (group commit, `synchronous = FULL`); a mutation is a handful of
//!   statements, not a place to wait.
//! - **An async runtime**: tokio (actix-web runs on it). Blocking database
//!   work runs on `spawn_blocking` threads; a request waiting for its key
//!   or for the writer holds none.
//!
//! # A service in a few dozen lines
//!
//! ```no_run
//! use std::time::Duration;
//!
//! use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};
//! use diesel::prelude::*;
//! use idempotency_ledger::db::{Backend, Pool, PoolOptions};
//! use idempotency_ledger::row::{Columns, Row};
//! use idempotency_ledger::{
//!     Completion, Fingerprint, IdempotencyKey, Ledger, LedgerRequest, Outcome,
//!     RecordedResponse, Settings,
//! };
//!
//! /// A payment: its table has `UNIQUE (payer, idempotency_key)`.
//! struct NewPayment {
//!     payer: String,
//!     idempotency_key: String,
//!     cents: i64,
//! }
//!
//! impl Row for NewPayment {
//!     const TABLE: &'static str = "payments";
//!     const UNIQUE: &'static [&'static str] = &["payer", "idempotency_key"];
//!     fn columns<'b, C: Columns<'b>>(&'b self, c: &mut C) -> QueryResult<()> {
//!         c.column("payer", self.payer.as_str())?;
//!         c.column("idempotency_key", self.idempotency_key.as_str())?;
//!         c.column("cents", &self.cents)
//!     }
//! }
//!
//! async fn pay(req: HttpRequest, body: web::Bytes, ledger: web::Data<Ledger>) -> HttpResponse {
//!     let payer = "alice"; // who the bearer token names
//!     let values = req.headers().get_all("Idempotency-Key").map(|v| v.as_bytes());
//!     let Ok(key) = IdempotencyKey::from_values(values) else {
//!         return HttpResponse::BadRequest().body("Idempotency-Key is required");
//!     };
//!     let Ok(json) = serde_json::from_slice::<serde_json::Value>(&body) else {
//!         return HttpResponse::BadRequest().finish();
//!     };
//!     let Some(cents) = json["cents"].as_i64() else {
//!         return HttpResponse::UnprocessableEntity().finish();
//!     };
//!     let fingerprint = Fingerprint::of("POST", req.path(), &body, Some(&json));
//!     let request = LedgerRequest { user_id: payer, key: &key, fingerprint: &fingerprint };
//!     let make = || {
//!         let row = NewPayment { payer: payer.into(), idempotency_key: key.as_str().into(), cents };
//!         (row, RecordedResponse { status: 201, headers: vec![], body: b"paid".to_vec() })
//!     };
//!     // Found already (after the purge): a replay of what it said then.
//!     let found = |_: &mut idempotency_ledger::LedgerTx<'_, '_>| {
//!         Ok::<_, ()>(Completion::ReplayFound(RecordedResponse {
//!             status: 200, headers: vec![], body: b"paid".to_vec(),
//!         }))
//!     };
//!     match ledger.execute_insert(request, make, found).await {
//!         Ok(Outcome::Executed(r)) => HttpResponse::Created().body(r.body),
//!         Ok(Outcome::Replayed(r)) => HttpResponse::Ok().insert_header(("Idempotent-Replayed", "true")).body(r.body),
//!         Ok(Outcome::KeyReused) => HttpResponse::Conflict().body("key reused"),
//!         Ok(Outcome::InProgress) => HttpResponse::Conflict().insert_header(("Retry-After", "1")).finish(),
//!         Err(_) => HttpResponse::ServiceUnavailable().insert_header(("Retry-After", "1")).finish(),
//!     }
//! }
//!
//! #[actix_web::main]
//! async fn main() -> std::io::Result<()> {
//!     let options = PoolOptions {
//!         max_size: 8,
//!         connection_timeout: Duration::from_secs(5),
//!         lease: Duration::from_secs(30),
//!         write_queue: 1024,
//!         shown: "payments.db".into(),
//!     };
//!     let pool = Pool::connect(Backend::Sqlite, "payments.db", &options)
//!         .map_err(std::io::Error::other)?;
//!     let ledger = web::Data::new(Ledger::new(pool, Settings {
//!         retention: Duration::from_secs(86_400),
//!         wait: Duration::from_secs(5),
//!         waiters_per_key: 16,
//!         write_admission: 64,
//!         remember: Duration::from_secs(1),
//!     }));
//!     HttpServer::new(move || App::new().app_data(ledger.clone()).route("/payments", web::post().to(pay)))
//!         .bind("127.0.0.1:8080")?
//!         .run()
//!         .await
//! }
//! ```
//!
//! # Parts
//!
//! - [`IdempotencyKey`]: the header's rules (1–255 printable ASCII
//!   characters; an RFC 8941 string means its content);
//! - [`Fingerprint`]: what makes two requests the same (method, path, and
//!   the body's canonical JSON, exact for numbers of any size);
//! - [`protocol`]: the protocol itself — the decision, the steps of
//!   [`Ledger::execute`], and the [`Storage`](protocol::Storage) they ask
//!   of a database;
//! - [`Ledger`]: what a request asks and how it is answered; write
//!   admission ([`Admission`]), the keys in flight, the memory of what
//!   reads found, the purge;
//! - [`db`]: the pool of either backend (SQLite's group-committing writer,
//!   PostgreSQL's tried lock and one-statement create); [`row`]: a row
//!   described once, from which every insert is built; [`schema`]: the
//!   ledger's table.

#![warn(missing_docs)]

mod admission;
mod conn;
mod entry;
mod failure;
#[cfg(feature = "fault-points")]
pub mod fault;
mod fingerprint;
mod inflight;
#[cfg(any(test, feature = "invariants"))]
pub mod invariants;
mod key;
mod ledger;
mod options;
mod pg;
mod pool;
pub mod protocol;
mod remembered;
mod response;
pub mod row;
pub mod schema;
mod sqlite;
mod work;

pub use admission::{Admission, DEFAULT_WRITE_ADMISSION};
pub use fingerprint::{Fingerprint, canonical_json};
pub use key::{HEADER, IdempotencyKey, KeyError, MAX_LEN};
pub use ledger::{
    Completion, DEFAULT_WAITERS_PER_KEY, LedgerError, LedgerRequest, LedgerTx, Outcome, Settings,
};
pub use response::{RECORDED_HEADERS, RecordedResponse, Unreplayable};

/// The idempotency ledger of one process: its settings, its storage (a
/// [`Pool`](db::Pool) of either backend unless another
/// [`Storage`](protocol::Storage) is named), the keys it is running
/// requests for, and its write admission; how it answers is [`protocol`].
/// Cheap to clone (one `Arc`).
pub struct Ledger<S = db::Pool> {
    inner: std::sync::Arc<ledger::Inner<S>>,
}

impl<S> Clone for Ledger<S> {
    fn clone(&self) -> Self {
        Self {
            inner: std::sync::Arc::clone(&self.inner),
        }
    }
}

/// The ledger's table on SQLite, for the application's migrations.
pub const SQLITE_DDL: &str = include_str!("../sql/sqlite.sql");
/// The ledger's table on PostgreSQL, for the application's migrations.
pub const POSTGRES_DDL: &str = include_str!("../sql/postgres.sql");

pub mod db {
    //! The storage a ledger writes through: a connection [`Pool`] of either
    //! backend, each implementing the protocol's
    //! [`Storage`](crate::protocol::Storage) in its own folder
    //! (`src/sqlite/`, `src/pg/`; how a request is answered is
    //! `src/protocol.rs`, not restated here).
    //!
    //! - SQLite: pooled connections for reads, and one group-committing
    //!   [`writer`] that runs every unit of the process, each in a savepoint
    //!   of a shared transaction, and answers them all after one `COMMIT`.
    //! - PostgreSQL: one pool for both, whose sessions start with the
    //!   lease's timeouts; a unit is a read-committed transaction run on a
    //!   blocking thread.

    // The pool, its connections, and a unit's failures.
    pub use crate::conn::{COMMIT_GRACE, Conn, Unavailable, WriteError, write_bound};
    pub use crate::options::{ConnectError, PoolOptions, one_line};
    pub use crate::pool::{Backend, Pool, PooledConn};
    // How a failed query is answered, whatever the server's language.
    pub use crate::conn::Failure;
    pub use crate::failure::classify;
    pub use crate::pg::session::drop_if_lost;
    // The ledger's table, for a command or an operator: its size, a purge
    // batch in the caller's transaction, PostgreSQL's purge statement (to
    // `EXPLAIN` it), and a key's advisory lock (to see it in `pg_locks`).
    pub use crate::entry::{count, purge_batch};
    pub use crate::pg::lock::{PG_LOCK_WAIT, lock_id};
    pub use crate::pg::purge::PURGE_POSTGRES;
    // SQLite's sessions, and timestamps as it stores them.
    pub use crate::sqlite::session::{SQLITE_BUSY_TIMEOUT, SqliteSession, timestamp_text};
    pub use crate::sqlite::writer;
}
