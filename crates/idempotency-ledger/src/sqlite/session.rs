//! SQLite: the settings every connection starts with, and timestamps as
//! SQLite stores them.

use std::time::Duration;

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::r2d2::{self, ConnectionManager, CustomizeConnection};
use diesel::result::Error as DieselError;

/// The least time a SQLite writer waits for the database lock before giving
/// up (pooled connections wait a little longer than the lease, see
/// [`SqliteSession`]).
pub const SQLITE_BUSY_TIMEOUT: Duration = Duration::from_secs(5);

pub(crate) type SqliteManager = ConnectionManager<SqliteConnection>;

/// Per-connection SQLite settings. `busy_timeout` comes first so that the
/// following pragmas already wait for a lock instead of failing.
///
/// SQLite has one write lock for the whole file: a writer of another
/// process on the same file makes this one wait for it. A batch may hold it
/// at most its lease (past that the writer abandons it), so a connection
/// waits a little longer than the lease: a unit then runs once the other
/// writer's batch is over, instead of failing with "database is locked"
/// while that batch is still within its rights.
#[derive(Debug, Clone, Copy)]
pub struct SqliteSession {
    /// How long a statement waits for another connection's lock.
    pub busy_timeout: Duration,
}

impl SqliteSession {
    /// The settings of a pool whose units may hold the lock `lease`.
    pub fn for_lease(lease: Duration) -> Self {
        Self {
            busy_timeout: (lease + Duration::from_secs(1)).max(SQLITE_BUSY_TIMEOUT),
        }
    }

    /// Applies the settings to `conn` (a read-only file keeps its journal
    /// mode).
    pub fn apply(&self, conn: &mut SqliteConnection) -> Result<(), DieselError> {
        conn.batch_execute(&format!(
            "PRAGMA busy_timeout = {};
             PRAGMA journal_mode = WAL;
             PRAGMA synchronous = FULL;
             PRAGMA foreign_keys = ON;",
            self.busy_timeout.as_millis()
        ))
        .or_else(|e| match e.to_string().contains("readonly") {
            // A read-only file keeps its journal mode (switching is a write):
            // commands that only read (`keys list`) still work on it.
            true => conn.batch_execute("PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON;"),
            false => Err(e),
        })
    }
}

impl CustomizeConnection<SqliteConnection, r2d2::Error> for SqliteSession {
    fn on_acquire(&self, conn: &mut SqliteConnection) -> Result<(), r2d2::Error> {
        self.apply(conn).map_err(r2d2::Error::QueryError)
    }
}

/// A timestamp as text, exactly as diesel's `TimestamptzSqlite` writes it
/// (chrono's `%F %T%.f%:z`: the fraction with 0, 3, 6 or 9 digits, whichever
/// holds it exactly), without chrono's format-string interpreter: this runs
/// on the single writer, several times per unit. Years outside 1000–9999
/// and leap seconds go through chrono itself.
pub fn timestamp_text(at: &chrono::DateTime<chrono::Utc>) -> String {
    use chrono::{Datelike, Timelike};
    let nanos = at.nanosecond();
    let year = at.year();
    if !(1000..=9999).contains(&year) || nanos >= 1_000_000_000 {
        return at.format("%F %T%.f%:z").to_string();
    }
    let mut text = String::with_capacity(35);
    digits(&mut text, year.unsigned_abs(), 4);
    let two = |text: &mut String, sep: char, value: u32| {
        text.push(sep);
        digits(text, value, 2);
    };
    two(&mut text, '-', at.month());
    two(&mut text, '-', at.day());
    two(&mut text, ' ', at.hour());
    two(&mut text, ':', at.minute());
    two(&mut text, ':', at.second());
    let (fraction, width) = if nanos == 0 {
        (0, 0)
    } else if nanos.is_multiple_of(1_000_000) {
        (nanos / 1_000_000, 3)
    } else if nanos.is_multiple_of(1_000) {
        (nanos / 1_000, 6)
    } else {
        (nanos, 9)
    };
    if width > 0 {
        text.push('.');
        digits(&mut text, fraction, width);
    }
    text.push_str("+00:00");
    text
}

/// `value`'s last `width` decimal digits, zero-padded.
fn digits(text: &mut String, value: u32, width: u32) {
    let mut divisor = 10u32.pow(width.saturating_sub(1));
    while divisor > 0 {
        text.push(char::from(b'0' + ((value / divisor) % 10) as u8));
        divisor /= 10;
    }
}

#[cfg(test)]
mod tests {
    use chrono::{DateTime, TimeZone, Utc};

    use super::timestamp_text;

    #[test]
    fn a_timestamp_is_written_as_diesels_timestamptz_writes_it() {
        let base = Utc.with_ymd_and_hms(2026, 12, 1, 9, 5, 7).single();
        let base = base.map(|b| b.timestamp()).unwrap_or(0);
        let nanos = [
            0,
            1,
            999,
            1_000,
            26_000,
            123_000_000,
            123_456_000,
            123_456_789,
            999_999_999,
        ];
        let seconds = [base, 0, 253_402_300_799, -62_135_596_800, base + 86_399];
        for s in seconds {
            for n in nanos {
                let Some(at) = DateTime::from_timestamp(s, n) else {
                    continue;
                };
                assert_eq!(
                    timestamp_text(&at),
                    at.format("%F %T%.f%:z").to_string(),
                    "{at:?}"
                );
            }
        }
        assert_eq!(
            timestamp_text(&DateTime::<Utc>::MAX_UTC),
            DateTime::<Utc>::MAX_UTC.format("%F %T%.f%:z").to_string()
        );
    }
}
