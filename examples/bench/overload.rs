//! The overload case of the benchmark: ten times the write
//! admission bound in connections, every one sending creates with keys of
//! its own as fast as it is answered, against the server's default
//! settings. Reported: the admitted creates' p99 (against the same server
//! unloaded), how fast a shed create is answered, the `503` share, reads'
//! p99 meanwhile, the server's peak RSS — and an exact count: every `201`'s
//! key made exactly one order, no shed key left an order or a ledger entry.
//!
//! A module of its own so that any benchmark can run it: [`run`] takes the
//! server binary and a migrated database with a token, and returns the
//! figures; `examples/overload.rs` runs it alone.

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use diesel::prelude::*;
use diesel::sql_types::Text;

use crate::rss::peak_rss_kb;

const BODY: &str = r#"{"item":"Widget","quantity":2,"price":9.99}"#;
/// Connections of the unloaded measurement.
const UNLOADED_CONNECTIONS: usize = 4;
/// Readers running beside the overload.
const READERS: usize = 4;

/// What one run measured.
#[derive(Debug, Default)]
pub struct Overload {
    pub bound: usize,
    pub connections: usize,
    pub seconds: u64,
    pub unloaded_p99_ms: f64,
    pub unloaded_count: usize,
    pub created: usize,
    pub admitted_p50_ms: f64,
    pub admitted_p99_ms: f64,
    pub shed: usize,
    pub shed_p50_ms: f64,
    pub shed_p99_ms: f64,
    /// Answers other than 201 and 503, and requests with no answer.
    pub other: usize,
    pub reads: usize,
    pub read_p99_ms: f64,
    pub peak_rss_kb: u64,
    /// Orders stored with a key answered 201 / 201s answered.
    pub stored_for_201: usize,
    /// 201 keys with other than exactly one order.
    pub created_not_once: usize,
    /// Shed keys that have an order or a ledger entry.
    pub shed_keys_used: usize,
}

/// Where the run's data is, to count it afterwards.
pub enum Store {
    Sqlite(String),
    Postgres(String),
}

impl Store {
    fn keys(&self, sql: &str) -> Vec<String> {
        #[derive(QueryableByName)]
        struct Key {
            #[diesel(sql_type = Text)]
            k: String,
        }
        let rows: Vec<Key> = match self {
            Store::Sqlite(url) => {
                let path = url.trim_start_matches("sqlite://");
                let mut c = SqliteConnection::establish(path).expect("open the database");
                diesel::sql_query(sql).load(&mut c).expect("read keys")
            }
            Store::Postgres(url) => {
                let mut c = PgConnection::establish(url).expect("connect");
                diesel::sql_query(sql).load(&mut c).expect("read keys")
            }
        };
        rows.into_iter().map(|r| r.k).collect()
    }
}

struct Sample {
    status: u16,
    micros: u64,
    key: String,
}

/// Creates from `connections` clients for `seconds`, each a fresh key
/// (`prefix` + client + sequence); every answer with its latency.
fn load(
    base: &str,
    token: &str,
    connections: usize,
    seconds: u64,
    prefix: &str,
) -> Vec<Vec<Sample>> {
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..connections)
        .map(|i| {
            let (base, token, prefix) = (base.to_owned(), token.to_owned(), prefix.to_owned());
            let stop = Arc::clone(&stop);
            std::thread::Builder::new()
                .stack_size(256 * 1024)
                .spawn(move || {
                    let agent = agent();
                    let mut samples = Vec::new();
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let key = format!("{prefix}-{i}-{n}");
                        n += 1;
                        let started = Instant::now();
                        let status = agent
                            .post(&format!("{base}/v1/orders"))
                            .header("Authorization", &format!("Bearer {token}"))
                            .header("Idempotency-Key", &key)
                            .header("Content-Type", "application/json")
                            .send(BODY)
                            .map(|mut r| {
                                let _ = r.body_mut().read_to_vec();
                                r.status().as_u16()
                            })
                            .unwrap_or(0);
                        samples.push(Sample {
                            status,
                            micros: started.elapsed().as_micros() as u64,
                            key,
                        });
                    }
                    samples
                })
                .expect("start a client")
        })
        .collect();
    std::thread::sleep(Duration::from_secs(seconds));
    stop.store(true, Ordering::Relaxed);
    clients
        .into_iter()
        .map(|c| c.join().expect("client"))
        .collect()
}

