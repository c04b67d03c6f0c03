//! The test harness: a real server on port 0 against a fresh database per
//! test, on SQLite always and on PostgreSQL when `TEST_DATABASE_URL` names a
//! server whose user may create databases.

#![allow(dead_code)] // each test module uses a different part

use std::path::PathBuf;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use actix_web::dev::ServerHandle;
use diesel::{Connection, PgConnection, RunQueryDsl};
use orders_api::config::Settings;
use orders_api::db::{self, Backend, DatabaseUrl, Pool};
use orders_api::startup::Application;
use serde_json::Value;

pub const TEST_DATABASE_URL: &str = "TEST_DATABASE_URL";

/// Declares each test once per backend: `sqlite::NAME` and `postgres::NAME`.
/// The PostgreSQL copy is reported as ignored when `TEST_DATABASE_URL` was
/// unset when the tests were built (`build.rs` sets `postgres_tests_ignored`;
/// `cargo test` rebuilds when the variable changes), and fails instead when
/// `CI` is set: CI never skips a backend. A PostgreSQL-only test carries the
/// same `cfg_attr` and starts with [`postgres_available`].
#[macro_export]
macro_rules! both_backends {
    ($( $(#[$meta:meta])* fn $name:ident($backend:ident) $body:block )*) => {
        mod sqlite {
            #[allow(unused_imports)]
            use super::*;
            $( $(#[$meta])* #[test] fn $name() {
                let $backend = orders_api::db::Backend::Sqlite;
                $body
            } )*
        }
        mod postgres {
            #[allow(unused_imports)]
            use super::*;
            $( $(#[$meta])* #[test]
            #[cfg_attr(postgres_tests_ignored, ignore = "set TEST_DATABASE_URL to run the PostgreSQL tests")]
            fn $name() {
                if !$crate::helpers::postgres_available() { return; }
                let $backend = orders_api::db::Backend::Postgres;
                $body
            } )*
        }
    };
}

/// Whether the PostgreSQL copies can run; panics in CI when they cannot.
/// (Built with `TEST_DATABASE_URL` set but run without it, they pass without
/// running, with a note.)
pub fn postgres_available() -> bool {
    cluster_url(TEST_DATABASE_URL).is_some()
}

/// The admin URL of the PostgreSQL cluster that the environment variable
/// `var` names; `None` (with a note) when it is unset, a panic in CI, where
/// no test may be skipped.
pub fn cluster_url(var: &str) -> Option<String> {
    if let Ok(url) = std::env::var(var) {
        return Some(url);
    }
    if std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false") {
        panic!("CI is set but {var} is not: this PostgreSQL test must run in CI");
    }
    eprintln!("note: {var} is not set; skipping this PostgreSQL test");
    None
}

/// A database that exists only for one test and is removed afterwards.
pub struct TestDb {
    pub url: DatabaseUrl,
    cleanup: Cleanup,
}

enum Cleanup {
    Files(PathBuf),
    Database {
        admin_url: String,
        name: String,
    },
    /// Another handle removes it.
    Nothing,
}

impl TestDb {
    /// A database of this test's own, empty.
    pub fn fresh(backend: Backend) -> Self {
        let db = Self::missing(backend);
        if let Cleanup::Database { admin_url, name } = &db.cleanup {
            let mut admin =
                PgConnection::establish(admin_url).expect("connect to TEST_DATABASE_URL");
            diesel::sql_query(format!("CREATE DATABASE {name}"))
                .execute(&mut admin)
                .expect("create test database");
        }
        db
    }

    /// A database name no database has yet (a SQLite file that does not
    /// exist); whatever the test creates under it is removed afterwards.
    pub fn missing(backend: Backend) -> Self {
        let name = format!("orders_test_{}", uuid::Uuid::new_v4().simple());
        match backend {
            Backend::Sqlite => {
                let path = std::env::temp_dir().join(format!("{name}.db"));
                let url = DatabaseUrl::parse(&format!("sqlite://{}", path.display()))
                    .expect("sqlite url");
                Self {
                    url,
                    cleanup: Cleanup::Files(path),
                }
            }
            Backend::Postgres => {
                // Parsed like the service parses it (GSSAPI off unless asked for).
                let admin = DatabaseUrl::parse(&test_database_url())
                    .expect("TEST_DATABASE_URL is a postgres:// URL");
                let url = admin.with_database(&name).expect("postgres url");
                Self {
                    url,
                    cleanup: Cleanup::Database {
                        admin_url: admin.as_str().to_owned(),
                        name,
                    },
                }
            }
        }
    }

    /// A fresh database on the PostgreSQL cluster whose admin URL is `admin_url`.
    pub fn fresh_postgres_on(admin_url: &str) -> Self {
        let name = format!("orders_test_{}", uuid::Uuid::new_v4().simple());
        // Parsed like the service parses it (GSSAPI off unless asked for).
        let admin_url = DatabaseUrl::parse(admin_url)
            .expect("the cluster's URL is a postgres:// URL")
            .as_str()
            .to_owned();
        let mut admin = PgConnection::establish(&admin_url).expect("connect to the cluster");
        diesel::sql_query(format!("CREATE DATABASE {name}"))
            .execute(&mut admin)
            .expect("create test database");
        let url = DatabaseUrl::parse(&with_database(&admin_url, &name)).expect("postgres url");
        Self {
            url,
            cleanup: Cleanup::Database { admin_url, name },
        }
    }

    /// PostgreSQL: runs `sql` as the cluster's admin, outside this database
    /// (`{db}` in `sql` is replaced by this database's name).
    pub fn as_admin(&self, sql: &str) {
        let Cleanup::Database { admin_url, name } = &self.cleanup else {
            panic!("as_admin is for PostgreSQL test databases");
        };
        let mut admin = PgConnection::establish(admin_url).expect("connect to the cluster");
        diesel::sql_query(sql.replace("{db}", name))
            .execute(&mut admin)
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    pub fn backend(&self) -> Backend {
        self.url.backend()
    }

    /// The same database, for a second server (a restart); this handle
    /// removes nothing, the first one does.
    pub fn again(&self) -> Self {
        Self {
            url: self.url.clone(),
            cleanup: Cleanup::Nothing,
        }
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        match &self.cleanup {
            Cleanup::Files(path) => {
                for suffix in ["", "-wal", "-shm"] {
                    let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
                }
            }
            Cleanup::Nothing => {}
            Cleanup::Database { admin_url, name } => {
                if let Ok(mut admin) = PgConnection::establish(admin_url) {
                    let _ =
                        diesel::sql_query(format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                            .execute(&mut admin);
                }
            }
        }
    }
}

/// `TEST_DATABASE_URL`: a PostgreSQL server whose user may create databases.
pub fn test_database_url() -> String {
    std::env::var(TEST_DATABASE_URL).expect("TEST_DATABASE_URL")
}

/// `url` with its database name replaced by `name`.
pub fn with_database(url: &str, name: &str) -> String {
    DatabaseUrl::parse(url)
        .ok()
        .and_then(|url| url.with_database(name))
        .expect("a postgres:// URL")
        .as_str()
        .to_owned()
}

/// A running server and what a test needs to talk to it.
pub struct TestApp {
    pub address: String,
    /// A token of user `alice`.
    pub token: String,
    /// The server's own pool, for assertions on the stored state.
    pub pool: Pool,
    pub settings: Settings,
    agent: ureq::Agent,
    handle: Option<ServerHandle>,
    thread: Option<JoinHandle<()>>,
    /// How the server stopped (its error's words), once it has.
    stopped: std::sync::Mutex<mpsc::Receiver<Result<(), String>>>,
    // Dropped last: the database outlives the server.
    pub db: TestDb,
}

impl TestApp {
    pub fn spawn(backend: Backend) -> Self {
        Self::spawn_with(backend, |_| {})
    }

    /// Starts a server whose settings `tweak` may change first.
    pub fn spawn_with(backend: Backend, tweak: impl FnOnce(&mut Settings)) -> Self {
        Self::spawn_on(TestDb::fresh(backend), tweak)
    }

    /// Starts a server on a database the test prepared.
    pub fn spawn_on(db: TestDb, tweak: impl FnOnce(&mut Settings)) -> Self {
        let mut settings = Settings::for_database(db.url.clone());
        settings.workers = Some(2);
        settings.pool_size = 8;
        tweak(&mut settings);
        db::run_migrations(&settings.database_url).expect("migrations");
        let pool = orders_api::db::connect(&settings.database_url, &settings.pool_options())
            .expect("pool");
        let (tx, rx) = mpsc::channel();
        let (stopped_tx, stopped) = mpsc::channel();
        let (server_settings, server_pool) = (settings.clone(), pool.clone());
        let thread = std::thread::spawn(move || {
            let system = actix_web::rt::System::new();
            let result = system.block_on(async move {
                let app = Application::build(&server_settings, server_pool).expect("bind");
                tx.send((app.port(), app.handle())).expect("report port");
                app.run_until_stopped().await
            });
            if let Err(e) = &result {
                eprintln!("test server stopped with {e}");
            }
            let _ = stopped_tx.send(result.map_err(|e| e.to_string()));
        });
        let (port, handle) = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("server started");
        let mut app = Self {
            address: format!("http://127.0.0.1:{port}"),
            token: String::new(),
            pool,
            settings,
            agent: agent(),
            handle: Some(handle),
            thread: Some(thread),
            stopped: std::sync::Mutex::new(stopped),
            db,
        };
        app.token = app.create_token("alice");
        app
    }

    /// A new API key for `user_id`.
    pub fn create_token(&self, user_id: &str) -> String {
        let mut pooled = self.pool.get().expect("connection");
        orders_api::auth::create(&mut pooled.conn(), user_id).expect("create key")
    }

    /// Any request, with the caller's headers only.
    pub fn request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&str>,
    ) -> TestResponse {
        send(
            &self.agent,
            method,
            &format!("{}{path}", self.address),
            headers,
            body,
        )
    }

    /// A request as a well-behaved client sends it: alice's token, and JSON
    /// when there is a body; `key` is the `Idempotency-Key`, if any.
    pub fn call(
        &self,
        method: &str,
        path: &str,
        key: Option<&str>,
        body: Option<&str>,
    ) -> TestResponse {
        self.call_as(&self.token, method, path, key, body)
    }

    pub fn call_as(
        &self,
        token: &str,
        method: &str,
        path: &str,
        key: Option<&str>,
        body: Option<&str>,
    ) -> TestResponse {
        let auth = format!("Bearer {token}");
        let mut headers = vec![("Authorization", auth.as_str())];
        if let Some(key) = key {
            headers.push(("Idempotency-Key", key));
        }
        if body.is_some() {
            headers.push(("Content-Type", "application/json"));
        }
        self.request(method, path, &headers, body)
    }

    pub fn post_order(&self, key: Option<&str>, body: &str) -> TestResponse {
        self.call("POST", "/v1/orders", key, Some(body))
    }

    /// How the server stopped by itself (`Err` with its error's words);
    /// panics when it is still serving after `patience`.
    pub fn wait_until_stopped(&self, patience: Duration) -> Result<(), String> {
        self.stopped
            .lock()
            .expect("the stop report")
            .recv_timeout(patience)
            .expect("the server stopped by itself")
    }

    /// Orders stored, for every user.
    pub fn order_count(&self) -> i64 {
        crate::process::order_count(&self.pool)
    }

    /// Idempotency-ledger rows stored, for every user.
    pub fn ledger_count(&self) -> i64 {
        crate::process::ledger_count(&self.pool)
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        if let Some(handle) = self.handle.take() {
            // `stop` sends its command at once; the returned future only waits.
            drop(handle.stop(false));
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// An HTTP client that hands every status back instead of failing on 4xx/5xx.
pub fn agent() -> ureq::Agent {
    crate::process::agent(Duration::from_secs(60))
}

/// One request with `agent`; the whole response read. Panics when no whole
/// answer arrived ([`crate::process::try_send`] reports that instead).
pub fn send(
    agent: &ureq::Agent,
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> TestResponse {
    crate::process::try_send(agent, method, url, headers, body).expect("the server answered")
}

/// A response, read whole: the runner's [`orders_atk::wire::Response`]
/// (status, headers, body), with the suite's asserting readers.
#[derive(Debug, Clone)]
pub struct TestResponse(pub orders_atk::wire::Response);

impl std::ops::Deref for TestResponse {
    type Target = orders_atk::wire::Response;

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl TestResponse {
    /// The body as JSON (panics when it is not).
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }

    /// The problem's `error` code (panics when the body is not a problem).
    pub fn error_code(&self) -> String {
        self.json()["error"]
            .as_str()
            .unwrap_or_else(|| panic!("no error code in {}", self.body))
            .to_owned()
    }
}

/// A valid order body.
pub fn order_body(item: &str, quantity: i64, price: &str) -> String {
    format!(r#"{{"item":"{item}","quantity":{quantity},"price":{price}}}"#)
}
