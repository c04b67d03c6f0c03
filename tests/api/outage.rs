//! A database outage, on a private PostgreSQL cluster that the test stops and
//! starts again (the shared one is never touched): the service answers `503
//! SERVICE_UNAVAILABLE` promptly instead of a 500 or a hang, stays alive,
//! becomes ready again by itself, and retries then give one order per key.

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use diesel::{Connection, PgConnection, RunQueryDsl};
use orders_api::db::DatabaseUrl;

use crate::helpers::*;
use crate::net::Client;
use crate::process::{
    ServerProcess, create_token, ledger_count, order_count, order_id_for_key, prepare,
};

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/pg-cluster.sh");
/// No request may take longer than this, outage or not.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(10);
const LOAD_THREADS: usize = 4;
const MAX_ATTEMPTS: usize = 20;

/// A PostgreSQL cluster of this test's own, stopped and removed when dropped.
pub(crate) struct PrivateCluster {
    dir: PathBuf,
    pub(crate) admin_url: String,
    /// `PG_SERVER_OPTIONS` for `scripts/pg-cluster.sh`.
    server_options: String,
}

impl PrivateCluster {
    pub(crate) fn start() -> Self {
        Self::start_with_server_options("")
    }

    /// A cluster whose server also gets `options` (`-c name=value …`).
    pub(crate) fn start_with_server_options(options: &str) -> Self {
        let dir =
            std::env::temp_dir().join(format!("orders-outage-{}", uuid::Uuid::new_v4().simple()));
        let mut cluster = Self {
            dir,
            admin_url: String::new(),
            server_options: options.to_owned(),
        };
        cluster.admin_url = cluster.run("start");
        cluster
    }

    fn stop(&self) {
        self.run("stop");
    }

    /// Starts the stopped cluster again: same data, same port, same URL.
    fn restart(&self) {
        let url = self.run("start");
        assert_eq!(url, self.admin_url, "the cluster came back elsewhere");
    }

