//! SQLite's purge batch.

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::result::Error as DieselError;
use diesel::sql_types::{BigInt, TimestamptzSqlite};

/// SQLite has no `DELETE … LIMIT` in its default build: delete by rowid
/// (SQLite is never distributed, and its writer runs one unit at a time).
pub(crate) fn batch(
    c: &mut SqliteConnection,
    now: DateTime<Utc>,
    limit: i64,
) -> Result<usize, DieselError> {
    diesel::sql_query(
        "DELETE FROM idempotency_ledger WHERE rowid IN \
         (SELECT rowid FROM idempotency_ledger WHERE expires_at < ? ORDER BY expires_at LIMIT ?)",
    )
    .bind::<TimestamptzSqlite, _>(now)
    .bind::<BigInt, _>(limit)
    .execute(c)
}