/// What the open-loop run measured.
#[derive(Debug, Default)]
pub struct OpenLoop {
    pub capacity: f64,
    pub rate: f64,
    pub seconds: u64,
    pub workers: usize,
    pub late: usize,
    pub answered_per_sec: f64,
    pub figures: Overload,
}

/// The open-loop overload: the unloaded p99 (4 connections), the capacity
/// (creates per second answered to 32 connections, closed loop), then
/// creates offered at `factor` × that capacity for `seconds` over `workers`
/// connections, paced (see [`crate::paced`], which sends all three), and
/// the same exact count as [`run`].
pub fn run_open(
    server: &Child,
    base: &str,
    token: &str,
    store: &Store,
    factor: f64,
    workers: usize,
    seconds: u64,
) -> OpenLoop {
    let target = crate::paced::Target::new(base, token, BODY);
    let unloaded: Vec<u64> =
        crate::paced::closed(&target, UNLOADED_CONNECTIONS, seconds.min(5), "calm")
            .into_iter()
            .filter(|s| s.status == 201)
            .map(|s| s.micros)
            .collect();
    let measured = 5;
    let capacity = crate::paced::closed(&target, 32, measured, "capacity")
        .into_iter()
        .filter(|s| s.status == 201)
        .count() as f64
        / measured as f64;
    let rate = capacity * factor;
    let began = Instant::now();
    let (samples, late) = crate::paced::paced(&target, rate, workers, seconds, "open");
    let answered_per_sec = samples.len() as f64 / began.elapsed().as_secs_f64();
    let created: Vec<_> = samples.iter().filter(|s| s.status == 201).collect();
    let shed: Vec<_> = samples.iter().filter(|s| s.status == 503).collect();
    let mut orders: HashMap<String, usize> = HashMap::new();
    for key in store.keys("SELECT idempotency_key AS k FROM orders") {
        *orders.entry(key).or_default() += 1;
    }
    let ledger: std::collections::HashSet<String> = store
        .keys("SELECT idempotency_key AS k FROM idempotency_ledger")
        .into_iter()
        .collect();
    let figures = Overload {
        seconds,
        unloaded_count: unloaded.len(),
        unloaded_p99_ms: percentile_ms(unloaded, 0.99),
        created: created.len(),
        admitted_p50_ms: percentile_ms(created.iter().map(|s| s.micros).collect(), 0.50),
        admitted_p99_ms: percentile_ms(created.iter().map(|s| s.micros).collect(), 0.99),
        shed: shed.len(),
        shed_p50_ms: percentile_ms(shed.iter().map(|s| s.micros).collect(), 0.50),
        shed_p99_ms: percentile_ms(shed.iter().map(|s| s.micros).collect(), 0.99),
        other: samples.len() - created.len() - shed.len(),
        peak_rss_kb: peak_rss_kb(server.id()),
        stored_for_201: created
            .iter()
            .filter(|s| orders.contains_key(&s.key))
            .count(),
        created_not_once: created
            .iter()
            .filter(|s| orders.get(&s.key) != Some(&1))
            .count(),
        shed_keys_used: shed
            .iter()
            .filter(|s| orders.contains_key(&s.key) || ledger.contains(&s.key))
            .count(),
        ..Overload::default()
    };
    OpenLoop {
        capacity,
        rate,
        seconds,
        workers,
        late,
        answered_per_sec,
        figures,
    }
}

