//! The schema: migrations embedded in the binary — the server's own, then
//! the ledger crate's (which find the ledger's table the server's made, and
//! add what a later version of the crate brings) — applied at start (and by
//! `orders-api migrate`), and creating the database first when it is
//! missing (a SQLite file; a PostgreSQL database, when the role may). The
//! commands that must not create it ask [`DatabaseUrl::require_existing`]
//! first, and the one that only reads (`keys list`) opens it with
//! [`DatabaseUrl::read_only`].
//!
//! Whether anything is pending is read without writing, so a command on a
//! read-only database (or a hot standby) works as long as the schema is
//! current; only a pending migration needs write access.

use std::path::PathBuf;

use diesel::connection::SimpleConnection;
use diesel::migration::MigrationSource;
use diesel::prelude::*;
use diesel::result::Error as DieselError;
use diesel_migrations::{EmbeddedMigrations, MigrationHarness, embed_migrations};

use idempotency_ledger::db::{SQLITE_BUSY_TIMEOUT, SqliteSession};
use idempotency_ledger::migrate;

use super::{Backend, Conn, DatabaseUrl, SetupError, dispatch, one_line};

const SQLITE_MIGRATIONS: EmbeddedMigrations = embed_migrations!("migrations/sqlite");
const PG_MIGRATIONS: EmbeddedMigrations = embed_migrations!("migrations/postgres");

/// An arbitrary, fixed advisory-lock id that serialises migrations when
/// several processes start against one PostgreSQL database at once.
const PG_MIGRATION_LOCK: i64 = 0x6f72_6465_7273;

/// How long a process waits between two tries of [`PG_MIGRATION_LOCK`].
const PG_MIGRATION_LOCK_POLL: std::time::Duration = std::time::Duration::from_millis(100);

/// Where diesel records the migrations it applied.
const APPLIED_TABLE: &str = "__diesel_schema_migrations";

/// Applies pending migrations with a dedicated connection (not pooled, so no
/// session timeouts apply) and returns how many ran. Nothing is written when
/// none is pending. On PostgreSQL a missing database is created first (when
/// the role may), and an advisory lock keeps several processes that start
/// together from migrating at once.
pub fn run_migrations(url: &DatabaseUrl) -> Result<usize, SetupError> {
    let migrate_error = |e: &dyn std::fmt::Display| SetupError::Migrate {
        target: url.to_string(),
        cause: url.scrub(&one_line(&e.to_string())),
    };
    match url.backend() {
        Backend::Sqlite => {
            let mut conn = SqliteConnection::establish(url.as_str())
                .map_err(|e| SetupError::connect(url, &e))?;
            conn.batch_execute(&format!(
                "PRAGMA busy_timeout = {};",
                SQLITE_BUSY_TIMEOUT.as_millis()
            ))
            .map_err(|e| migrate_error(&e))?;
            let pending = pending(&mut Conn::Sqlite(&mut conn)).map_err(|e| {
                let cause = e.to_string();
                SetupError::Read {
                    target: url.to_string(),
                    // WAL's shared-memory file cannot be created beside the database.
                    cause: match cause.contains("readonly") {
                        true => format!(
                            "{cause}: reading it needs {0}-wal and {0}-shm beside it, or a \
                             writable folder to create them in",
                            url.as_str()
                        ),
                        false => url.scrub(&one_line(&cause)),
                    },
                }
            })?;
            if pending == 0 {
                return Ok(0);
            }
            SqliteSession {
                busy_timeout: SQLITE_BUSY_TIMEOUT,
            }
            .apply(&mut conn)
            .map_err(|e| migrate_error(&e))?;
            // One `BEGIN IMMEDIATE` for both sets: a second process waits,
            // then finds them applied.
            migrate::with_sqlite_lock(&mut conn, |c| {
                let ours = c.run_pending_migrations(SQLITE_MIGRATIONS)?.len();
                Ok(ours + c.run_pending_migrations(migrate::SQLITE_MIGRATIONS)?.len())
            })
            .map_err(|e| migrate_error(&e))
        }
        Backend::Postgres => {
            let mut conn = establish_or_create_pg(url)?;
            let pending =
                pending(&mut Conn::Postgres(&mut conn)).map_err(|e| SetupError::Read {
                    target: url.to_string(),
                    cause: url.scrub(&one_line(&e.to_string())),
                })?;
            if pending == 0 {
                return Ok(0);
            }
            lock_migrations(&mut conn).map_err(|e| migrate_error(&e))?;
            let applied = conn
                .run_pending_migrations(PG_MIGRATIONS)
                .map(|ours| ours.len())
                .and_then(|ours| {
                    let ledger = conn.run_pending_migrations(migrate::POSTGRES_MIGRATIONS)?;
                    Ok(ours + ledger.len())
                })
                .map_err(|e| migrate_error(&e));
            // Closing the session releases the lock even if this fails.
            let _ = conn.batch_execute(&format!("SELECT pg_advisory_unlock({PG_MIGRATION_LOCK})"));
            applied
        }
    }
}

