//! What either backend's pool is built from, and how its failures to
//! connect are told.

use std::time::Duration;

use diesel::r2d2;
use diesel::result::Error as DieselError;

/// Pool and session settings.
#[derive(Debug, Clone)]
pub struct PoolOptions {
    /// The most connections the pool opens (readers, on SQLite).
    pub max_size: u32,
    /// How long a request waits for a free connection (or a reconnect during
    /// an outage) before it is answered unavailable.
    pub connection_timeout: Duration,
    /// The idempotency lease: on PostgreSQL no statement and no idle moment
    /// inside a transaction may outlast it; on SQLite no batch may.
    pub lease: Duration,
    /// SQLite: how many units may wait for the writer before a write is
    /// refused as overloaded.
    pub write_queue: usize,
    /// How the database is named in log lines (never with a password).
    pub shown: String,
}

/// Why a pool could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The first connection could not be opened (the driver's words).
    #[error("{0}")]
    Open(#[from] diesel::ConnectionError),
    /// It opened, but its session could not be set up.
    #[error("{0}")]
    Session(DieselError),
    /// The pool itself could not be built.
    #[error("cannot build the connection pool: {0}")]
    Pool(String),
}

pub(crate) fn pool_builder<M>(options: &PoolOptions) -> r2d2::Builder<M>
where
    M: r2d2::ManageConnection,
    M::Error: std::fmt::Display,
{
    r2d2::Pool::builder()
        .error_handler(Box::new(LogConnectError {
            database: options.shown.clone(),
        }))
        .max_size(options.max_size)
        .min_idle(Some(1))
        .connection_timeout(options.connection_timeout)
        // A dead connection is dropped when it goes back after its first
        // failed query (see `PgManager`), so a `SELECT 1` on every checkout
        // would be a wasted round trip.
        .test_on_check_out(false)
}

/// Logs a connection the pool could not open (it keeps retrying) as one
/// event on one line: which database, and the driver's words folded.
#[derive(Debug)]
struct LogConnectError {
    database: String,
}

impl<E: std::fmt::Display> r2d2::HandleError<E> for LogConnectError {
    fn handle_error(&self, error: E) {
        tracing::warn!(
            database = %self.database,
            cause = %one_line(&error.to_string()),
            "cannot open a database connection; retrying"
        );
    }
}

/// A driver's message as one line. libpq writes a hint, a wrapped sentence
/// or the next host's error on lines of their own (tab-indented); they are
/// joined so that each sentence still reads as one: `… Connection refused.
/// Is the server running on that host …?`.
pub fn one_line(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    for line in message.lines() {
        let line = line.split_whitespace().collect::<Vec<_>>().join(" ");
        if line.is_empty() {
            continue;
        }
        if !out.is_empty() {
            let continues = line.starts_with(|c: char| c.is_lowercase());
            let ended = out.ends_with(['.', '?', '!', ':', ';']);
            out.push_str(if ended || continues { " " } else { ". " });
        }
        out.push_str(&line);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::one_line;

    #[test]
    fn a_drivers_message_on_several_lines_reads_as_one_line_of_sentences() {
        // libpq: the error, then its hint on a tab-indented line of its own.
        let libpq = "connection to server at \"127.0.0.1\", port 5999 failed: Connection refused\n\
                     \tIs the server running on that host and accepting TCP/IP connections?\n";
        assert_eq!(
            one_line(libpq),
            "connection to server at \"127.0.0.1\", port 5999 failed: Connection refused. \
             Is the server running on that host and accepting TCP/IP connections?"
        );
        // A sentence wrapped onto the next line goes on after a space, as
        // does one after a line that ended its own sentence; blank lines
        // and runs of spaces are dropped.
        assert_eq!(
            one_line(
                "could not translate host name \"db\" to\n  address: Name or service not known\n\n"
            ),
            "could not translate host name \"db\" to address: Name or service not known"
        );
        assert_eq!(
            one_line("FATAL:  too many connections.\nRetry later."),
            "FATAL: too many connections. Retry later."
        );
        assert_eq!(one_line("one line already"), "one line already");
        assert_eq!(one_line(""), "");
    }
}
