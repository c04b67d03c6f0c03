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
//! - SQLite only: **bare insert, group commit FULL**: the service's own
//!   writer (one transaction for whatever is queued, a savepoint per row) at
//!   `synchronous = FULL`, doing nothing but the insert — the ceiling of a
//!   durable write, which create is measured against;
//! - `POST /v1/orders` with fresh keys (create), the same request replayed,
//!   `GET /v1/orders/{id}`, and a mix (70 % create, 20 % replay, 10 % read);
//! - create again while the server purges 1,000,000 expired ledger rows;
//! - PostgreSQL only: `pgbench` inserting one row per transaction into a
//!   table shaped like `orders`, same server, same client count, run right
//!   after create (the ratio's two figures then see the same machine).
//!
//! The server runs as its own process (`RUST_LOG=warn`: no per-request log
//! lines), so its peak RSS is its own.
//!
//! Files: this one (the settings and the cases), `server.rs` (the server
//! process), `baseline.rs` (the bare-storage server), `wrk.rs` (the Lua
//! scripts, the driver and its parser), `database.rs` (the expired backlog
//! and the counts), `pgbench.rs`, `rss.rs` (peak RSS) and `report.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::sql_types::Text;
use orders_api::db::{self, Backend, DatabaseUrl, PoolOptions};

mod baseline;
mod database;
mod pgbench;
mod report;
mod rss;
mod server;
mod wrk;

use baseline::Baseline;
use database::{add_expired_backlog, ledger_expired, order_total};
use pgbench::pgbench;
use report::Report;
use server::Server;
use wrk::{Scripts, wrk_all};

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
    // `BENCH_CEILINGS_ONLY=1`: serve the bare-storage ceilings and nothing
    // else, their address on the first line, until the process is stopped
    // (`scripts/profile.sh` counts their instructions per request).
    if std::env::var_os("BENCH_CEILINGS_ONLY").is_some() {
        let baseline = Baseline::start(&config, &target);
        println!("{}", baseline.base);
        loop {
            std::thread::park();
        }
    }
    let mut report = Report {
        durability: target.durability(),
        load_at_start: report::load_average(),
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
                "SQLite WAL: the service and the group-commit baseline at synchronous = FULL, the per-request bare insert at NORMAL"
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
    let pool = orders_api::db::connect(
        &url,
        &PoolOptions {
            max_size: 2,
            connection_timeout: Duration::from_secs(10),
            lease: Duration::from_secs(30),
            write_queue: 16,
            shown: "the test database".into(),
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
    if matches!(target, Target::Sqlite(_)) {
        wrk(
            "bare insert, group commit FULL (baseline)",
            vec![baseline.base.clone()],
            &scripts.bare_group_insert,
            &[],
        );
    }
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
    // pgbench right after create, so that the two figures of that ratio see
    // the same machine (it is shared, and its load changes within minutes).
    let pgbench_tps = match target {
        Target::Postgres { url, .. } => Some(pgbench(config, url)),
        Target::Sqlite(_) => None,
    };
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
    report.pgbench = pgbench_tps;
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
