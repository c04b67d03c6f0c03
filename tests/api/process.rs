//! The real binary as a child process: `orders-api serve` on a free
//! 127.0.0.1 port against a given database, killed with SIGKILL, started
//! again on the same database. Also direct access to the stored orders.

#![allow(dead_code)] // each test module uses a different part

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use orders_api::db::{self, Backend, DatabaseUrl, Pool, PoolOptions};

const BINARY: &str = env!("CARGO_BIN_EXE_orders-api");
/// How long a start (migrations included) may take before the test fails.
const START_DEADLINE: Duration = Duration::from_secs(60);
/// How many times a start is tried on another port when the port was taken.
const START_ATTEMPTS: usize = 5;

/// A running `orders-api serve` process. Killed when dropped.
pub struct ServerProcess {
    database_url: String,
    args: Vec<String>,
    port: u16,
    child: Option<Child>,
    log: PathBuf,
    /// Extra environment variables (e.g. `LOG_FORMAT`, `RUST_LOG`).
    env: Vec<(String, String)>,
}

impl ServerProcess {
    /// Starts the binary against `url` with the extra flags `args`, and waits
    /// until `/healthz` answers.
    pub fn start(url: &DatabaseUrl, args: &[&str]) -> Self {
        Self::start_with_env(url, args, &[])
    }

    /// [`Self::start`] with extra environment variables, which win over
    /// the default `RUST_LOG=warn`.
    pub fn start_with_env(url: &DatabaseUrl, args: &[&str], env: &[(&str, &str)]) -> Self {
        let log =
            std::env::temp_dir().join(format!("orders-api-{}.log", uuid::Uuid::new_v4().simple()));
        let mut server = Self {
            database_url: url_argument(url),
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            env: env
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            port: free_port(),
            child: None,
            log,
        };
        server.spawn();
        server
    }

