//! Load benchmark: the idempotent paths against the stack's own ceilings,
//! measured in one run on one machine so that the ratios mean something.
//!
//! ```sh
//! scripts/bench.sh                                      # SQLite (temp file)
//! BENCH_DATABASE_URL=postgres://USER@HOST/DB scripts/bench.sh   # PostgreSQL
//! BENCH_SECONDS=8 BENCH_CONNECTIONS=32 BENCH_PROCESSES=2 scripts/bench.sh
//! ```
//!
//! `scripts/bench.sh` builds the release binary and this example, then runs
//! it with `ORDERS_API_BIN` pointing at the binary. Every case is `wrk` with
//! `BENCH_CONNECTIONS` connections (32) for `BENCH_SECONDS` (8) against
//! 127.0.0.1, durability on (SQLite `synchronous = FULL`; PostgreSQL as
//! configured — use a cluster with `fsync` on):
//!
//! - `GET /healthz`: the HTTP stack alone;
//! - **bare insert** and **bare read**: a baseline server in this process,
//!   same stack (actix-web, diesel, r2d2, a blocking hop), one row inserted
//!   per request in its own transaction (`BEGIN IMMEDIATE`; SQLite at
//!   `synchronous = NORMAL`, the per-request ceiling) or read by primary key;
//! - `POST /v1/orders` with fresh keys (create), the same request replayed,
//!   `GET /v1/orders/{id}`, and a mix (70 % create, 20 % replay, 10 % read);
//! - create again while the server purges 1,000,000 expired ledger rows;
//! - PostgreSQL only: `pgbench` inserting one row per transaction into a
//!   table shaped like `orders`, same server, same client count.
//!
//! The server runs as its own process (`RUST_LOG=warn`: no per-request log
//! lines), so its peak RSS is its own.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use actix_web::{App, HttpResponse, HttpServer, web};
use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::r2d2::{self, ConnectionManager, CustomizeConnection};
use diesel::sql_types::{BigInt, Text};
use orders_api::db::{self, Backend, DatabaseUrl, Pool, PoolOptions};

const BODY: &str = r#"{"item":"Widget","quantity":2,"price":9.99}"#;
const PURGE_BACKLOG: i64 = 1_000_000;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

struct Config {
    seconds: u64,
    connections: u32,
    processes: usize,
    bin: PathBuf,
    dir: PathBuf,
}

