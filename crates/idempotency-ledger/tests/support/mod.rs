//! What the crate's newer integration tests share: an empty database of
//! either backend, gone when the test ends, and the macro that runs a test
//! on both (PostgreSQL at `TEST_DATABASE_URL`: reported ignored without it,
//! failing without it in CI — see `build.rs`).
#![allow(dead_code)]

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use idempotency_ledger::db::Backend;

/// An empty database: a SQLite file, or a PostgreSQL database of its own.
pub struct Scratch {
    pub backend: Backend,
    /// What the driver takes: a file path, or a URL.
    pub url: String,
    server: Option<(String, String)>,
}

impl Scratch {
    pub fn fresh(backend: Backend) -> Self {
        let unique = uuid::Uuid::new_v4().simple().to_string();
        match backend {
            Backend::Sqlite => {
                let path = std::env::temp_dir().join(format!("ledger-scratch-{unique}.db"));
                Self {
                    backend,
                    url: path.to_str().expect("a UTF-8 path").to_owned(),
                    server: None,
                }
            }
            Backend::Postgres => {
                let server = std::env::var("TEST_DATABASE_URL")
                    .expect("TEST_DATABASE_URL names a PostgreSQL server for these tests");
                let name = format!("ledger_scratch_{unique}");
                PgConnection::establish(&server)
                    .expect("the test server")
                    .batch_execute(&format!("CREATE DATABASE {name}"))
                    .expect("create the test database");
                Self {
                    backend,
                    url: with_database(&server, &name),
                    server: Some((server, name)),
                }
            }
        }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        match &self.server {
            None => {
                for suffix in ["", "-wal", "-shm"] {
                    let _ = std::fs::remove_file(format!("{}{suffix}", self.url));
                }
            }
            Some((server, name)) => {
                if let Ok(mut admin) = PgConnection::establish(server) {
                    let _ = admin
                        .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"));
                }
            }
        }
    }
}

/// `server`'s URL naming the database `name` instead.
pub fn with_database(server: &str, name: &str) -> String {
    let (base, query) = match server.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (server, None),
    };
    let after_scheme = base.find("://").map_or(0, |i| i + 3);
    let server_part = match base[after_scheme..].find('/') {
        Some(slash) => &base[..after_scheme + slash],
        None => base,
    };
    match query {
        Some(query) => format!("{server_part}/{name}?{query}"),
        None => format!("{server_part}/{name}"),
    }
}

/// Each test twice: `sqlite::name` and `postgres::name`.
#[macro_export]
macro_rules! both_backends {
    ($(fn $name:ident($backend:ident) $body:block)*) => {
        mod sqlite {
            use super::*;
            $(#[test] fn $name() { let $backend = Backend::Sqlite; $body })*
        }
        mod postgres {
            use super::*;
            $(
                #[test]
                #[cfg_attr(postgres_tests_ignored, ignore = "set TEST_DATABASE_URL to run the PostgreSQL tests")]
                fn $name() { let $backend = Backend::Postgres; $body }
            )*
        }
    };
}