    pub fn address(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// `kill -9`: the process gets no chance to finish anything.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the process again on the same database (and port, when it is
    /// still free) with the extra flags `args` instead of the first ones.
    pub fn restart(&mut self, args: &[&str]) {
        self.kill();
        self.args = args.iter().map(|a| (*a).to_owned()).collect();
        self.spawn();
    }

    /// Sends SIGTERM (`kill -TERM`), asking for a graceful stop.
    pub fn terminate(&self) {
        let child = self.child.as_ref().expect("the server is running");
        let status = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -TERM failed: {status}");
    }

    /// Waits for the process to exit (at most `deadline`, then kills it and
    /// panics) and returns how it exited.
    pub fn wait_for_exit(&mut self, deadline: Duration) -> ExitStatus {
        let mut child = self.child.take().expect("the server is running");
        let until = Instant::now() + deadline;
        loop {
            if let Some(status) = child.try_wait().expect("wait for orders-api") {
                return status;
            }
            if Instant::now() >= until {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "orders-api did not exit within {deadline:?}:\n{}",
                    self.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Everything the process wrote to stdout and stderr so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Whether the process is still running.
    pub fn is_alive(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// The last lines the process wrote, for failure messages.
    pub fn log_tail(&self) -> String {
        let mut text = String::new();
        if let Ok(mut file) = File::open(&self.log) {
            let len = file.metadata().map(|m| m.len()).unwrap_or(0);
            let _ = file.seek(SeekFrom::Start(len.saturating_sub(4_000)));
            let _ = file.read_to_string(&mut text);
        }
        text
    }

    fn spawn(&mut self) {
        for _ in 0..START_ATTEMPTS {
            let log = OpenOptions::new()
                .create(true)
                .append(true)
                .open(&self.log)
                .expect("open the server log");
            let mut child = Command::new(BINARY)
                .arg("serve")
                .args(["--database-url", &self.database_url])
                .args(["--bind", &format!("127.0.0.1:{}", self.port)])
                .args(["--workers", "2"])
                .args(&self.args)
                .env("RUST_LOG", "warn")
                .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
                .stdin(Stdio::null())
                // `serve` writes nothing on stdout; what it says goes to stderr.
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .expect("start orders-api");
            match wait_until_healthy(&mut child, self.port) {
                Ok(()) => {
                    self.child = Some(child);
                    return;
                }
                Err(exit) if self.log_tail().contains("cannot listen") => {
                    eprintln!("port {} was taken ({exit}); trying another", self.port);
                    self.port = free_port();
                }
                Err(exit) => panic!("orders-api did not start ({exit}):\n{}", self.log_tail()),
            }
        }
        panic!("orders-api found no free port:\n{}", self.log_tail());
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            eprintln!(
                "--- orders-api log (port {}) ---\n{}",
                self.port,
                self.log_tail()
            );
        }
        let _ = std::fs::remove_file(&self.log);
    }
}

/// Polls `/healthz` until it answers 200; `Err` when the process exited.
fn wait_until_healthy(child: &mut Child, port: u16) -> Result<(), String> {
    let client =
        crate::net::Client::anonymous(&format!("http://127.0.0.1:{port}"), Duration::from_secs(2));
    let deadline = Instant::now() + START_DEADLINE;
    while Instant::now() < deadline {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("exited with {status}"));
        }
        if client.get("/healthz").is_ok_and(|r| r.status == 200) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    Err(format!("no answer on /healthz within {START_DEADLINE:?}"))
}

/// A port nobody listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// The `--database-url` value that names `url`.
pub fn url_argument(url: &DatabaseUrl) -> String {
    match url.backend() {
        Backend::Sqlite => format!("sqlite://{}", url.as_str()),
        Backend::Postgres => url.as_str().to_owned(),
    }
}

/// Applies the migrations and opens a small pool of the test's own, for
/// preparing the database (tokens) and asserting on what it stores.
pub fn prepare(url: &DatabaseUrl) -> Pool {
    db::run_migrations(url).expect("migrations");
    orders_api::db::connect(
        url,
        &PoolOptions {
            max_size: 2,
            connection_timeout: Duration::from_secs(10),
            lease: Duration::from_secs(30),
            write_queue: orders_api::db::writer::DEFAULT_QUEUE_CAPACITY,
            shown: "the test database".into(),
        },
    )
    .expect("pool")
}

/// A new API key for `user_id`, written straight into the database.
pub fn create_token(pool: &Pool, user_id: &str) -> String {
    let mut pooled = pool.get().expect("connection");
    orders_api::auth::create(&mut pooled.conn(), user_id).expect("create key")
}

/// The id of the order `user_id` created with `key`, if any.
pub fn order_id_for_key(pool: &Pool, user_id: &str, key: &str) -> Option<String> {
    use diesel::prelude::*;
    use orders_api::orders::model::OrderId;

    let mut pooled = pool.get().expect("connection");
    let id: Option<OrderId> = orders_api::dispatch!(&mut pooled.conn(), c, s => {
        use s::orders::dsl as t;
        t::orders
            .filter(t::user_id.eq(user_id).and(t::idempotency_key.eq(key)))
            .select(t::id)
            .first(c)
            .optional()
    })
    .expect("find order by key");
    id.map(|id| id.to_string())
}

/// Orders stored, for every user.
pub fn order_count(pool: &Pool) -> i64 {
    let mut pooled = pool.get().expect("connection");
    orders_api::dispatch!(&mut pooled.conn(), c, s => {
        diesel::RunQueryDsl::get_result(diesel::QueryDsl::count(s::orders::table), c)
    })
    .expect("count orders")
}

/// Idempotency-ledger rows stored, for every user.
pub fn ledger_count(pool: &Pool) -> i64 {
    let mut pooled = pool.get().expect("connection");
    idempotency_ledger::db::count(&mut pooled.conn()).expect("count ledger rows")
}

/// PostgreSQL: an uncommitted order row for `(user_id, key)`, held by the
/// test. A server's create with that key then blocks on it inside its own
/// transaction, holding the key's advisory lock: a request with that key
/// certainly in flight, for as long as the test likes (up to the server's
/// `lock_timeout`).
pub struct HeldOrderRow {
    conn: diesel::PgConnection,
}

impl HeldOrderRow {
    pub fn hold(url: &DatabaseUrl, user_id: &str, key: &str) -> Self {
        use diesel::connection::SimpleConnection;
        use diesel::sql_types::Text;
        use diesel::{Connection, RunQueryDsl};

        let mut conn = diesel::PgConnection::establish(url.as_str()).expect("connect");
        conn.batch_execute("BEGIN").expect("begin");
        diesel::sql_query(
            "INSERT INTO orders (id, user_id, item, quantity, price_cents, status, \
             idempotency_key, request_fingerprint, created_at, updated_at) VALUES \
             (gen_random_uuid(), $1, 'Held', 1, 100, 'pending', $2, 'held', now(), now())",
        )
        .bind::<Text, _>(user_id)
        .bind::<Text, _>(key)
        .execute(&mut conn)
        .expect("hold the row");
        Self { conn }
    }

    pub fn release(mut self) {
        use diesel::connection::SimpleConnection;
        self.conn
            .batch_execute("ROLLBACK")
            .expect("release the row");
    }
}

/// PostgreSQL: how many sessions on `url`'s database, other than the one
/// asking, match the `pg_stat_activity` condition.
pub fn pg_sessions_where(url: &DatabaseUrl, condition: &str) -> i64 {
    use diesel::{Connection, RunQueryDsl};

    let mut conn = diesel::PgConnection::establish(url.as_str()).expect("connect");
    diesel::select(diesel::dsl::sql::<diesel::sql_types::BigInt>(&format!(
        "(SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
         AND pid <> pg_backend_pid() AND {condition})"
    )))
    .get_result(&mut conn)
    .expect("read pg_stat_activity")
}

/// PostgreSQL: waits (at most `within`) until some session matches.
pub fn wait_for_session_where(url: &DatabaseUrl, condition: &str, within: Duration) {
    let deadline = Instant::now() + within;
    while pg_sessions_where(url, condition) == 0 {
        assert!(Instant::now() < deadline, "no session came to {condition}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// PostgreSQL: waits (at most `within`) until no session matches.
pub fn wait_for_no_session_where(url: &DatabaseUrl, condition: &str, within: Duration) {
    let deadline = Instant::now() + within;
    while pg_sessions_where(url, condition) > 0 {
        assert!(Instant::now() < deadline, "sessions still in {condition}");
        std::thread::sleep(Duration::from_millis(10));
    }
}