fn main() {
    let bin = std::env::var_os("ORDERS_API_BIN")
        .map(PathBuf::from)
        .expect("ORDERS_API_BIN: run this through scripts/bench.sh");
    let dir = std::env::temp_dir().join(format!("orders-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let config = Config {
        seconds: env_or("BENCH_SECONDS", 8),
        connections: env_or("BENCH_CONNECTIONS", 32),
        processes: env_or("BENCH_PROCESSES", 1usize).clamp(1, 2),
        bin,
        dir,
    };
    let target = match std::env::var("BENCH_DATABASE_URL") {
        Ok(admin) => Target::postgres(&admin),
        Err(_) => Target::Sqlite(config.dir.join("orders.db")),
    };
    let mut report = Report {
        durability: target.durability(),
        ..Report::default()
    };
    run(&config, &target, &mut report);
    report.print(&config, &target);
    target.cleanup();
    let _ = std::fs::remove_dir_all(&config.dir);
}

/// Where the service's data lives for this run.
enum Target {
    Sqlite(PathBuf),
    Postgres {
        admin: String,
        url: String,
        name: String,
    },
}

impl Target {
    /// A fresh database on the server `admin` names, dropped at the end.
    fn postgres(admin: &str) -> Self {
        let name = format!("orders_bench_{}", std::process::id());
        let mut conn = PgConnection::establish(admin).expect("BENCH_DATABASE_URL");
        conn.batch_execute(&format!("CREATE DATABASE {name}"))
            .expect("create the bench database");
        let (base, query) = admin.split_once('?').unwrap_or((admin, ""));
        let server = base.rsplit_once('/').map_or(base, |(server, _)| server);
        let url = if query.is_empty() {
            format!("{server}/{name}")
        } else {
            format!("{server}/{name}?{query}")
        };
        Target::Postgres {
            admin: admin.to_owned(),
            url,
            name,
        }
    }

    fn url(&self) -> String {
        match self {
            Target::Sqlite(path) => format!("sqlite://{}", path.display()),
            Target::Postgres { url, .. } => url.clone(),
        }
    }

    /// The settings every figure depends on, as the database reports them.
    fn durability(&self) -> String {
        match self {
            Target::Sqlite(_) => {
                "SQLite WAL: the service at synchronous = FULL, the bare-insert baseline at NORMAL"
                    .to_owned()
            }
            Target::Postgres { url, .. } => {
                #[derive(QueryableByName)]
                struct Setting {
                    #[diesel(sql_type = Text)]
                    setting: String,
                }
                let mut conn = PgConnection::establish(url).expect("connect");
                let show = |conn: &mut PgConnection, name: &str| {
                    diesel::sql_query(format!("SELECT current_setting('{name}') AS setting"))
                        .get_result::<Setting>(conn)
                        .map(|s| s.setting)
                        .unwrap_or_else(|_| "?".into())
                };
                let fsync = show(&mut conn, "fsync");
                let commit = show(&mut conn, "synchronous_commit");
                let warning = if fsync == "on" && commit == "on" {
                    ""
                } else {
                    " — NOT DURABLE: these figures measure commits that users do not run"
                };
                format!("PostgreSQL fsync = {fsync}, synchronous_commit = {commit}{warning}")
            }
        }
    }

    fn backend(&self) -> Backend {
        match self {
            Target::Sqlite(_) => Backend::Sqlite,
            Target::Postgres { .. } => Backend::Postgres,
        }
    }

    fn cleanup(&self) {
        if let Target::Postgres { admin, name, .. } = self
            && let Ok(mut conn) = PgConnection::establish(admin)
        {
            let _ = conn.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"));
        }
    }
}

fn run(config: &Config, target: &Target, report: &mut Report) {
    let url = DatabaseUrl::parse(&target.url()).expect("database URL");
    db::run_migrations(&url).expect("migrations");
    let pool = Pool::connect(
        &url,
        &PoolOptions {
            max_size: 2,
            connection_timeout: Duration::from_secs(10),
            lease: Duration::from_secs(30),
            write_queue: 16,
        },
    )
    .expect("pool");
    let token = {
        let mut pooled = pool.get().expect("connection");
        orders_api::auth::create(&mut pooled.conn(), "bench").expect("token")
    };

    // The baseline server: same stack, nothing but one row per request.
    let baseline = Baseline::start(config, target);
    let scripts = Scripts::write(&config.dir, &token);

    let servers: Vec<Server> = (0..config.processes)
        .map(|_| Server::start(config, target, &[]))
        .collect();
    let first = &servers[0];
    let (replay_key, order_path) = prepare_orders(&first.base, &token);
    let mut wrk = |name: &str, bases: Vec<String>, script: &Path, args: &[&str]| {
        let result = wrk_all(config, &bases, script, args);
        report.add(name, result);
    };
    let all_bases: Vec<String> = servers.iter().map(|s| s.base.clone()).collect();

    wrk(
        "GET /healthz",
        vec![first.base.clone()],
        &scripts.healthz,
        &[],
    );
    wrk(
        "bare insert (baseline)",
        vec![baseline.base.clone()],
        &scripts.bare_insert,
        &[],
    );
    wrk(
        "bare read (baseline)",
        vec![baseline.base.clone()],
        &scripts.bare_read,
        &[],
    );
    let before = order_total(&pool);
    wrk(
        "POST /v1/orders create",
        all_bases.clone(),
        &scripts.create,
        &[],
    );
    let stored = order_total(&pool) - before;
    wrk(
        "POST /v1/orders replay",
        all_bases.clone(),
        &scripts.replay,
        &[&replay_key],
    );
    wrk(
        "GET /v1/orders/{id}",
        all_bases.clone(),
        &scripts.get,
        &[&replay_key, &order_path],
    );
    wrk(
        "mixed 70/20/10",
        all_bases,
        &scripts.mixed,
        &[&replay_key, &order_path],
    );
    report.check_creates("POST /v1/orders create", stored);
    report.peak_rss_kb = servers.iter().map(Server::peak_rss_kb).max();
    drop(servers);

    // Create while the purge works through a backlog of expired entries.
    add_expired_backlog(&pool, PURGE_BACKLOG);
    let purging = Server::start(config, target, &[("PURGE_INTERVAL_SECS", "1")]);
    std::thread::sleep(Duration::from_millis(1_500)); // the first purge round starts
    let before = order_total(&pool);
    let result = wrk_all(
        config,
        std::slice::from_ref(&purging.base),
        &scripts.create,
        &[],
    );
    report.add("create while purging 1M expired", result);
    report.check_creates(
        "create while purging 1M expired",
        order_total(&pool) - before,
    );
    report.purge_left = Some(ledger_expired(&pool));
    drop(purging);

    if let Target::Postgres { url, .. } = target {
        report.pgbench = Some(pgbench(config, url));
    }
    drop(baseline);
}

/// One replayable create and one readable order, made before the load.
fn prepare_orders(base: &str, token: &str) -> (String, String) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let key = format!("bench-replay-{}", std::process::id());
    let response = agent
        .post(format!("{base}/v1/orders"))
        .header("Authorization", &format!("Bearer {token}"))
        .header("Idempotency-Key", &key)
        .header("Content-Type", "application/json")
        .send(BODY)
        .expect("create the replayed order");
    assert_eq!(response.status().as_u16(), 201, "the first create");
    let location = response
        .headers()
        .get("location")
        .and_then(|v| v.to_str().ok())
        .expect("Location")
        .to_owned();
    (key, location)
}

