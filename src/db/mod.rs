//! The server's storage: which backend `DATABASE_URL` selects (`url.rs`),
//! the migrations that create every table (`migrate.rs`), the tables of the
//! orders domain and of API keys (`schema.rs`), and why setting up the
//! database failed (`setup.rs`).
//!
//! The pool and the unit of writing are the idempotency ledger's
//! ([`idempotency_ledger::db`]): one pool serves the ledger, the orders
//! domain and API keys, so that an order and its key's entry commit in one
//! transaction.
//!
//! Query code is written once and compiled for both backends by
//! [`dispatch!`]. A lookup by a unique key uses `get_result`, never
//! `first`: `first` binds `LIMIT ?`, and the bundled SQLite (built with
//! `SQLITE_ENABLE_STAT4`) expires a cached statement whose plan read a bound
//! integer each time that parameter is bound again, so every run of it would
//! be compiled anew (40 % of a `GET` in a profile).

mod migrate;
pub mod schema;
mod setup;
mod url;

pub use idempotency_ledger::db::{
    Backend, Conn, Failure, PG_LOCK_WAIT, Pool, PoolOptions, PooledConn, Unavailable, WriteError,
    classify, drop_if_lost, one_line, writer,
};
pub use migrate::{migrations_applied, run_migrations};
pub use setup::SetupError;
pub use url::DatabaseUrl;

pub use crate::dispatch;

/// Opens the pool `url` names: one connection first, so that a bad URL or
/// an unreachable server is reported with the driver's own words (and, for
/// SQLite, what is wrong with the location), never with a password: every
/// driver message is scrubbed of it ([`DatabaseUrl::scrub`]).
pub fn connect(url: &DatabaseUrl, options: &PoolOptions) -> Result<Pool, SetupError> {
    use idempotency_ledger::db::ConnectError;
    Pool::connect(url.backend(), url.as_str(), options).map_err(|e| match e {
        ConnectError::Open(e) => SetupError::connect(url, &e),
        ConnectError::Session(e) => SetupError::Connect {
            target: url.to_string(),
            cause: url.scrub(&one_line(&e.to_string())),
        },
        ConnectError::Pool(cause) => SetupError::Pool(url.scrub(&cause)),
    })
}

/// Runs `$body` once per backend, with `$c` bound to the concrete connection
/// and `$schema` to that backend's table definitions.
///
/// ```ignore
/// dispatch!(conn, c, s => s::orders::table.count().get_result::<i64>(c))
/// ```
#[macro_export]
macro_rules! dispatch {
    ($conn:expr, $c:ident, $schema:ident => $body:expr) => {
        match $conn {
            $crate::db::Conn::Sqlite(inner) => {
                #[allow(unused_imports)]
                use $crate::db::schema::sqlite as $schema;
                let $c: &mut ::diesel::SqliteConnection = &mut **inner;
                $body
            }
            $crate::db::Conn::Postgres(inner) => {
                #[allow(unused_imports)]
                use $crate::db::schema::pg as $schema;
                let $c: &mut ::diesel::PgConnection = &mut **inner;
                $body
            }
        }
    };
}
