//! The `idempotency_ledger` table. Every function takes a connection, so it
//! runs inside the caller's transaction when there is one.
//!
//! Results are written `Result<T, DieselError>`, diesel's `QueryResult<T>`
//! spelled out, so that mutation testing can replace what each function
//! returns (`docs/MUTANTS.md`).

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::result::Error as DieselError;

use crate::conn::Conn;
use crate::response::{RecordedResponse, Unreplayable};
use crate::row::{self, Columns, Row, Timestamp};

/// Runs `$body` once per backend, with `$c` bound to the concrete
/// connection and `$schema` to that backend's table definition.
macro_rules! dispatch {
    ($conn:expr, $c:ident, $schema:ident => $body:expr) => {
        match $conn {
            Conn::Sqlite(inner) => {
                use crate::schema::sqlite as $schema;
                let $c: &mut SqliteConnection = &mut **inner;
                $body
            }
            Conn::Postgres(inner) => {
                use crate::schema::pg as $schema;
                let $c: &mut PgConnection = &mut **inner;
                $body
            }
        }
    };
}

/// A ledger row as the decision needs it: every entry is complete (it is
/// written with its response, and the columns are `NOT NULL`).
#[derive(Debug, Clone)]
pub struct Entry {
    /// The fingerprint of the request that recorded it.
    pub fingerprint: String,
    /// The recorded response, or why it cannot be replayed.
    pub response: Result<RecordedResponse, Unreplayable>,
    /// When it may be purged.
    pub expires_at: DateTime<Utc>,
}

type Stored = (String, i32, String, Vec<u8>, DateTime<Utc>);

/// The key's entry, if it has one.
pub fn find(conn: &mut Conn<'_>, key: &str, user_id: &str) -> Result<Option<Entry>, DieselError> {
    // `get_result`, never `first`: `first` binds `LIMIT ?`, and the bundled
    // SQLite (built with `SQLITE_ENABLE_STAT4`) recompiles a cached
    // statement whose plan read a bound integer each time it is bound again.
    let row: Option<Stored> = dispatch!(conn, c, s => {
        use s::idempotency_ledger::dsl as l;
        l::idempotency_ledger
            .filter(l::idempotency_key.eq(key).and(l::user_id.eq(user_id)))
            .select((
                l::request_fingerprint,
                l::response_status,
                l::response_headers,
                l::response_body,
                l::expires_at,
            ))
            .get_result::<Stored>(c)
            .optional()
    })?;
    Ok(
        row.map(|(fingerprint, status, headers, body, expires_at)| Entry {
            fingerprint,
            response: RecordedResponse::from_stored(status, &headers, body),
            expires_at,
        }),
    )
}

/// A completed entry: the key, who sent it, the request's fingerprint and
/// the response recorded for it, described once as a [`Row`].
pub struct NewEntry {
    pub(crate) key: String,
    pub(crate) user_id: String,
    fingerprint: String,
    status: i32,
    headers: String,
    body: Vec<u8>,
    created_at: Timestamp,
    expires_at: Timestamp,
}

impl NewEntry {
    pub(crate) fn new(
        key: String,
        user_id: String,
        fingerprint: String,
        response: &RecordedResponse,
        created_at: DateTime<Utc>,
        expires_at: DateTime<Utc>,
    ) -> Self {
        Self {
            key,
            user_id,
            fingerprint,
            status: i32::from(response.status),
            headers: response.recorded_headers_json(),
            body: response.body.clone(),
            created_at: Timestamp::new(created_at),
            expires_at: Timestamp::new(expires_at),
        }
    }
}

impl Row for NewEntry {
    const TABLE: &'static str = "idempotency_ledger";
    const UNIQUE: &'static [&'static str] = &["idempotency_key", "user_id"];

    fn columns<'b, C: Columns<'b>>(&'b self, c: &mut C) -> Result<(), DieselError> {
        c.column("idempotency_key", self.key.as_str())?;
        c.column("user_id", self.user_id.as_str())?;
        c.column("request_fingerprint", self.fingerprint.as_str())?;
        c.column("response_status", &self.status)?;
        c.column("response_headers", self.headers.as_str())?;
        c.column("response_body", self.body.as_slice())?;
        c.column("created_at", &self.created_at)?;
        c.column("expires_at", &self.expires_at)
    }
}

/// Writes the key's entry with its response, `INSERT … ON CONFLICT DO
/// NOTHING`: `true` when this call wrote it, `false` when the key already
/// has an entry.
pub(crate) fn record(conn: &mut Conn<'_>, entry: &NewEntry) -> Result<bool, DieselError> {
    row::insert(conn, entry)
}

/// Deletes at most `limit` expired entries, the oldest first; returns how
/// many went. Run it inside a transaction (as [`Ledger::purge_expired`]
/// does, one short transaction per batch): on PostgreSQL it bounds that
/// transaction's lock waits first.
///
/// [`Ledger::purge_expired`]: crate::Ledger::purge_expired
pub fn purge_batch(
    conn: &mut Conn<'_>,
    now: DateTime<Utc>,
    limit: i64,
) -> Result<usize, DieselError> {
    match conn {
        Conn::Sqlite(c) => crate::sqlite::purge::batch(c, now, limit),
        Conn::Postgres(c) => crate::pg::purge::batch(c, now, limit),
    }
}

/// How many entries the ledger holds.
pub fn count(conn: &mut Conn<'_>) -> Result<i64, DieselError> {
    dispatch!(conn, c, s => s::idempotency_ledger::table.count().get_result(c))
}