/// The orders-api binary serving on a free port, as its own process.
struct Server {
    child: Child,
    base: String,
}

impl Server {
    fn start(config: &Config, target: &Target, env: &[(&str, &str)]) -> Self {
        let port = free_port();
        let mut command = Command::new(&config.bin);
        command
            .arg("serve")
            .env("DATABASE_URL", target.url())
            .env("BIND_ADDR", format!("127.0.0.1:{port}"))
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if target.backend() == Backend::Postgres {
            // Enough connections that concurrent commits share PostgreSQL's WAL flushes.
            let per_process = (config.connections as usize / config.processes).max(4);
            command.env("DATABASE_POOL_SIZE", per_process.to_string());
        }
        for (name, value) in env {
            command.env(name, value);
        }
        let child = command.spawn().expect("start orders-api");
        let base = format!("http://127.0.0.1:{port}");
        wait_until_up(&format!("{base}/readyz"));
        Self { child, base }
    }

    fn peak_rss_kb(&self) -> u64 {
        peak_rss_kb(self.child.id())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

fn wait_until_up(url: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if ureq::get(url).call().is_ok() {
            return;
        }
        assert!(Instant::now() < deadline, "{url} never answered");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The highest resident set size the process has had, in KiB.
fn peak_rss_kb(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

// ---------------------------------------------------------------------------
// The baseline: the same stack doing nothing but the storage work.

#[derive(Clone)]
enum BaselinePool {
    Sqlite(r2d2::Pool<ConnectionManager<SqliteConnection>>),
    Postgres(r2d2::Pool<ConnectionManager<PgConnection>>),
}

#[derive(Debug, Clone, Copy)]
struct SqliteNormal;

impl CustomizeConnection<SqliteConnection, r2d2::Error> for SqliteNormal {
    fn on_acquire(&self, conn: &mut SqliteConnection) -> Result<(), r2d2::Error> {
        conn.batch_execute(
            "PRAGMA busy_timeout = 5000; PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL;",
        )
        .map_err(r2d2::Error::QueryError)
    }
}

const BARE_TABLE: &str = "CREATE TABLE IF NOT EXISTS bare_rows (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE, user_id TEXT NOT NULL,
    item TEXT NOT NULL, quantity INTEGER NOT NULL, price_cents BIGINT NOT NULL,
    status TEXT NOT NULL, idempotency_key TEXT NOT NULL, created_at TEXT NOT NULL,
    UNIQUE (user_id, idempotency_key))";
const BARE_TABLE_PG: &str = "CREATE TABLE IF NOT EXISTS bare_rows (
    seq BIGSERIAL PRIMARY KEY, id TEXT NOT NULL UNIQUE, user_id TEXT NOT NULL,
    item TEXT NOT NULL, quantity INTEGER NOT NULL, price_cents BIGINT NOT NULL,
    status TEXT NOT NULL, idempotency_key TEXT NOT NULL, created_at TEXT NOT NULL,
    UNIQUE (user_id, idempotency_key))";

diesel::table! {
    bare_rows (seq) {
        seq -> BigInt,
        id -> Text,
        user_id -> Text,
        item -> Text,
        quantity -> Integer,
        price_cents -> BigInt,
        status -> Text,
        idempotency_key -> Text,
        created_at -> Text,
    }
}

#[derive(Queryable, serde::Serialize)]
struct BareRow {
    id: String,
    item: String,
    price_cents: i64,
    created_at: String,
}

/// Both baseline statements are diesel's DSL, so that diesel caches their
/// prepared statements exactly as it does the service's.
impl BaselinePool {
    fn insert(&self) -> QueryResult<String> {
        use bare_rows::dsl as t;
        let id = uuid::Uuid::now_v7().to_string();
        let now = chrono::Utc::now().to_rfc3339();
        let row = (
            t::id.eq(&id),
            t::user_id.eq("bench"),
            t::item.eq("Widget"),
            t::quantity.eq(2),
            t::price_cents.eq(999_i64),
            t::status.eq("pending"),
            t::idempotency_key.eq(&id),
            t::created_at.eq(&now),
        );
        let unavailable =
            |e: diesel::r2d2::PoolError| diesel::result::Error::QueryBuilderError(e.into());
        match self {
            BaselinePool::Sqlite(p) => {
                let mut c = p.get().map_err(unavailable)?;
                c.immediate_transaction(|c| {
                    diesel::insert_into(t::bare_rows).values(row).execute(c)
                })?;
            }
            BaselinePool::Postgres(p) => {
                let mut c = p.get().map_err(unavailable)?;
                c.transaction(|c| diesel::insert_into(t::bare_rows).values(row).execute(c))?;
            }
        }
        Ok(id)
    }

    fn read(&self, seq: i64) -> QueryResult<Option<BareRow>> {
        use bare_rows::dsl as t;
        let query = t::bare_rows.filter(t::seq.eq(seq)).select((
            t::id,
            t::item,
            t::price_cents,
            t::created_at,
        ));
        let unavailable =
            |e: diesel::r2d2::PoolError| diesel::result::Error::QueryBuilderError(e.into());
        match self {
            BaselinePool::Sqlite(p) => query
                .get_result(&mut p.get().map_err(unavailable)?)
                .optional(),
            BaselinePool::Postgres(p) => query
                .get_result(&mut p.get().map_err(unavailable)?)
                .optional(),
        }
    }
}

struct Baseline {
    base: String,
    handle: actix_web::dev::ServerHandle,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Baseline {
    fn start(config: &Config, target: &Target) -> Self {
        let pool = match target {
            Target::Sqlite(_) => {
                let path = config.dir.join("bare.db");
                let manager =
                    ConnectionManager::<SqliteConnection>::new(path.display().to_string());
                let pool = r2d2::Pool::builder()
                    .max_size(8)
                    .connection_customizer(Box::new(SqliteNormal))
                    .build(manager)
                    .expect("baseline pool");
                pool.get()
                    .expect("baseline connection")
                    .batch_execute(BARE_TABLE)
                    .expect("table");
                BaselinePool::Sqlite(pool)
            }
            Target::Postgres { url, .. } => {
                let manager = ConnectionManager::<PgConnection>::new(url.clone());
                let pool = r2d2::Pool::builder()
                    .max_size(config.connections.max(8))
                    .build(manager)
                    .expect("baseline pool");
                pool.get()
                    .expect("baseline connection")
                    .batch_execute(BARE_TABLE_PG)
                    .expect("table");
                BaselinePool::Postgres(pool)
            }
        };
        pool.insert().expect("the row that bare reads read");
        let port = free_port();
        let (tx, rx) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            actix_web::rt::System::new().block_on(async move {
                let data = web::Data::new(pool);
                let server = HttpServer::new(move || {
                    App::new()
                        .app_data(data.clone())
                        .route("/bare", web::post().to(bare_insert))
                        .route("/bare/{seq}", web::get().to(bare_read))
                })
                .bind(("127.0.0.1", port))
                .expect("bind the baseline")
                .disable_signals()
                .run();
                tx.send(server.handle()).expect("report the handle");
                let _ = server.await;
            });
        });
        let handle = rx.recv().expect("baseline started");
        Self {
            base: format!("http://127.0.0.1:{port}"),
            handle,
            thread: Some(thread),
        }
    }
}

impl Drop for Baseline {
    fn drop(&mut self) {
        let handle = self.handle.clone();
        actix_web::rt::System::new().block_on(handle.stop(true));
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn bare_insert(pool: web::Data<BaselinePool>) -> HttpResponse {
    match web::block(move || pool.insert()).await {
        Ok(Ok(id)) => HttpResponse::Created().json(serde_json::json!({ "id": id })),
        _ => HttpResponse::ServiceUnavailable().finish(),
    }
}

async fn bare_read(pool: web::Data<BaselinePool>, seq: web::Path<i64>) -> HttpResponse {
    let seq = seq.into_inner();
    match web::block(move || pool.read(seq)).await {
        Ok(Ok(Some(row))) => HttpResponse::Ok().json(row),
        Ok(Ok(None)) => HttpResponse::NotFound().finish(),
        _ => HttpResponse::ServiceUnavailable().finish(),
    }
}

// ---------------------------------------------------------------------------
// Load.

struct Scripts {
    healthz: PathBuf,
    bare_insert: PathBuf,
    bare_read: PathBuf,
    create: PathBuf,
    replay: PathBuf,
    get: PathBuf,
    mixed: PathBuf,
}

impl Scripts {
    /// wrk scripts; every thread numbers its own keys, so keys never repeat.
    fn write(dir: &Path, token: &str) -> Self {
        let body = BODY.replace('"', "\\\"");
        let common = format!(
            r#"local token = "{token}"
local body = "{body}"
local counter = 0
local threads = 0
-- args: an id unique to this wrk invocation, then the replayed key and the
-- read path. `thread_id` is a global that setup() gives each thread's own
-- state (a `local` of that name would hide it, and every thread would send
-- the same keys).
local invocation, key, path = "", nil, nil
function setup(thread)
  threads = threads + 1
  thread:set("thread_id", threads)
end
function init(args)
  invocation, key, path = args[1], args[2], args[3]
end
local function auth(h) h["Authorization"] = "Bearer " .. token return h end
local function create()
  counter = counter + 1
  return wrk.format("POST", "/v1/orders", auth({{["Content-Type"] = "application/json",
    ["Idempotency-Key"] = invocation .. "-" .. thread_id .. "-" .. counter}}), body)
end
local function replay(k)
  return wrk.format("POST", "/v1/orders", auth({{["Content-Type"] = "application/json",
    ["Idempotency-Key"] = k}}), body)
end
local function read(p) return wrk.format("GET", p, auth({{}})) end
"#,
        );
        let file = |name: &str, body: &str| -> PathBuf {
            let path = dir.join(format!("{name}.lua"));
            std::fs::write(&path, format!("{common}{body}")).expect("write wrk script");
            path
        };
        Self {
            healthz: file(
                "healthz",
                "request = function() return wrk.format(\"GET\", \"/healthz\") end\n",
            ),
            bare_insert: file(
                "bare_insert",
                "request = function() return wrk.format(\"POST\", \"/bare\") end\n",
            ),
            bare_read: file(
                "bare_read",
                "request = function() return wrk.format(\"GET\", \"/bare/1\") end\n",
            ),
            create: file("create", "request = create\n"),
            replay: file("replay", "request = function() return replay(key) end\n"),
            get: file("get", "request = function() return read(path) end\n"),
            mixed: file(
                "mixed",
                "request = function()\n  local r = math.random(10)\n  if r <= 7 then return create()\n  \
                 elseif r <= 9 then return replay(key)\n  else return read(path) end\nend\n",
            ),
        }
    }
}

#[derive(Debug, Clone, Default)]
struct WrkResult {
    /// Responses received (warm-up included, for the stored-orders check).
    requests: u64,
    requests_per_sec: f64,
    p50_ms: f64,
    p99_ms: f64,
    errors: u64,
}

/// Runs wrk against every base at once (the connections split between
/// them) and adds up what they served: first a warm-up of
/// `BENCH_WARMUP_SECONDS` (2) whose figures are dropped (a new database's
/// WAL file grows to its working size, caches fill), then the measurement.
fn wrk_all(config: &Config, bases: &[String], script: &Path, args: &[&str]) -> WrkResult {
    let warmup: u64 = env_or("BENCH_WARMUP_SECONDS", 2);
    let warm = if warmup > 0 {
        wrk_once(config, bases, script, args, warmup).requests
    } else {
        0
    };
    let mut measured = wrk_once(config, bases, script, args, config.seconds);
    measured.requests += warm;
    measured
}

/// A prefix no other wrk invocation of this run uses, for its keys.
fn invocation_id() -> String {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    format!(
        "{}-{}-{n}",
        std::process::id(),
        uuid::Uuid::new_v4().simple()
    )
}

fn wrk_once(
    config: &Config,
    bases: &[String],
    script: &Path,
    args: &[&str],
    seconds: u64,
) -> WrkResult {
    let connections = (config.connections as usize / bases.len()).max(1);
    let threads = connections.min(2);
    let children: Vec<Child> = bases
        .iter()
        .map(|base| {
            Command::new("wrk")
                .args([
                    "--latency",
                    "-t",
                    &threads.to_string(),
                    "-c",
                    &connections.to_string(),
                    "-d",
                    &format!("{seconds}s"),
                    "-s",
                ])
                .arg(script)
                .arg(base)
                .arg("--")
                .arg(invocation_id())
                .args(args)
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .expect("wrk (apt-get install wrk)")
        })
        .collect();
    let mut total = WrkResult::default();
    for child in children {
        let output = child.wait_with_output().expect("wrk");
        let one = parse_wrk(&String::from_utf8_lossy(&output.stdout));
        total.requests += one.requests;
        total.requests_per_sec += one.requests_per_sec;
        total.p50_ms = total.p50_ms.max(one.p50_ms);
        total.p99_ms = total.p99_ms.max(one.p99_ms);
        total.errors += one.errors;
    }
    total
}

fn parse_wrk(out: &str) -> WrkResult {
    let mut result = WrkResult::default();
    for line in out.lines().map(str::trim) {
        let mut words = line.split_whitespace();
        match (words.next(), words.next()) {
            (Some("Requests/sec:"), Some(v)) => result.requests_per_sec = v.parse().unwrap_or(0.0),
            (Some(n), Some("requests")) => result.requests = n.parse().unwrap_or(0),
            (Some("50%"), Some(v)) => result.p50_ms = duration_ms(v),
            (Some("99%"), Some(v)) => result.p99_ms = duration_ms(v),
            (Some("Non-2xx"), _) => {
                result.errors += line
                    .rsplit(' ')
                    .next()
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(0);
            }
            (Some("Socket"), Some("errors:")) => {
                result.errors += line
                    .split(',')
                    .filter_map(|part| part.split_whitespace().last()?.parse::<u64>().ok())
                    .sum::<u64>();
            }
            _ => {}
        }
    }
    result
}

/// wrk's `1.23ms`, `456.78us`, `1.20s`.
fn duration_ms(v: &str) -> f64 {
    let (number, scale) = if let Some(n) = v.strip_suffix("us") {
        (n, 0.001)
    } else if let Some(n) = v.strip_suffix("ms") {
        (n, 1.0)
    } else if let Some(n) = v.strip_suffix('s') {
        (n, 1000.0)
    } else {
        (v, 1.0)
    };
    number.parse::<f64>().unwrap_or(0.0) * scale
}

/// `count` ledger entries that expired an hour ago.
fn add_expired_backlog(pool: &Pool, count: i64) {
    let mut pooled = pool.get().expect("connection");
    match pooled.conn() {
        db::Conn::Sqlite(c) => c
            .batch_execute(&format!(
                "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {count})
                 INSERT INTO idempotency_ledger (idempotency_key, user_id, request_fingerprint,
                     response_status, response_headers, response_body, created_at, expires_at)
                 SELECT 'expired-' || i, 'bench', 'fp', 201, '[]', x'7b7d',
                        '2026-01-01 00:00:00.000000+00:00', '2026-01-02 00:00:00.000000+00:00' FROM n;"
            ))
            .expect("expired backlog"),
        db::Conn::Postgres(c) => c
            .batch_execute(&format!(
                "INSERT INTO idempotency_ledger (idempotency_key, user_id, request_fingerprint,
                     response_status, response_headers, response_body, created_at, expires_at)
                 SELECT 'expired-' || i, 'bench', 'fp', 201, '[]', '\\x7b7d',
                        now() - interval '2 days', now() - interval '1 day'
                 FROM generate_series(1, {count}) AS i;"
            ))
            .expect("expired backlog"),
    }
}

/// Orders in the database: after a create case, one more per create.
fn order_total(pool: &Pool) -> i64 {
    #[derive(QueryableByName)]
    struct Count {
        #[diesel(sql_type = BigInt)]
        n: i64,
    }
    let sql = "SELECT count(*) AS n FROM orders";
    let mut pooled = pool.get().expect("connection");
    let counted: QueryResult<Count> = match pooled.conn() {
        db::Conn::Sqlite(c) => diesel::sql_query(sql).get_result(c),
        db::Conn::Postgres(c) => diesel::sql_query(sql).get_result(c),
    };
    counted.map(|c| c.n).expect("count orders")
}

fn ledger_expired(pool: &Pool) -> i64 {
    let mut pooled = pool.get().expect("connection");
    let sql = "SELECT count(*) AS n FROM idempotency_ledger WHERE user_id = 'bench'";
    #[derive(QueryableByName)]
    struct Count {
        #[diesel(sql_type = BigInt)]
        n: i64,
    }
    let counted: QueryResult<Count> = match pooled.conn() {
        db::Conn::Sqlite(c) => diesel::sql_query(sql).get_result(c),
        db::Conn::Postgres(c) => diesel::sql_query(sql).get_result(c),
    };
    counted.map(|c| c.n).unwrap_or(-1)
}

/// PostgreSQL's own one-row-per-transaction insert rate into a table shaped
/// like `orders`, with the same number of clients.
fn pgbench(config: &Config, url: &str) -> f64 {
    let mut conn = PgConnection::establish(url).expect("connect for pgbench");
    conn.batch_execute(
        // INCLUDING ALL copies the identity of `seq` with a sequence of its own.
        "CREATE TABLE IF NOT EXISTS pgbench_orders (LIKE orders INCLUDING ALL);",
    )
    .expect("pgbench table");
    let script = config.dir.join("pgbench.sql");
    std::fs::write(
        &script,
        "INSERT INTO pgbench_orders (id, user_id, item, quantity, price_cents, status, \
         idempotency_key, request_fingerprint, created_at, updated_at) VALUES \
         (gen_random_uuid(), 'bench', 'Widget', 2, 999, 'pending', gen_random_uuid()::text, \
         'fp', now(), now());\n",
    )
    .expect("pgbench script");
    let plain_url = url.split('?').next().unwrap_or(url);
    let output = Command::new("pgbench")
        .args(["-n", "-M", "prepared", "-j", "2", "-c"])
        .arg(config.connections.to_string())
        .args(["-T", &config.seconds.to_string(), "-f"])
        .arg(&script)
        .arg(plain_url)
        .output()
        .expect("pgbench (apt-get install postgresql-client)");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("tps = "))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0)
}