impl DatabaseUrl {
    /// Refuses a database that does not exist, creating nothing: a SQLite
    /// file that is not there, a PostgreSQL database the server does not
    /// have. `command` names the command that refuses it.
    pub fn require_existing(&self, command: &'static str) -> Result<(), SetupError> {
        let missing = || SetupError::Missing {
            target: self.to_string(),
            command,
        };
        match self.backend() {
            Backend::Sqlite => match sqlite_file(self.as_str()).exists() {
                true => Ok(()),
                false => Err(missing()),
            },
            Backend::Postgres => establish_existing_pg(self, command).map(drop),
        }
    }

    /// Runs `read` on one read-only connection to this database, which must
    /// exist and have every migration applied: nothing is created, migrated
    /// or written. SQLite opens the file with `mode=ro` (a WAL database in
    /// a folder nobody may write in, where its `-wal` and `-shm` files
    /// cannot be created, is read as `immutable`: nothing can be writing
    /// there); PostgreSQL reads in a `READ ONLY` transaction.
    pub fn read_only<T>(
        &self,
        command: &'static str,
        read: impl FnOnce(&mut Conn<'_>) -> QueryResult<T>,
    ) -> Result<T, SetupError> {
        let read_error = |e: DieselError| SetupError::Read {
            target: self.to_string(),
            cause: self.scrub(&one_line(&e.to_string())),
        };
        let not_migrated = |pending| SetupError::NotMigrated {
            target: self.to_string(),
            pending,
            command,
        };
        match self.backend() {
            Backend::Sqlite => {
                self.require_existing(command)?;
                let mut conn = self.sqlite_read_only(false)?;
                let pending = match pending(&mut Conn::Sqlite(&mut conn)) {
                    Err(_) if !self.as_str().starts_with("file:") => {
                        conn = self.sqlite_read_only(true)?;
                        pending(&mut Conn::Sqlite(&mut conn))
                    }
                    other => other,
                }
                .map_err(read_error)?;
                if pending > 0 {
                    return Err(not_migrated(pending));
                }
                read(&mut Conn::Sqlite(&mut conn)).map_err(read_error)
            }
            Backend::Postgres => {
                let mut conn = establish_existing_pg(self, command)?;
                conn.build_transaction()
                    .read_only()
                    .run(|c| {
                        let pending = pending(&mut Conn::Postgres(c))?;
                        if pending > 0 {
                            return Ok(Err(pending));
                        }
                        read(&mut Conn::Postgres(c)).map(Ok)
                    })
                    .map_err(read_error)?
                    .map_err(not_migrated)
            }
        }
    }

    /// A read-only connection to this SQLite database: `mode=ro`, or
    /// `immutable=1` when `immutable`. A URI filename the user gave keeps
    /// its own parameters (and gets `mode=ro` unless it names a mode).
    fn sqlite_read_only(&self, immutable: bool) -> Result<SqliteConnection, SetupError> {
        let target = self.as_str();
        let uri = if target.starts_with("file:") {
            match (target.contains("mode="), target.contains('?')) {
                (true, _) => target.to_owned(),
                (false, true) => format!("{target}&mode=ro"),
                (false, false) => format!("{target}?mode=ro"),
            }
        } else if immutable {
            format!("file:{}?immutable=1", uri_path(target))
        } else {
            format!("file:{}?mode=ro", uri_path(target))
        };
        let mut conn =
            SqliteConnection::establish(&uri).map_err(|e| SetupError::connect(self, &e))?;
        conn.batch_execute(&format!(
            "PRAGMA busy_timeout = {};",
            SQLITE_BUSY_TIMEOUT.as_millis()
        ))
        .map_err(|e| SetupError::Read {
            target: self.to_string(),
            cause: one_line(&e.to_string()),
        })?;
        Ok(conn)
    }
}

/// The file a SQLite target names: a path as it is, or the path of a URI
/// filename (`file:PATH?…`, `file:///PATH`, `file://localhost/PATH`),
/// percent-decoded.
fn sqlite_file(target: &str) -> PathBuf {
    let Some(uri) = target.strip_prefix("file:") else {
        return PathBuf::from(target);
    };
    let path = uri.split(['?', '#']).next().unwrap_or_default();
    let path = match path.strip_prefix("//") {
        Some(authority_and_path) => authority_and_path
            .find('/')
            .map_or("", |slash| &authority_and_path[slash..]),
        None => path,
    };
    PathBuf::from(
        percent_encoding::percent_decode_str(path)
            .decode_utf8_lossy()
            .into_owned(),
    )
}

/// A file path as the path of an SQLite URI filename: `%`, `?` and `#`
/// (and every byte outside printable ASCII) percent-encoded.
fn uri_path(path: &str) -> String {
    path.bytes()
        .map(|b| match b {
            b'%' | b'?' | b'#' => format!("%{b:02X}"),
            0x21..=0x7e => char::from(b).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Connects to a PostgreSQL database that must exist: one the server does
/// not have is [`SetupError::Missing`], never created.
fn establish_existing_pg(
    url: &DatabaseUrl,
    command: &'static str,
) -> Result<PgConnection, SetupError> {
    PgConnection::establish(url.as_str()).map_err(|e| match url.database() {
        Some(name) if missing_database(url, name) => SetupError::Missing {
            target: url.to_string(),
            command,
        },
        _ => SetupError::connect(url, &e),
    })
}

diesel::define_sql_function! {
    /// PostgreSQL: takes a session-scoped advisory lock if it is free.
    fn pg_try_advisory_lock(key: diesel::sql_types::BigInt) -> diesel::sql_types::Bool;
}

/// Takes [`PG_MIGRATION_LOCK`], trying again after a pause while another
/// process holds it — never waiting inside a statement. A session blocked in
/// `pg_advisory_lock` keeps its statement's snapshot, and a `CREATE INDEX
/// CONCURRENTLY` in the holder's migrations waits for every older snapshot
/// in the database: the two would wait for each other until PostgreSQL
/// called it a deadlock and failed one of them (the index build leaving an
/// invalid index). Between two tries this session is idle, outside any
/// transaction, so the holder waits for nothing of it.
fn lock_migrations(conn: &mut PgConnection) -> Result<(), DieselError> {
    let mut told = false;
    while !diesel::select(pg_try_advisory_lock(PG_MIGRATION_LOCK)).get_result::<bool>(conn)? {
        if !told {
            tracing::info!("another process is migrating the database; waiting for it");
            told = true;
        }
        std::thread::sleep(PG_MIGRATION_LOCK_POLL);
    }
    Ok(())
}

/// Whether every migration this binary knows of has been applied.
pub fn migrations_applied(conn: &mut Conn<'_>) -> Result<bool, DieselError> {
    pending(conn).map(|n| n == 0)
}

diesel::table! {
    /// SQLite's catalog, as far as `pending` reads it.
    sqlite_master (name) {
        #[sql_name = "type"]
        type_ -> Text,
        name -> Text,
    }
}

diesel::define_sql_function! {
    /// PostgreSQL: the relation a name resolves to, or NULL.
    fn to_regclass(name: diesel::sql_types::Text) -> diesel::sql_types::Nullable<diesel::sql_types::Text>;
}

#[derive(QueryableByName)]
struct Applied {
    #[diesel(sql_type = diesel::sql_types::Text)]
    version: String,
}

/// How many of this binary's migrations the database has not applied, read
/// without writing (diesel's own check creates its table when missing). A
/// lost connection keeps the driver's error, so that it classifies as
/// unavailable (503), not as a defect (500).
fn pending(conn: &mut Conn<'_>) -> Result<usize, DieselError> {
    // Whether the table exists, asked of the catalog: an error's text would
    // be in the server's language.
    let exists = match conn {
        Conn::Sqlite(c) => diesel::select(diesel::dsl::exists(
            sqlite_master::table
                .filter(sqlite_master::type_.eq("table"))
                .filter(sqlite_master::name.eq(APPLIED_TABLE)),
        ))
        .get_result::<bool>(*c)?,
        Conn::Postgres(c) => {
            diesel::select(to_regclass(APPLIED_TABLE).is_not_null()).get_result::<bool>(*c)?
        }
    };
    let applied: Vec<String> = if exists {
        let query = format!("SELECT version FROM {APPLIED_TABLE}");
        dispatch!(conn, c, _s => diesel::sql_query(&query).load::<Applied>(c))?
            .into_iter()
            .map(|r| r.version)
            .collect()
    } else {
        // No table yet: nothing was ever applied.
        Vec::new()
    };
    let known = match conn {
        Conn::Sqlite(_) => {
            versions::<diesel::sqlite::Sqlite>(&SQLITE_MIGRATIONS).and_then(|mut v| {
                v.extend(versions::<diesel::sqlite::Sqlite>(
                    &migrate::SQLITE_MIGRATIONS,
                )?);
                Ok(v)
            })
        }
        Conn::Postgres(_) => versions::<diesel::pg::Pg>(&PG_MIGRATIONS).and_then(|mut v| {
            v.extend(versions::<diesel::pg::Pg>(&migrate::POSTGRES_MIGRATIONS)?);
            Ok(v)
        }),
    }
    .map_err(|e| DieselError::QueryBuilderError(e.to_string().into()))?;
    Ok(known.iter().filter(|v| !applied.contains(v)).count())
}

fn versions<DB>(
    source: &EmbeddedMigrations,
) -> Result<Vec<String>, Box<dyn std::error::Error + Send + Sync>>
where
    DB: diesel::backend::Backend,
    EmbeddedMigrations: MigrationSource<DB>,
{
    Ok(MigrationSource::<DB>::migrations(source)?
        .iter()
        .map(|m| m.name().version().to_string())
        .collect())
}

/// Connects; when the database does not exist, creates it from the server's
/// maintenance database (as `diesel setup` does) and connects again.
/// Whether it exists is asked of the server's catalog, not read from the
/// connection error, whose text is in the server's language.
fn establish_or_create_pg(url: &DatabaseUrl) -> Result<PgConnection, SetupError> {
    let first = match PgConnection::establish(url.as_str()) {
        Ok(conn) => return Ok(conn),
        Err(e) => e,
    };
    let Some(name) = url.database().filter(|name| missing_database(url, name)) else {
        return Err(SetupError::connect(url, &first));
    };
    create_pg_database(url, name)?;
    PgConnection::establish(url.as_str()).map_err(|e| SetupError::connect(url, &e))
}

diesel::table! {
    /// PostgreSQL's catalog of databases, as far as `missing_database` reads it.
    pg_database (datname) {
        datname -> Text,
    }
}

/// Whether the server that `url` names is reachable through a maintenance
/// database and has no database `name`.
fn missing_database(url: &DatabaseUrl, name: &str) -> bool {
    ["postgres", "template1"].iter().any(|maintenance| {
        let Some(admin_url) = url.with_database(maintenance) else {
            return false;
        };
        let Ok(mut admin) = PgConnection::establish(admin_url.as_str()) else {
            return false;
        };
        diesel::select(diesel::dsl::not(diesel::dsl::exists(
            pg_database::table.filter(pg_database::datname.eq(name)),
        )))
        .get_result::<bool>(&mut admin)
        .unwrap_or(false)
    })
}

fn create_pg_database(url: &DatabaseUrl, name: &str) -> Result<(), SetupError> {
    let refused = |cause: String| SetupError::CreateDatabase {
        name: name.to_owned(),
        target: url.to_string(),
        cause,
    };
    let mut last = String::from("no maintenance database to connect to");
    for maintenance in ["postgres", "template1"] {
        let Some(admin_url) = url.with_database(maintenance) else {
            break;
        };
        let mut admin = match PgConnection::establish(admin_url.as_str()) {
            Ok(admin) => admin,
            Err(e) => {
                last = format!(
                    "cannot connect to {admin_url} to create it: {}",
                    url.scrub(&one_line(&e.to_string()))
                );
                continue;
            }
        };
        let quoted = format!("\"{}\"", name.replace('"', "\"\""));
        return match admin.batch_execute(&format!("CREATE DATABASE {quoted}")) {
            Ok(()) => {
                tracing::info!(database = name, "created the database");
                Ok(())
            }
            // Another process created it meanwhile.
            Err(e) if e.to_string().contains("already exists") => Ok(()),
            Err(e) if e.to_string().contains("permission denied") => Err(refused(format!(
                "the role may not create databases ({}): create it (`createdb {name}`) or \
                 grant the role CREATEDB",
                url.scrub(&one_line(&e.to_string()))
            ))),
            Err(e) => Err(refused(url.scrub(&one_line(&e.to_string())))),
        };
    }
    Err(refused(last))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_database_to_create_is_the_one_the_url_names() {
        let named = |raw: &str| {
            DatabaseUrl::parse(raw)
                .unwrap()
                .database()
                .map(str::to_owned)
        };
        assert_eq!(
            named("postgres://u@h:5432/orders").as_deref(),
            Some("orders")
        );
        assert_eq!(
            named("postgres://u:p@h/orders?sslmode=require").as_deref(),
            Some("orders")
        );
        assert_eq!(
            named("postgres://u@h1:1,h2:2/orders").as_deref(),
            Some("orders")
        );
        assert_eq!(named("postgres://u@h"), None);
        assert_eq!(named("postgres://u@h/"), None);
        assert_eq!(named("sqlite://orders.db"), None);
    }
}