impl OpenLoop {
    /// The figures as rows of a markdown table, for docs/PERFORMANCE.md.
    pub fn markdown(&self, backend: &str) -> String {
        let f = &self.figures;
        let total = f.created + f.shed + f.other;
        format!(
            "### Open-loop overload, {backend}: {:.0} creates/s offered (capacity {:.0}/s × {:.1}), {} s, {} connections of one paced sender\n\n\
             | figure | value |\n|---|---:|\n\
             | unloaded create p99 ({UNLOADED_CONNECTIONS} connections, {} creates) | {:.2} ms |\n\
             | answered per second | {:.0} |\n\
             | sent more than 1 ms after their time (every connection busy, or the sender behind) | {} of {total} |\n\
             | admitted creates (201) | {} |\n\
             | admitted p50 / p99, from the time each was due | {:.2} / {:.2} ms |\n\
             | admitted p99 ÷ unloaded p99 | {:.1} × |\n\
             | shed creates (503) | {} |\n\
             | shed p50 / p99, from the time each was due | {:.2} / {:.2} ms |\n\
             | other answers or no answer | {} |\n\
             | server peak RSS | {:.1} MiB |\n\
             | 201 keys stored exactly once | {} of {} ({} not) |\n\
             | shed keys with an order or a ledger entry | {} |\n",
            self.rate,
            self.capacity,
            self.rate / self.capacity.max(1.0),
            self.seconds,
            self.workers,
            f.unloaded_count,
            f.unloaded_p99_ms,
            self.answered_per_sec,
            self.late,
            f.created,
            f.admitted_p50_ms,
            f.admitted_p99_ms,
            if f.unloaded_p99_ms > 0.0 {
                f.admitted_p99_ms / f.unloaded_p99_ms
            } else {
                0.0
            },
            f.shed,
            f.shed_p50_ms,
            f.shed_p99_ms,
            f.other,
            f.peak_rss_kb as f64 / 1024.0,
            f.stored_for_201,
            f.created,
            f.created_not_once,
            f.shed_keys_used,
        )
    }
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(30)))
        .build()
        .into()
}

fn percentile_ms(mut micros: Vec<u64>, p: f64) -> f64 {
    if micros.is_empty() {
        return 0.0;
    }
    micros.sort_unstable();
    let rank = ((micros.len() as f64) * p).ceil() as usize;
    micros[rank.clamp(1, micros.len()) - 1] as f64 / 1000.0
}

/// Runs the case against `server` (serving `store` with the default
/// settings, admission bound `bound`); `token` may create orders.
pub fn run(
    server: &Child,
    base: &str,
    token: &str,
    store: &Store,
    bound: usize,
    seconds: u64,
) -> Overload {
    let connections = bound * 10;
    let unloaded: Vec<Sample> = load(base, token, UNLOADED_CONNECTIONS, seconds.min(5), "calm")
        .into_iter()
        .flatten()
        .collect();
    let unloaded_ok: Vec<u64> = unloaded
        .iter()
        .filter(|s| s.status == 201)
        .map(|s| s.micros)
        .collect();

    // One order to read meanwhile.
    let probe = agent()
        .post(&format!("{base}/v1/orders"))
        .header("Authorization", &format!("Bearer {token}"))
        .header("Idempotency-Key", "overload-read-probe")
        .header("Content-Type", "application/json")
        .send(BODY)
        .expect("create the probe order");
    let location = probe
        .headers()
        .get("Location")
        .and_then(|v| v.to_str().ok())
        .expect("Location")
        .to_owned();
    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..READERS)
        .map(|_| {
            let (url, token, stop) = (
                format!("{base}{location}"),
                token.to_owned(),
                Arc::clone(&stop),
            );
            std::thread::spawn(move || {
                let agent = agent();
                let mut micros = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let started = Instant::now();
                    let ok = agent
                        .get(&url)
                        .header("Authorization", &format!("Bearer {token}"))
                        .call()
                        .is_ok_and(|r| r.status() == 200);
                    if ok {
                        micros.push(started.elapsed().as_micros() as u64);
                    }
                }
                micros
            })
        })
        .collect();
    let samples: Vec<Sample> = load(base, token, connections, seconds, "over")
        .into_iter()
        .flatten()
        .collect();
    stop.store(true, Ordering::Relaxed);
    let reads: Vec<u64> = readers
        .into_iter()
        .flat_map(|r| r.join().expect("reader"))
        .collect();

    let created: Vec<&Sample> = samples.iter().filter(|s| s.status == 201).collect();
    let shed: Vec<&Sample> = samples.iter().filter(|s| s.status == 503).collect();
    let mut orders: HashMap<String, usize> = HashMap::new();
    for key in store.keys("SELECT idempotency_key AS k FROM orders") {
        *orders.entry(key).or_default() += 1;
    }
    let ledger: std::collections::HashSet<String> = store
        .keys("SELECT idempotency_key AS k FROM idempotency_ledger")
        .into_iter()
        .collect();
    Overload {
        bound,
        connections,
        seconds,
        unloaded_count: unloaded_ok.len(),
        unloaded_p99_ms: percentile_ms(unloaded_ok, 0.99),
        created: created.len(),
        admitted_p50_ms: percentile_ms(created.iter().map(|s| s.micros).collect(), 0.50),
        admitted_p99_ms: percentile_ms(created.iter().map(|s| s.micros).collect(), 0.99),
        shed: shed.len(),
        shed_p50_ms: percentile_ms(shed.iter().map(|s| s.micros).collect(), 0.50),
        shed_p99_ms: percentile_ms(shed.iter().map(|s| s.micros).collect(), 0.99),
        other: samples.len() - created.len() - shed.len(),
        reads: reads.len(),
        read_p99_ms: percentile_ms(reads, 0.99),
        peak_rss_kb: peak_rss_kb(server.id()),
        stored_for_201: created
            .iter()
            .filter(|s| orders.contains_key(&s.key))
            .count(),
        created_not_once: created
            .iter()
            .filter(|s| orders.get(&s.key) != Some(&1))
            .count(),
        shed_keys_used: shed
            .iter()
            .filter(|s| orders.contains_key(&s.key) || ledger.contains(&s.key))
            .count(),
    }
}

