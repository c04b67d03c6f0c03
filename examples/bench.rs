//! Throughput of the idempotent paths against their baselines, measured in
//! one run on one machine so that the ratios mean something.
//!
//! ```sh
//! cargo run --release --example bench                      # SQLite (temp file)
//! BENCH_DATABASE_URL=postgres://… cargo run --release --example bench
//! BENCH_SECONDS=5 BENCH_CLIENTS=8 cargo run --release --example bench
//! ```
//!
//! Two levels:
//! - **storage**: one order per transaction, the ledger's claim → insert →
//!   record versus a bare insert of the same row (the stack's raw insert);
//! - **HTTP**: `POST /v1/orders` with fresh keys (retry-safe create), the same
//!   `POST` replayed, and a plain `GET /v1/orders/{id}`, each for a fixed time
//!   with several client threads on 127.0.0.1.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use orders_api::config::Settings;
use orders_api::db::{self, DatabaseUrl, Pool};
use orders_api::idempotency::{
    Completion, Fingerprint, IdempotencyKey, Ledger, LedgerRequest, RecordedResponse,
};
use orders_api::orders::input::parse_new_order;
use orders_api::orders::model::{Order, OrderId, OrderStatus};
use orders_api::orders::{self, store};
use orders_api::startup::Application;

const BODY: &str = r#"{"item":"Widget","quantity":2,"price":9.99}"#;

fn main() {
    let seconds: u64 = std::env::var("BENCH_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let clients: usize = std::env::var("BENCH_CLIENTS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(4);
    let storage_ops: usize = std::env::var("BENCH_STORAGE_OPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2000);
    let sqlite_file =
        std::env::temp_dir().join(format!("orders-bench-{}.db", uuid::Uuid::new_v4().simple()));
    let url = std::env::var("BENCH_DATABASE_URL")
        .unwrap_or_else(|_| format!("sqlite://{}", sqlite_file.display()));
    let url = DatabaseUrl::parse(&url).expect("BENCH_DATABASE_URL");
    let mut settings = Settings::for_database(url);
    settings.pool_size = (clients as u32 + 2).max(4);
    db::run_migrations(&settings.database_url).expect("migrations");
    let pool = Pool::connect(&settings.database_url, &settings.pool_options()).expect("pool");
    let run = uuid::Uuid::new_v4().simple().to_string();
    println!(
        "backend: {:?}; storage: {storage_ops} sequential ops; HTTP: {clients} clients × {seconds} s per case",
        pool.backend()
    );

    // Storage level.
    let raw = time_ops(storage_ops, |i| {
        raw_insert(&pool, &format!("{run}-raw-{i}"))
    });
    let ledgered = time_ops(storage_ops, |i| {
        ledger_create(&pool, settings.ledger(), &format!("{run}-led-{i}"))
    });
    println!("\nstorage, orders per second (one transaction each)");
    println!("  bare insert                   {raw:>10.0}");
    println!(
        "  claim + insert + record       {ledgered:>10.0}   ratio to bare insert: {:.2}",
        ledgered / raw
    );

    // HTTP level.
    let token = {
        let mut pooled = pool.get().expect("connection");
        orders_api::auth::create(&mut pooled.conn(), "bench").expect("token")
    };
    let (tx, rx) = std::sync::mpsc::channel();
    let (server_settings, server_pool) = (settings.clone(), pool.clone());
    std::thread::spawn(move || {
        actix_web::rt::System::new().block_on(async move {
            let app = Application::build(&server_settings, server_pool).expect("bind");
            tx.send(app.port()).expect("port");
            app.run_until_stopped().await
        })
    });
    let base = format!("http://127.0.0.1:{}", rx.recv().expect("server started"));
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let auth = format!("Bearer {token}");
    let post = |agent: &ureq::Agent, key: &str| -> u16 {
        agent
            .post(format!("{base}/v1/orders"))
            .header("Authorization", &auth)
            .header("Idempotency-Key", key)
            .header("Content-Type", "application/json")
            .send(BODY)
            .map(|r| r.status().as_u16())
            .unwrap_or(0)
    };
    assert_eq!(post(&agent, &format!("{run}-replayed")), 201);
    let mut created = agent
        .post(format!("{base}/v1/orders"))
        .header("Authorization", &auth)
        .header("Idempotency-Key", format!("{run}-read"))
        .header("Content-Type", "application/json")
        .send(BODY)
        .expect("create");
    let location = created
        .headers()
        .get("location")
        .and_then(|v| v.to_str().ok())
        .expect("Location")
        .to_owned();
    let _ = created.body_mut().read_to_string();

    let duration = Duration::from_secs(seconds);
    let get = load(clients, duration, |agent, _| {
        agent
            .get(format!("{base}{location}"))
            .header("Authorization", &auth)
            .call()
            .map(|r| r.status().as_u16())
            .unwrap_or(0)
            == 200
    });
    let replay = load(clients, duration, |agent, _| {
        post(agent, &format!("{run}-replayed")) == 200
    });
    let create = load(clients, duration, |agent, n| {
        post(agent, &format!("{run}-http-{n}")) == 201
    });
    println!("\nHTTP, requests per second ({clients} clients)");
    println!("  GET /v1/orders/{{id}}           {get:>10.0}");
    println!(
        "  POST replay (same key)        {replay:>10.0}   ratio to GET: {:.2}",
        replay / get
    );
    println!(
        "  POST create (fresh keys)      {create:>10.0}   ratio to GET: {:.2}",
        create / get
    );

    let _ = std::fs::remove_file(&sqlite_file);
    for suffix in ["-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", sqlite_file.display()));
    }
}