    fn run(&self, command: &str) -> String {
        let output = Command::new(SCRIPT)
            .arg(command)
            .arg(&self.dir)
            .env("PG_SERVER_OPTIONS", &self.server_options)
            .output()
            .expect("run scripts/pg-cluster.sh");
        assert!(
            output.status.success(),
            "pg-cluster.sh {command} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    }
}

impl Drop for PrivateCluster {
    fn drop(&mut self) {
        let _ = Command::new(SCRIPT).arg("stop").arg(&self.dir).output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The outage answer: a 503 problem that says nothing about the cause.
fn assert_unavailable(r: &TestResponse) {
    assert_eq!(r.status, 503, "{}", r.body);
    assert_eq!(r.header("Content-Type"), Some("application/problem+json"));
    assert_eq!(r.error_code(), "SERVICE_UNAVAILABLE");
    assert!(
        r.header("Retry-After")
            .is_some_and(|v| v.parse::<u32>().is_ok()),
        "{:?}",
        r.headers
    );
    let body = r.body.to_ascii_lowercase();
    for internal in ["postgres", "connection", "sql", "127.0.0.1"] {
        assert!(
            !body.contains(internal),
            "the 503 leaks internals: {}",
            r.body
        );
    }
}

#[derive(Debug)]
struct KeyRecord {
    key: String,
    body: String,
    /// The order id, when a `201` reached the client.
    created: Option<String>,
}

crate::postgres_only! {
    fn a_database_outage_answers_503_promptly_and_the_service_recovers_by_itself() {
        let cluster = PrivateCluster::start();
        let mut admin =
            PgConnection::establish(&cluster.admin_url).expect("connect to the private cluster");
        diesel::sql_query("CREATE DATABASE orders_outage")
            .execute(&mut admin)
            .expect("create database");
        drop(admin);
        let url = DatabaseUrl::parse(&with_database(&cluster.admin_url, "orders_outage")).expect("url");
        let pool = prepare(&url);
        let token = create_token(&pool, "alice");
        let mut server = ServerProcess::start(&url, &["--db-timeout-secs", "2"]);
        let client = Client::new(&server.address(), &token, CLIENT_TIMEOUT);

        // Load with distinct keys; the cluster stops under it.
        let created = AtomicUsize::new(0);
        let since_stop = AtomicUsize::new(0);
        let (stopping, done) = (AtomicBool::new(false), AtomicBool::new(false));
        let mut records: Vec<KeyRecord> = std::thread::scope(|s| {
            let threads: Vec<_> = (0..LOAD_THREADS)
                .map(|t| {
                    let (client, created, since_stop, stopping, done) =
                        (&client, &created, &since_stop, &stopping, &done);
                    s.spawn(move || {
                        let mut records = Vec::new();
                        for n in 0..1_000 {
                            if done.load(Ordering::SeqCst) {
                                break;
                            }
                            let key = format!("outage-load-{t}-{n}");
                            let body = order_body(&format!("Item {t}-{n}"), 1, "2.50");
                            let r = client.post_order(&key, &body).unwrap_or_else(|e| {
                                panic!("{key}: no answer within {CLIENT_TIMEOUT:?}: {e}")
                            });
                            let during_outage = stopping.load(Ordering::SeqCst);
                            assert!(
                                during_outage || r.status == 201,
                                "{key} before the outage: {}",
                                r.body
                            );
                            let id = match r.status {
                                201 => {
                                    created.fetch_add(1, Ordering::SeqCst);
                                    Some(r.json()["id"].as_str().expect("order id").to_owned())
                                }
                                _ => {
                                    assert_unavailable(&r);
                                    None
                                }
                            };
                            if during_outage {
                                since_stop.fetch_add(1, Ordering::SeqCst);
                            }
                            records.push(KeyRecord {
                                key,
                                body,
                                created: id,
                            });
                        }
                        records
                    })
                })
                .collect();

            let deadline = Instant::now() + Duration::from_secs(30);
            while created.load(Ordering::SeqCst) < 20 {
                assert!(Instant::now() < deadline, "the load never got going");
                std::thread::sleep(Duration::from_millis(5));
            }
            stopping.store(true, Ordering::SeqCst);
            cluster.stop();
            let deadline = Instant::now() + Duration::from_secs(60);
            while since_stop.load(Ordering::SeqCst) < 2 * LOAD_THREADS {
                assert!(
                    Instant::now() < deadline,
                    "the load stopped getting answers"
                );
                std::thread::sleep(Duration::from_millis(5));
            }
            done.store(true, Ordering::SeqCst);
            threads
                .into_iter()
                .flat_map(|t| t.join().expect("load thread"))
                .collect()
        });

        // The database is down: every request is a prompt 503, and the process lives.
        for n in 0..3 {
            let key = format!("outage-down-{n}");
            let body = order_body("Down", 1, "1.00");
            let r = client
                .post_order(&key, &body)
                .expect("an answer during the outage");
            assert_unavailable(&r);
            records.push(KeyRecord {
                key,
                body,
                created: None,
            });
        }
        assert_unavailable(
            &client
                .call("GET", "/v1/orders", None, None)
                .expect("an answer"),
        );
        assert_unavailable(&client.get("/readyz").expect("an answer from /readyz"));
        assert_eq!(
            client
                .get("/healthz")
                .expect("an answer from /healthz")
                .status,
            200
        );
        assert!(
            server.is_alive(),
            "the outage killed the process:\n{}",
            server.log_tail()
        );

        // The database is back: readiness returns by itself, without a restart.
        cluster.restart();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ready = client.get("/readyz").expect("an answer from /readyz");
            if ready.status == 200 {
                break;
            }
            assert_unavailable(&ready);
            assert!(Instant::now() < deadline, "/readyz never returned to 200");
            std::thread::sleep(Duration::from_millis(200));
        }

        // The test's own pool lost its connections in the outage too.
        drop(pool);
        let pool = prepare(&url);

        // Every key, retried with its own body, ends with exactly one order.
        for record in &records {
            let answer = (1..=MAX_ATTEMPTS)
                .find_map(|_| {
                    let r = client
                        .post_order(&record.key, &record.body)
                        .expect("an answer");
                    if r.status == 503 {
                        assert_unavailable(&r);
                        std::thread::sleep(Duration::from_millis(250));
                        return None;
                    }
                    Some(r)
                })
                .unwrap_or_else(|| {
                    panic!(
                        "{} still unavailable after {MAX_ATTEMPTS} attempts",
                        record.key
                    )
                });
            let id = answer.json()["id"].as_str().expect("order id").to_owned();
            match &record.created {
                Some(before) => {
                    assert_eq!(answer.status, 200, "{}: {}", record.key, answer.body);
                    assert_eq!(answer.header("Idempotent-Replayed"), Some("true"));
                    assert_eq!(&id, before, "{}: an answered order was lost", record.key);
                }
                // Refused before it ran (201 now), or committed as the database went
                // down with its answer lost (a replay now).
                None => assert!(
                    answer.status == 201 || answer.status == 200,
                    "{}: {}",
                    record.key,
                    answer.body
                ),
            }
            assert_eq!(
                order_id_for_key(&pool, "alice", &record.key),
                Some(id),
                "{}",
                record.key
            );
        }
        let keys = records.len() as i64;
        eprintln!(
            "{keys} keys: {} created before the outage, {} refused with 503",
            records.iter().filter(|r| r.created.is_some()).count(),
            records.iter().filter(|r| r.created.is_none()).count()
        );
        assert_eq!(order_count(&pool), keys, "exactly one order per key");
        assert_eq!(ledger_count(&pool), keys);
        assert!(server.is_alive());
        drop(server);
    }
}