impl Overload {
    /// The figures as rows of a markdown table, for docs/PERFORMANCE.md.
    pub fn markdown(&self, backend: &str) -> String {
        let total = self.created + self.shed + self.other;
        let share = if total == 0 {
            0.0
        } else {
            100.0 * self.shed as f64 / total as f64
        };
        format!(
            "### Overload, {backend}: {} connections (10 × WRITE_ADMISSION = {}), {} s\n\n\
             | figure | value |\n|---|---:|\n\
             | unloaded create p99 ({UNLOADED_CONNECTIONS} connections, {} creates) | {:.2} ms |\n\
             | admitted creates (201) | {} |\n\
             | admitted p50 / p99 | {:.2} / {:.2} ms |\n\
             | admitted p99 ÷ unloaded p99 | {:.1} × |\n\
             | shed creates (503) | {} ({share:.1} % of {total}) |\n\
             | shed answered p50 / p99 | {:.2} / {:.2} ms |\n\
             | other answers or no answer | {} |\n\
             | reads meanwhile ({READERS} clients): count, p99 | {}, {:.2} ms |\n\
             | server peak RSS | {:.1} MiB |\n\
             | 201 keys stored exactly once | {} of {} ({} not) |\n\
             | shed keys with an order or a ledger entry | {} |\n",
            self.connections,
            self.bound,
            self.seconds,
            self.unloaded_count,
            self.unloaded_p99_ms,
            self.created,
            self.admitted_p50_ms,
            self.admitted_p99_ms,
            if self.unloaded_p99_ms > 0.0 {
                self.admitted_p99_ms / self.unloaded_p99_ms
            } else {
                0.0
            },
            self.shed,
            self.shed_p50_ms,
            self.shed_p99_ms,
            self.other,
            self.reads,
            self.read_p99_ms,
            self.peak_rss_kb as f64 / 1024.0,
            self.stored_for_201,
            self.created,
            self.created_not_once,
            self.shed_keys_used,
        )
    }
}

/// Starts `bin serve` on a free port against `database_url` with the
/// default settings; the child and its base URL, once `/readyz` answers.
pub fn start_server(bin: &std::path::Path, database_url: &str) -> (Child, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port");
    let child = Command::new(bin)
        .arg("serve")
        .env("DATABASE_URL", database_url)
        .env("BIND_ADDR", format!("127.0.0.1:{port}"))
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start orders-api");
    let base = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while ureq::get(&format!("{base}/readyz")).call().is_err() {
        assert!(Instant::now() < deadline, "the server never answered");
        std::thread::sleep(Duration::from_millis(50));
    }
    (child, base)
}
