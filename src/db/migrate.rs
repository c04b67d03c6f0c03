//! The schema: migrations embedded in the binary, applied at start (and by
//! `orders-api migrate`), and creating the PostgreSQL database first when it
//! is missing and the role may.
//!
//! Whether anything is pending is read without writing, so a command on a
//! read-only database (or a hot standby) works as long as the schema is
//! current; only a pending migration needs write access.

use diesel::connection::SimpleConnection;
use diesel::migration::MigrationSource;
use diesel::prelude::*;
use diesel::result::Error as DieselError;
use diesel_migrations::{EmbeddedMigrations, MigrationHarness, embed_migrations};

use super::{
    Backend, Conn, DatabaseUrl, PG_MIGRATION_LOCK, SQLITE_BUSY_TIMEOUT, SetupError, SqliteSession,
    dispatch, one_line,
};

const SQLITE_MIGRATIONS: EmbeddedMigrations = embed_migrations!("migrations/sqlite");
const PG_MIGRATIONS: EmbeddedMigrations = embed_migrations!("migrations/postgres");

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
        cause: one_line(&e.to_string()),
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
                        false => one_line(&cause),
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
            conn.run_pending_migrations(SQLITE_MIGRATIONS)
                .map(|v| v.len())
                .map_err(|e| migrate_error(&e))
        }
        Backend::Postgres => {
            let mut conn = establish_or_create_pg(url)?;
            let pending =
                pending(&mut Conn::Postgres(&mut conn)).map_err(|e| SetupError::Read {
                    target: url.to_string(),
                    cause: one_line(&e.to_string()),
                })?;
            if pending == 0 {
                return Ok(0);
            }
            conn.batch_execute(&format!("SELECT pg_advisory_lock({PG_MIGRATION_LOCK})"))
                .map_err(|e| migrate_error(&e))?;
            let applied = conn
                .run_pending_migrations(PG_MIGRATIONS)
                .map(|v| v.len())
                .map_err(|e| migrate_error(&e));
            // Closing the session releases the lock even if this fails.
            let _ = conn.batch_execute(&format!("SELECT pg_advisory_unlock({PG_MIGRATION_LOCK})"));
            applied
        }
    }
}

/// Whether every migration this binary knows of has been applied.
pub fn migrations_applied(conn: &mut Conn<'_>) -> Result<bool, DieselError> {
    pending(conn).map(|n| n == 0)
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
    let query = format!("SELECT version FROM {APPLIED_TABLE}");
    let applied = match dispatch!(conn, c, _s => diesel::sql_query(&query).load::<Applied>(c)) {
        Ok(rows) => rows.into_iter().map(|r| r.version).collect(),
        // No table yet: nothing was ever applied.
        Err(DieselError::DatabaseError(_, info))
            if info.message().contains("no such table")
                || (info.message().contains(APPLIED_TABLE)
                    && info.message().contains("does not exist")) =>
        {
            Vec::new()
        }
        Err(e) => return Err(e),
    };
    let known = match conn {
        Conn::Sqlite(_) => versions::<diesel::sqlite::Sqlite>(&SQLITE_MIGRATIONS),
        Conn::Postgres(_) => versions::<diesel::pg::Pg>(&PG_MIGRATIONS),
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
fn establish_or_create_pg(url: &DatabaseUrl) -> Result<PgConnection, SetupError> {
    let first = match PgConnection::establish(url.as_str()) {
        Ok(conn) => return Ok(conn),
        Err(e) => e,
    };
    let message = first.to_string();
    let Some(name) = missing_database(&message) else {
        return Err(SetupError::connect(url, &first));
    };
    create_pg_database(url, name)?;
    PgConnection::establish(url.as_str()).map_err(|e| SetupError::connect(url, &e))
}

/// The name in libpq's `FATAL:  database "orders" does not exist`.
fn missing_database(message: &str) -> Option<&str> {
    let end = message.rfind("\" does not exist")?;
    let start = message[..end].rfind("database \"")? + "database \"".len();
    Some(&message[start..end]).filter(|name| !name.is_empty())
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
                    one_line(&e.to_string())
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
                one_line(&e.to_string())
            ))),
            Err(e) => Err(refused(one_line(&e.to_string()))),
        };
    }
    Err(refused(last))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_missing_database_is_read_from_libpqs_message() {
        assert_eq!(
            missing_database(
                "connection to server at \"127.0.0.1\", port 5432 failed: FATAL:  \
                 database \"orders\" does not exist\n"
            ),
            Some("orders")
        );
        assert_eq!(
            missing_database("FATAL:  role \"bob\" does not exist"),
            None
        );
        assert_eq!(missing_database("Connection refused"), None);
    }
}