// ---------------------------------------------------------------------------
// The report.

#[derive(Default)]
struct Report {
    durability: String,
    /// Creates answered against orders stored, per create case.
    checks: Vec<String>,
    rows: Vec<(String, WrkResult)>,
    peak_rss_kb: Option<u64>,
    purge_left: Option<i64>,
    pgbench: Option<f64>,
}

impl Report {
    fn add(&mut self, name: &str, result: WrkResult) {
        eprintln!(
            "  {name}: {:.0} req/s, p99 {:.1} ms, {} errors",
            result.requests_per_sec, result.p99_ms, result.errors
        );
        self.rows.push((name.to_owned(), result));
    }

    /// Every answered create must have made exactly one order (wrk drops
    /// the requests still in flight when it stops, which may still commit:
    /// up to one per connection per wrk run).
    fn check_creates(&mut self, name: &str, stored: i64) {
        let answered = self.get(name).requests as i64;
        let in_flight = 2 * 32_i64;
        let verdict = if stored >= answered && stored - answered <= in_flight {
            "every answered create made one order"
        } else {
            "MISMATCH: a create was lost or two shared a key"
        };
        self.checks.push(format!(
            "  {name}: {answered} answered, {stored} orders stored: {verdict}"
        ));
    }

    fn get(&self, name: &str) -> WrkResult {
        self.rows
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, r)| r.clone())
            .unwrap_or_default()
    }

    fn print(&self, config: &Config, target: &Target) {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "\nbackend: {:?}; {} connections; {} s per case; {} server process(es)\n",
            target.backend(),
            config.connections,
            config.seconds,
            config.processes
        );
        let _ = writeln!(out, "durability: {}\n", self.durability);
        let _ = writeln!(out, "| case | req/s | p50 ms | p99 ms | errors |");
        let _ = writeln!(out, "|---|---:|---:|---:|---:|");
        for (name, r) in &self.rows {
            let _ = writeln!(
                out,
                "| {name} | {:.0} | {:.2} | {:.2} | {} |",
                r.requests_per_sec, r.p50_ms, r.p99_ms, r.errors
            );
        }
        if let Some(tps) = self.pgbench {
            let _ = writeln!(out, "| pgbench one-row insert | {tps:.0} | | | |");
        }
        let _ = writeln!(out, "\ncreates (warm-up included):");
        for check in &self.checks {
            let _ = writeln!(out, "{check}");
        }
        let create = self.get("POST /v1/orders create");
        let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
        let _ = writeln!(out, "\nratios (target in brackets):");
        let _ = writeln!(
            out,
            "  create / bare insert          {:.2}  [>= 1.0 on SQLite]",
            ratio(
                create.requests_per_sec,
                self.get("bare insert (baseline)").requests_per_sec
            )
        );
        let _ = writeln!(
            out,
            "  create p99                    {:.1} ms  [<= 25 ms]",
            create.p99_ms
        );
        let bare_read = self.get("bare read (baseline)").requests_per_sec;
        let _ = writeln!(
            out,
            "  replay / bare read            {:.2}  [>= 0.8]",
            ratio(
                self.get("POST /v1/orders replay").requests_per_sec,
                bare_read
            )
        );
        let _ = writeln!(
            out,
            "  GET order / bare read         {:.2}  [>= 0.8]",
            ratio(self.get("GET /v1/orders/{id}").requests_per_sec, bare_read)
        );
        let purging = self.get("create while purging 1M expired");
        let _ = writeln!(
            out,
            "  create p99 purging / not      {:.2}  [<= 2.0] ({} backlog rows left after the run)",
            ratio(purging.p99_ms, create.p99_ms),
            self.purge_left.unwrap_or(-1)
        );
        if let Some(kb) = self.peak_rss_kb {
            let _ = writeln!(
                out,
                "  peak RSS of the server        {:.1} MB  [<= 64 MB]",
                kb as f64 / 1024.0
            );
        }
        if let Some(tps) = self.pgbench {
            let _ = writeln!(
                out,
                "  create / pgbench insert       {:.2}  [>= 0.5 on PostgreSQL]",
                ratio(create.requests_per_sec, tps)
            );
        }
        println!("{out}");
    }
}
