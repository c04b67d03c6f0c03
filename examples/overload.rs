//! The benchmark's overload case alone (`examples/bench/overload.rs` says
//! what it measures):
//!
//! ```sh
//! cargo build --release --bin orders-api --example overload
//! ORDERS_API_BIN=target/release/orders-api target/release/examples/overload
//! BENCH_DATABASE_URL=postgres://USER@HOST/DB ORDERS_API_BIN=… target/release/examples/overload
//! ```
//!
//! On PostgreSQL it creates (and drops) a database of its own next to the
//! one the URL names. `BENCH_SECONDS` (10) is how long the overload lasts.
//!
//! `OVERLOAD_MODE=open` runs the open-loop case instead: creates offered at
//! a fixed rate, `OPEN_FACTOR` (1.5) × the capacity it measures first,
//! over `OPEN_SENDERS` (256) connections of one paced sender thread, each
//! latency counted from the time its request was due (`overload::run_open`,
//! `bench/paced.rs`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "bench/overload.rs"]
mod overload;
#[path = "bench/paced.rs"]
mod paced;
#[path = "bench/rss.rs"]
mod rss;

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use idempotency_ledger::DEFAULT_WRITE_ADMISSION;
use orders_api::db::{self, DatabaseUrl};

fn main() {
    let bin = std::env::var_os("ORDERS_API_BIN")
        .map(std::path::PathBuf::from)
        .expect("ORDERS_API_BIN: the release orders-api binary");
    let seconds = std::env::var("BENCH_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    let name = format!("orders_overload_{}", std::process::id());
    let admin = std::env::var("BENCH_DATABASE_URL").ok();
    let (url, store, label) = match &admin {
        Some(admin) => {
            let mut conn = PgConnection::establish(admin).expect("BENCH_DATABASE_URL");
            conn.batch_execute(&format!("CREATE DATABASE {name}"))
                .expect("create the database");
            let url = DatabaseUrl::parse(admin)
                .ok()
                .and_then(|u| u.with_database(&name))
                .expect("a postgres:// URL")
                .as_str()
                .to_owned();
            (url.clone(), overload::Store::Postgres(url), "PostgreSQL")
        }
        None => {
            let path = std::env::temp_dir().join(format!("{name}.db"));
            let url = format!("sqlite://{}", path.display());
            (url.clone(), overload::Store::Sqlite(url), "SQLite")
        }
    };
    let parsed = DatabaseUrl::parse(&url).expect("database URL");
    db::run_migrations(&parsed).expect("migrations");
    let token = {
        let pool = orders_api::db::connect(
            &parsed,
            &orders_api::config::Settings::for_database(parsed.clone()).pool_options(),
        )
        .expect("pool");
        let mut pooled = pool.get().expect("connection");
        orders_api::auth::create(&mut pooled.conn(), "bench").expect("token")
    };
    let (mut server, base) = overload::start_server(&bin, &url);
    let bound = usize::try_from(DEFAULT_WRITE_ADMISSION).unwrap();
    if std::env::var("OVERLOAD_MODE").as_deref() == Ok("open") {
        // Offered at a fixed rate, 1.5 × the measured capacity (OPEN_FACTOR),
        // over OPEN_SENDERS connections (256).
        let env = |name: &str, default: f64| {
            std::env::var(name)
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(default)
        };
        let figures = overload::run_open(
            &server,
            &base,
            &token,
            &store,
            env("OPEN_FACTOR", 1.5),
            env("OPEN_SENDERS", 256.0) as usize,
            seconds,
        );
        println!("{}", figures.markdown(label));
    } else {
        let figures = overload::run(&server, &base, &token, &store, bound, seconds);
        println!("{}", figures.markdown(label));
    }
    let _ = server.kill();
    let _ = server.wait();
    match admin {
        Some(admin) => {
            if let Ok(mut conn) = PgConnection::establish(&admin) {
                let _ = conn.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"));
            }
        }
        None => {
            let path = url.trim_start_matches("sqlite://");
            for suffix in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{path}{suffix}"));
            }
        }
    }
}
