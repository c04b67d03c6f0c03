//! Why the database could not be set up at start.

use super::{Backend, DatabaseUrl, one_line, url};

/// Why the database could not be set up at start.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("cannot open database {target}: {cause}")]
    Connect { target: String, cause: String },
    #[error("database {name:?} does not exist on {target} and could not be created: {cause}")]
    CreateDatabase {
        name: String,
        target: String,
        cause: String,
    },
    #[error("cannot read database {target}: {cause}")]
    Read { target: String, cause: String },
    #[error("cannot apply migrations to {target}: {cause}")]
    Migrate { target: String, cause: String },
    #[error("cannot build the connection pool: {0}")]
    Pool(String),
    /// A command that must not create the database found none.
    #[error("no database at {target}: {command} creates none (`orders-api migrate` creates it)")]
    Missing {
        target: String,
        command: &'static str,
    },
    /// A command that only reads found migrations to apply.
    #[error(
        "database {target} is not up to date ({pending} migration(s) pending): {command} only \
         reads (`orders-api migrate` applies them)"
    )]
    NotMigrated {
        target: String,
        pending: usize,
        command: &'static str,
    },
}

impl SetupError {
    /// A connection that could not be opened: the URL as typed (never its
    /// password) and the cause on one line (libpq may quote the whole URL
    /// in it: scrubbed); for SQLite, what is wrong with the location when
    /// the driver only says it cannot open the file.
    pub(super) fn connect(url: &DatabaseUrl, error: &diesel::ConnectionError) -> Self {
        let driver = url.scrub(&one_line(&error.to_string()));
        SetupError::Connect {
            target: url.to_string(),
            cause: match url.backend() {
                Backend::Sqlite => url::sqlite_open_cause(url.as_str(), driver),
                Backend::Postgres => driver,
            },
        }
    }
}