fn time_ops(n: usize, mut op: impl FnMut(usize)) -> f64 {
    let started = Instant::now();
    for i in 0..n {
        op(i);
    }
    n as f64 / started.elapsed().as_secs_f64()
}

fn new_order(key: &str) -> Order {
    let new = parse_new_order(&serde_json::from_str(BODY).expect("body")).expect("valid");
    Order {
        id: OrderId::generate(),
        user_id: "bench".into(),
        item: new.item,
        quantity: new.quantity,
        price: new.price,
        status: OrderStatus::Pending,
        request_fingerprint: key.into(),
        created_at: chrono::Utc::now(),
    }
}

/// The same row the create writes, with no ledger around it.
fn raw_insert(pool: &Pool, key: &str) {
    let order = new_order(key);
    let key = key.to_owned();
    let written = pool
        .write(move |conn| {
            store::insert(
                conn,
                &store::NewRow {
                    order: &order,
                    idempotency_key: &key,
                },
            )
        })
        .expect("writer")
        .expect("insert");
    assert!(written);
}

/// What `POST /v1/orders` does below HTTP.
fn ledger_create(pool: &Pool, ledger: Ledger, key: &str) {
    let key = IdempotencyKey::parse(key.as_bytes()).expect("key");
    let fingerprint = Fingerprint::of("POST", "/v1/orders", BODY.as_bytes(), None);
    let new = parse_new_order(&serde_json::from_str(BODY).expect("body")).expect("valid");
    let request = LedgerRequest {
        user_id: "bench",
        key: &key,
        fingerprint: &fingerprint,
    };
    let (unit_key, unit_fingerprint) = (key.clone(), fingerprint.clone());
    let outcome = ledger
        .execute(pool, request, move |tx| {
            orders::create(tx, "bench", &unit_key, &unit_fingerprint, new).map(|_| {
                Completion::Record(RecordedResponse {
                    status: 201,
                    headers: Vec::new(),
                    body: b"{}".to_vec(),
                })
            })
        })
        .expect("create");
    assert!(matches!(
        outcome,
        orders_api::idempotency::Outcome::Executed(_)
    ));
}

/// Runs `op` from `clients` threads for `duration`; successful ops per second.
fn load(clients: usize, duration: Duration, op: impl Fn(&ureq::Agent, u64) -> bool + Sync) -> f64 {
    let done = Arc::new(AtomicU64::new(0));
    let failed = AtomicU64::new(0);
    let counter = AtomicU64::new(0);
    let started = Instant::now();
    std::thread::scope(|scope| {
        for _ in 0..clients {
            scope.spawn(|| {
                let agent: ureq::Agent = ureq::Agent::config_builder()
                    .http_status_as_error(false)
                    .build()
                    .into();
                while started.elapsed() < duration {
                    let n = counter.fetch_add(1, Ordering::Relaxed);
                    if op(&agent, n) {
                        done.fetch_add(1, Ordering::Relaxed);
                    } else {
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    let failed = failed.load(Ordering::Relaxed);
    if failed > 0 {
        eprintln!("  ({failed} requests did not answer as expected)");
    }
    done.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64()
}
