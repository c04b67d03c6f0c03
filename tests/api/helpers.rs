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
/// `CI` is set: CI never skips a backend. A copy compiled to run never
/// passes without running (see [`require_postgres`]).
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
            $crate::postgres_only! {
                $( $(#[$meta])* fn $name() {
                    let $backend = orders_api::db::Backend::Postgres;
                    $body
                } )*
            }
        }
    };
}

/// Declares PostgreSQL-only tests: each is reported as ignored when
/// `TEST_DATABASE_URL` was unset at build time (and not in CI), and
/// otherwise starts with [`require_postgres`].
#[macro_export]
macro_rules! postgres_only {
    ($( $(#[$meta:meta])* fn $name:ident() $body:block )*) => {
        $( $(#[$meta])* #[test]
        #[cfg_attr(postgres_tests_ignored, ignore = "set TEST_DATABASE_URL to run the PostgreSQL tests")]
        fn $name() {
            $crate::helpers::require_postgres();
            $body
        } )*
    };
}

/// The first line of every PostgreSQL test compiled to run: it fails, with
/// what to do, when `TEST_DATABASE_URL` is not set now.
///
/// Whether a PostgreSQL test runs is decided when the suite is built
/// (`build.rs`): `cargo test` rebuilds when the variable changes, so it
/// reports them ignored without the variable. A test binary built with it
/// and then run without it (by hand, or copied elsewhere) can no longer mark
/// a test ignored — libtest decides that before the test starts — and
/// returning early would count it as passed: so it fails.
pub fn require_postgres() {
    require_cluster(TEST_DATABASE_URL);
}

/// The admin URL of the PostgreSQL cluster that the environment variable
/// `var` names; a failure, never a silent pass, when it is unset.
pub fn require_cluster(var: &str) -> String {
    std::env::var(var)
        .ok()
        .filter(|url| !url.is_empty())
        .unwrap_or_else(|| {
            panic!(
                "{var} is not set, but this test binary was built to run its PostgreSQL tests \
             (built with {var} or CI set): set {var} to a PostgreSQL server whose user may \
             create databases, or rebuild without it to have these tests reported ignored"
            )
        })
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

    /// Whether the database exists: the SQLite file (or its `-wal` or
    /// `-shm`), or a PostgreSQL database of this name on the cluster.
    pub fn exists(&self) -> bool {
        match &self.cleanup {
            Cleanup::Files(path) => ["", "-wal", "-shm"].iter().any(|suffix| {
                std::path::Path::new(&format!("{}{suffix}", path.display())).exists()
            }),
            Cleanup::Database { admin_url, name } => {
                #[derive(diesel::QueryableByName)]
                struct Count {
                    #[diesel(sql_type = diesel::sql_types::BigInt)]
                    n: i64,
                }
                let mut admin = PgConnection::establish(admin_url).expect("connect to the cluster");
                diesel::sql_query("SELECT count(*) AS n FROM pg_database WHERE datname = $1")
                    .bind::<diesel::sql_types::Text, _>(name)
                    .get_result::<Count>(&mut admin)
                    .expect("read pg_database")
                    .n
                    > 0
            }
            Cleanup::Nothing => panic!("ask the handle that removes the database"),
        }
    }

    /// An empty database: an empty SQLite file, or a PostgreSQL database
    /// without tables (what [`TestDb::fresh`] makes there).
    pub fn empty(backend: Backend) -> Self {
        let db = Self::fresh(backend);
        if let Cleanup::Files(path) = &db.cleanup {
            std::fs::File::create(path).expect("create an empty SQLite file");
        }
        db
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
    require_cluster(TEST_DATABASE_URL)
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
    client: crate::net::Client,
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
        let address = format!("http://127.0.0.1:{port}");
        let mut app = Self {
            client: crate::net::Client::anonymous(&address, Duration::from_secs(60)),
            address,
            token: String::new(),
            pool,
            settings,
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

    /// Any request, with the caller's headers only. Panics when no whole
    /// answer arrived ([`crate::net::Client`] reports that instead).
    pub fn request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&str>,
    ) -> TestResponse {
        self.client
            .request(method, path, headers, body)
            .expect("the server answered")
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
        self.client
            .call_as(token, method, path, key, body)
            .expect("the server answered")
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
