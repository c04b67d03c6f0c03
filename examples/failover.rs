//! The failover test: the service on a pg_auto_failover formation
//! (`scripts/pg-ha.sh`), retrying clients, and three failovers — the
//! primary's node killed, the killed node rejoined and the other primary
//! killed, then a planned switchover. `scripts/failover-test.sh` builds the
//! binary and this example, starts the formation and runs it; CI runs that.
//!
//! Each of `FAILOVER_CLIENTS` (8) clients creates orders with keys of its own
//! and retries the same key, with the same body, on `503` (after
//! `Retry-After`, at most a second), on a `408` (the HTTP layer did not read
//! the request's head in time: it never reached the service) and on a lost
//! connection, until a `2xx`. Each failover starts only from a primary that
//! waits for a streaming synchronous standby (`pg-ha.sh wait-synchronous`),
//! so that every order acknowledged before it is on both nodes. After each
//! round it asserts, against the database:
//!
//! - every acknowledged order is there, under its key, with the id the client
//!   was told (none lost);
//! - no order twice: the orders stored are exactly the keys acknowledged,
//!   and every key replays its id;
//! - only `2xx` and `503` with `Retry-After` were answered by the service
//!   (never a `500`);
//! - the two nodes were never both writable without a synchronous standby
//!   (each node's role is polled every 100 ms, from before the rejoin; both
//!   accepting sessions while one waits for a standby is reported, not
//!   failed: that one cannot acknowledge);
//! - writes succeed again by themselves within [`RECOVERY_BOUND`] of the
//!   new primary's promotion, without restarting the service.
//!
//! and prints the round's acknowledged, lost and duplicated orders, the
//! outage window (the longest time no client got a `2xx`), the promotion
//! time (event to the new primary accepting a read-write session), the
//! `503`s answered and the `408`s retried. Loopback only; every wait has a
//! deadline.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use diesel::prelude::*;
use diesel::sql_types::Text;
use orders_api::db::{self, DatabaseUrl, PoolOptions};

const USER: &str = "failover";
/// Writes must succeed again within this long after the new primary is
/// promoted: the pool's connection timeout (a reconnect names both hosts,
/// `connect_timeout=2` each) plus a client's retry pause, with room.
const RECOVERY_BOUND: Duration = Duration::from_secs(15);
/// The longest a failover may take from the event to the new primary.
const PROMOTION_BOUND: Duration = Duration::from_secs(60);
/// No single request may take longer than this, outage or not.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(30);
/// The pause between two orders of one client (about 20 orders/s each), so
/// that the formation's health checks are not starved on a small machine.
const PACE: Duration = Duration::from_millis(50);

fn main() {
    let bin = PathBuf::from(env("ORDERS_API_BIN"));
    let ha_dir = PathBuf::from(env("PG_HA_DIR"));
    let script = PathBuf::from(env("PG_HA_SCRIPT"));
    let url = DatabaseUrl::parse(&env("PG_HA_URL")).expect("PG_HA_URL is a postgres:// URL");
    let clients: usize = std::env::var("FAILOVER_CLIENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8);
    let ha = Formation {
        script,
        dir: ha_dir,
    };

    db::run_migrations(&url).expect("migrations");
    let token = {
        let pool = orders_api::db::connect(
            &url,
            &PoolOptions {
                max_size: 1,
                connection_timeout: Duration::from_secs(10),
                lease: Duration::from_secs(30),
                write_queue: 16,
                shown: "the test database".into(),
            },
        )
        .expect("pool");
        let mut pooled = pool.get().expect("connection");
        orders_api::auth::create(&mut pooled.conn(), USER).expect("token")
    };
    let server = Server::start(&bin, &url, &ha.dir.join("orders-api.log"));
    println!(
        "failover: the service on {url} at {}, {clients} clients",
        server.base
    );

    let mut acknowledged: HashMap<String, Ack> = HashMap::new();
    let rounds = [
        Event::KillPrimary,
        Event::RejoinThenKillPrimary,
        Event::RejoinThenSwitchover,
    ];
    let mut failed = false;
    for (n, event) in rounds.into_iter().enumerate() {
        let round = run_round(&ha, &server.base, &token, clients, event);
        for ack in &round.acks {
            acknowledged.insert(ack.key.clone(), ack.clone());
        }
        let check = check(&url, &server.base, &token, &acknowledged);
        let recovered_in = round.first_ack_after_promotion;
        println!(
            "round {} ({}): acknowledged {} (total {}), lost {}, duplicated {}, outage {:.1} s, \
             promotion {:.1} s, writes back {:.1} s after promotion, 503s {}, 408s (not read, \
             retried) {}, other answers {}",
            n + 1,
            event.describe(),
            round.acks.len(),
            acknowledged.len(),
            check.lost,
            check.duplicated,
            round.outage.as_secs_f64(),
            round.promotion.as_secs_f64(),
            recovered_in.map_or(f64::NAN, |d| d.as_secs_f64()),
            round.unavailable,
            round.not_read,
            round.unexpected.len(),
        );
        let mut problems = Vec::new();
        if check.lost > 0 || check.duplicated > 0 || !check.mismatched.is_empty() {
            problems.push(format!(
                "orders wrong (read on port {}): lost {}, duplicated {}, {} mismatched, e.g. {:?}",
                check.checked_on,
                check.lost,
                check.duplicated,
                check.mismatched.len(),
                check.mismatched.iter().take(3).collect::<Vec<_>>()
            ));
        }
        if !round.split_brain.is_empty() {
            problems.push(format!(
                "both nodes could acknowledge writes alone at once: {:?}",
                round.split_brain
            ));
        }
        // Not a failure by itself: an old primary whose keeper is slow to
        // stop it still accepts sessions, but its commits wait for the
        // standby that stopped streaming before it was promoted.
        if !round.two_writable.is_empty() {
            println!(
                "round {}: both nodes accepted read-write sessions: {:?}",
                n + 1,
                round.two_writable
            );
        }
        if !round.unexpected.is_empty() {
            problems.push(format!("unexpected answers: {:?}", round.unexpected));
        }
        if round.stuck > 0 {
            problems.push(format!("{} keys never acknowledged", round.stuck));
        }
        match recovered_in {
            Some(d) if d <= RECOVERY_BOUND => {}
            other => problems.push(format!(
                "writes did not succeed again within {RECOVERY_BOUND:?} of the promotion: {other:?}"
            )),
        }
        for problem in &problems {
            eprintln!("round {}: FAILED: {problem}", n + 1);
        }
        if !problems.is_empty() {
            for node in ["node1", "node2"] {
                let url = ha
                    .node_url(node)
                    .replace("target_session_attrs=read-write&", "");
                eprintln!(
                    "round {}: {node} holds {}",
                    n + 1,
                    orders_on(&url, &check.missing)
                );
            }
        }
        if !problems.is_empty() || std::env::var_os("FAILOVER_TIMELINE").is_some() {
            eprintln!(
                "round {}: the nodes, relative to the event:\n{}",
                n + 1,
                round.timeline
            );
        }
        failed |= !problems.is_empty();
    }
    drop(server);
    if failed {
        std::process::exit(1);
    }
    println!("failover: passed");
}

fn env(name: &str) -> String {
    std::env::var(name)
        .unwrap_or_else(|_| panic!("{name}: run this through scripts/failover-test.sh"))
}

#[derive(Clone, Copy, Debug)]
enum Event {
    KillPrimary,
    RejoinThenKillPrimary,
    RejoinThenSwitchover,
}

impl Event {
    fn describe(self) -> &'static str {
        match self {
            Event::KillPrimary => "primary's node killed",
            Event::RejoinThenKillPrimary => "killed node rejoined, the other primary killed",
            Event::RejoinThenSwitchover => "killed node rejoined, planned switchover",
        }
    }
}

/// `scripts/pg-ha.sh` on one formation directory.
struct Formation {
    script: PathBuf,
    dir: PathBuf,
}

impl Formation {
    fn run(&self, command: &str) -> String {
        let output = Command::new(&self.script)
            .arg(command)
            .arg(&self.dir)
            .stderr(Stdio::inherit())
            .output()
            .expect("run scripts/pg-ha.sh");
        assert!(output.status.success(), "pg-ha.sh {command} failed");
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    }

    /// A URL that reaches `node` only, and only while it accepts writes.
    fn node_url(&self, node: &str) -> String {
        let port = std::fs::read_to_string(self.dir.join(format!("{node}.port")))
            .expect("the node's port file");
        format!(
            "postgres://postgres@127.0.0.1:{}/orders?target_session_attrs=read-write&connect_timeout=1",
            port.trim()
        )
    }
}

#[derive(Clone, Debug)]
struct Ack {
    key: String,
    id: String,
    at: Instant,
}

#[derive(Default)]
struct Log {
    acks: Vec<Ack>,
    unavailable: usize,
    /// `408`s: requests whose head the HTTP layer did not read in time.
    not_read: usize,
    unexpected: Vec<String>,
    stuck: usize,
}

struct Round {
    /// Each node's role changes, relative to the event.
    timeline: String,
    acks: Vec<Ack>,
    unavailable: usize,
    not_read: usize,
    unexpected: Vec<String>,
    stuck: usize,
    /// When both nodes accepted read-write sessions at once (offsets from
    /// the event, as the watchers saw it).
    two_writable: Vec<String>,
    /// Those of them in which both could acknowledge a commit alone.
    split_brain: Vec<String>,
    outage: Duration,
    promotion: Duration,
    first_ack_after_promotion: Option<Duration>,
}

fn run_round(ha: &Formation, base: &str, token: &str, clients: usize, event: Event) -> Round {
    // Watched from before the rejoin: a killed primary coming back must
    // never be writable next to the new one.
    let watch_stop = Arc::new(AtomicBool::new(false));
    let watchers: Vec<_> = ["node1", "node2"]
        .into_iter()
        .map(|node| {
            let url = ha
                .node_url(node)
                .replace("target_session_attrs=read-write&", "");
            let stop = watch_stop.clone();
            std::thread::spawn(move || watch(node, &url, &stop))
        })
        .collect();
    if !matches!(event, Event::KillPrimary) {
        ha.run("rejoin");
    }
    ha.run("wait-healthy");
    // Every acknowledged order is on both nodes from here on: the primary
    // requires its standby again (pg_auto_failover names it in
    // synchronous_standby_names once the standby is `secondary`).
    ha.run("wait-synchronous");
    let old_primary = ha.run("primary");
    let new_primary = if old_primary == "node1" {
        "node2"
    } else {
        "node1"
    };

    let log = Arc::new(Mutex::new(Log::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = (0..clients)
        .map(|c| {
            let (log, stop) = (log.clone(), stop.clone());
            let (base, token) = (base.to_owned(), token.to_owned());
            std::thread::spawn(move || client(c, &base, &token, &stop, &log))
        })
        .collect();

    std::thread::sleep(Duration::from_secs(2));
    // Checked again just before the event, under the clients' load: the
    // failover starts from two nodes that both hold every acknowledged order.
    ha.run("wait-healthy");
    ha.run("wait-synchronous");
    let started = Instant::now();
    match event {
        Event::KillPrimary | Event::RejoinThenKillPrimary => {
            ha.run("kill-primary");
        }
        Event::RejoinThenSwitchover => {
            // `perform switchover` returns once it is done; the promotion is
            // timed independently below, so run it aside.
            let script = ha.script.clone();
            let dir = ha.dir.clone();
            std::thread::spawn(move || {
                let status = Command::new(script)
                    .arg("switchover")
                    .arg(dir)
                    .status()
                    .expect("run pg-ha.sh switchover");
                assert!(status.success(), "pg-ha.sh switchover failed");
            });
        }
    }
    let promoted = wait_for_read_write(&ha.node_url(new_primary), started);
    let promotion = promoted.duration_since(started);
    // Writes back, then a few seconds of steady writes.
    let deadline = promoted + RECOVERY_BOUND + Duration::from_secs(5);
    while Instant::now() < deadline && !log.lock().unwrap().acks.iter().any(|a| a.at > promoted) {
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_secs(3));
    stop.store(true, Ordering::SeqCst);
    for t in threads {
        t.join().expect("client thread");
    }
    watch_stop.store(true, Ordering::SeqCst);
    let mut timeline: Vec<(Instant, String)> = watchers
        .into_iter()
        .flat_map(|w| w.join().expect("watcher thread"))
        .collect();
    timeline.sort_by_key(|(at, _)| *at);
    let offset_of = |at: Instant| {
        if at >= started {
            at.duration_since(started).as_secs_f64()
        } else {
            -started.duration_since(at).as_secs_f64()
        }
    };
    let spans = two_writable(&timeline);
    let describe = |span: &TwoWritable| {
        format!(
            "{:+.2} s to {}{}",
            offset_of(span.from),
            span.until
                .map_or("the end".to_owned(), |u| format!("{:+.2} s", offset_of(u))),
            if span.both_alone {
                ", both without a synchronous standby"
            } else {
                ", one waiting for a standby not streaming from it"
            }
        )
    };
    let split_brain = spans
        .iter()
        .filter(|s| s.both_alone)
        .map(describe)
        .collect();
    let two_writable = spans.iter().map(describe).collect();
    let timeline = timeline
        .into_iter()
        .map(|(at, what)| format!("  {:+6.2} s {what}", offset_of(at)))
        .collect::<Vec<_>>()
        .join("\n");

    let log = std::mem::take(&mut *log.lock().unwrap());
    let mut times: Vec<Instant> = log.acks.iter().map(|a| a.at).collect();
    times.sort();
    let outage = times
        .windows(2)
        .map(|w| w[1].duration_since(w[0]))
        .max()
        .unwrap_or_default();
    let first_ack_after_promotion = times
        .iter()
        .find(|t| **t > promoted)
        .map(|t| t.duration_since(promoted));
    Round {
        timeline,
        acks: log.acks,
        unavailable: log.unavailable,
        not_read: log.not_read,
        unexpected: log.unexpected,
        stuck: log.stuck,
        two_writable,
        split_brain,
        outage,
        promotion,
        first_ack_after_promotion,
    }
}

/// Records every change of what `node` says it is (primary or standby,
/// read-only or not, its synchronous standbys), every 100 ms.
fn watch(node: &str, url: &str, stop: &AtomicBool) -> Vec<(Instant, String)> {
    #[derive(QueryableByName, PartialEq)]
    struct State {
        #[diesel(sql_type = Text)]
        state: String,
    }
    let mut seen = Vec::new();
    let mut last = String::new();
    // One session, opened again only when it breaks: a new one every poll
    // would fork a backend ten times a second on a small machine.
    let mut session: Option<PgConnection> = None;
    while !stop.load(Ordering::SeqCst) {
        if session.is_none() {
            session = PgConnection::establish(url).ok();
        }
        let state = session.as_mut().map(|conn| {
            diesel::sql_query(
                "SELECT CASE WHEN pg_is_in_recovery() THEN 'standby' ELSE 'primary' END \
                 || ' read_only=' || current_setting('default_transaction_read_only') \
                 || ' sync=' || quote_literal(current_setting('synchronous_standby_names')) AS state",
            )
            .get_result::<State>(conn)
        });
        let now = match state {
            Some(Ok(s)) => s.state,
            Some(Err(_)) | None => {
                session = None;
                "down".to_owned()
            }
        };
        if now != last {
            seen.push((Instant::now(), format!("{node}: {now}")));
            last = now;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    seen
}

/// A span during which both nodes accepted read-write sessions.
struct TwoWritable {
    from: Instant,
    until: Option<Instant>,
    /// Whether both named no synchronous standby at some moment of it, so
    /// that each could acknowledge a commit alone (a split brain that loses
    /// writes). Otherwise one of them waits for a standby that is not
    /// streaming from it, and cannot acknowledge.
    both_alone: bool,
}

/// The spans during which both nodes accepted read-write sessions, from the
/// watchers' timeline (each entry is `node: state`, a change of that node).
fn two_writable(timeline: &[(Instant, String)]) -> Vec<TwoWritable> {
    let mut nodes: HashMap<&str, (bool, bool)> = HashMap::new();
    let mut spans: Vec<TwoWritable> = Vec::new();
    let mut open = false;
    for (at, what) in timeline {
        let Some((node, state)) = what.split_once(": ") else {
            continue;
        };
        let writable = state.starts_with("primary read_only=off");
        let alone = state.ends_with("sync=''");
        nodes.insert(node, (writable, alone));
        let both = nodes.values().filter(|(w, _)| *w).count() > 1;
        let both_alone = both && nodes.values().all(|(w, a)| !*w || *a);
        match (both, open, spans.last_mut()) {
            (true, false, _) => {
                spans.push(TwoWritable {
                    from: *at,
                    until: None,
                    both_alone,
                });
                open = true;
            }
            (true, true, Some(span)) => span.both_alone |= both_alone,
            (false, true, Some(span)) => {
                span.until = Some(*at);
                open = false;
            }
            _ => {}
        }
    }
    spans
}

/// How many orders of the test's user one node holds (and how many of the
/// `missing` keys), and its role.
fn orders_on(url: &str, missing: &[String]) -> String {
    #[derive(QueryableByName)]
    struct Held {
        #[diesel(sql_type = Text)]
        held: String,
    }
    PgConnection::establish(url)
        .map_err(|e| e.to_string())
        .and_then(|mut conn| {
            diesel::sql_query(
                "SELECT count(*) || ' orders, ' \
                 || count(*) FILTER (WHERE idempotency_key = ANY($2)) \
                 || ' of the keys missing on the checked node; in recovery: ' \
                 || pg_is_in_recovery() AS held \
                 FROM orders WHERE user_id = $1",
            )
            .bind::<Text, _>(USER)
            .bind::<diesel::sql_types::Array<Text>, _>(missing)
            .get_result::<Held>(&mut conn)
            .map(|h| h.held)
            .map_err(|e| e.to_string())
        })
        .unwrap_or_else(|e| format!("nothing readable: {e}"))
}

/// Polls `url` until a read-write session opens there.
fn wait_for_read_write(url: &str, since: Instant) -> Instant {
    loop {
        if let Ok(mut conn) = PgConnection::establish(url)
            && diesel::sql_query("SELECT 1").execute(&mut conn).is_ok()
        {
            return Instant::now();
        }
        assert!(
            since.elapsed() < PROMOTION_BOUND,
            "no new primary within {PROMOTION_BOUND:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// One client: orders with keys of its own, each retried until a `2xx`.
fn client(c: usize, base: &str, token: &str, stop: &AtomicBool, log: &Mutex<Log>) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(CLIENT_TIMEOUT))
        .max_idle_connections(0)
        .build()
        .into();
    let mut n = 0u64;
    while !stop.load(Ordering::SeqCst) {
        n += 1;
        let key = format!("failover-{}-{c}-{n}", uuid::Uuid::new_v4().simple());
        let body = format!(r#"{{"item":"widget-{c}-{n}","quantity":1,"price":1.00}}"#);
        let give_up = Instant::now() + Duration::from_secs(90);
        loop {
            if Instant::now() > give_up {
                log.lock().unwrap().stuck += 1;
                break;
            }
            let answer = agent
                .post(&format!("{base}/v1/orders"))
                .header("Authorization", &format!("Bearer {token}"))
                .header("Idempotency-Key", &key)
                .header("Content-Type", "application/json")
                .send(body.as_str());
            match answer {
                Ok(mut response) => {
                    let status = response.status().as_u16();
                    let retry_after = response
                        .headers()
                        .get("Retry-After")
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| v.parse::<u64>().ok());
                    let text = response.body_mut().read_to_string().unwrap_or_default();
                    match (status, retry_after) {
                        (200..=299, _) => {
                            let id = serde_json::from_str::<serde_json::Value>(&text)
                                .ok()
                                .and_then(|v| v["id"].as_str().map(str::to_owned))
                                .unwrap_or_default();
                            log.lock().unwrap().acks.push(Ack {
                                key: key.clone(),
                                id,
                                at: Instant::now(),
                            });
                            break;
                        }
                        (503, Some(seconds)) => {
                            log.lock().unwrap().unavailable += 1;
                            std::thread::sleep(
                                Duration::from_secs(seconds).min(Duration::from_secs(1)),
                            );
                        }
                        // actix-http's answer when a request's head was not
                        // read within `client_request_timeout` of the
                        // connection's accept: the request never reached the
                        // service (nothing ran), so the client sends it again,
                        // as after a lost connection. Counted apart: it is the
                        // HTTP layer's, not an answer of the service's.
                        (408, _) => {
                            log.lock().unwrap().not_read += 1;
                            std::thread::sleep(Duration::from_millis(200));
                        }
                        _ => {
                            log.lock().unwrap().unexpected.push(format!(
                                "{status} (Retry-After {retry_after:?}) for {key}: {text}"
                            ));
                            std::thread::sleep(Duration::from_millis(200));
                        }
                    }
                }
                // The service itself stays up; a lost answer is retried.
                Err(_) => std::thread::sleep(Duration::from_millis(200)),
            }
        }
        std::thread::sleep(PACE);
    }
}

#[derive(Debug, Default)]
struct Check {
    /// The port of the node the orders were read on.
    checked_on: i32,
    lost: usize,
    /// The keys acknowledged but not stored there.
    missing: Vec<String>,
    duplicated: usize,
    /// Keys whose stored or replayed id is not the one acknowledged.
    mismatched: Vec<String>,
}

#[derive(QueryableByName)]
struct Stored {
    #[diesel(sql_type = Text)]
    key: String,
    #[diesel(sql_type = Text)]
    id: String,
}

/// Compares the database and the replays with what was acknowledged.
fn check(url: &DatabaseUrl, base: &str, token: &str, acks: &HashMap<String, Ack>) -> Check {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut conn = loop {
        match PgConnection::establish(url.as_str()) {
            Ok(conn) => break conn,
            Err(e) => {
                assert!(Instant::now() < deadline, "no primary to check: {e}");
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    };
    #[derive(QueryableByName)]
    struct Port {
        #[diesel(sql_type = diesel::sql_types::Integer)]
        port: i32,
    }
    let checked_on = diesel::sql_query("SELECT inet_server_port() AS port")
        .get_result::<Port>(&mut conn)
        .map_or(0, |p| p.port);
    let stored: Vec<Stored> = diesel::sql_query(
        "SELECT idempotency_key AS key, id::text AS id FROM orders WHERE user_id = $1",
    )
    .bind::<Text, _>(USER)
    .load(&mut conn)
    .expect("read the orders");
    let mut by_key: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for row in &stored {
        by_key.entry(&row.key).or_default().push(&row.id);
    }
    let mut check = Check {
        checked_on,
        duplicated: stored.len().saturating_sub(by_key.len()),
        ..Check::default()
    };
    // Rows whose key no client was told about would be orders created twice
    // under a retried key's sibling; every stored key must be acknowledged.
    check.duplicated += by_key.keys().filter(|k| !acks.contains_key(**k)).count();
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(CLIENT_TIMEOUT))
        .build()
        .into();
    for ack in acks.values() {
        match by_key.get(ack.key.as_str()) {
            None => {
                check.lost += 1;
                check.missing.push(ack.key.clone());
            }
            Some(ids) if ids != &[ack.id.as_str()] => {
                check
                    .mismatched
                    .push(format!("{} stored as {ids:?}", ack.key));
            }
            Some(_) => {}
        }
    }
    // Every key replays its id (a sample of up to 200 per check, all keys
    // over the run's checks are covered as they accumulate).
    for ack in acks.values().take(200) {
        let body = replay_body(&ack.key);
        let mut response = agent
            .post(&format!("{base}/v1/orders"))
            .header("Authorization", &format!("Bearer {token}"))
            .header("Idempotency-Key", &ack.key)
            .header("Content-Type", "application/json")
            .send(body.as_str())
            .expect("replay");
        let text = response.body_mut().read_to_string().unwrap_or_default();
        let id = serde_json::from_str::<serde_json::Value>(&text)
            .ok()
            .and_then(|v| v["id"].as_str().map(str::to_owned));
        if id.as_deref() != Some(ack.id.as_str()) {
            check
                .mismatched
                .push(format!("{} replayed {text}", ack.key));
        }
    }
    check
}

/// The body a key was created with (the key names its client and number).
fn replay_body(key: &str) -> String {
    let mut parts = key.rsplitn(3, '-');
    let n = parts.next().unwrap_or_default();
    let c = parts.next().unwrap_or_default();
    format!(r#"{{"item":"widget-{c}-{n}","quantity":1,"price":1.00}}"#)
}

/// The service as its own process, stopped when dropped.
struct Server {
    child: Child,
    base: String,
    pid_file: Option<PathBuf>,
}

impl Server {
    fn start(bin: &PathBuf, url: &DatabaseUrl, log: &PathBuf) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let log_file = File::create(log).expect("the service's log file");
        let child = Command::new(bin)
            .arg("serve")
            .env("DATABASE_URL", url.as_str())
            .env("BIND_ADDR", format!("127.0.0.1:{port}"))
            .env("RUST_LOG", "warn")
            .env("DATABASE_POOL_SIZE", "8")
            .stdout(Stdio::null())
            .stderr(log_file)
            .spawn()
            .expect("start orders-api");
        // For scripts/failover-test.sh's cleanup, should this process be
        // killed before it can stop the service itself.
        let pid_file = log.parent().map(|dir| dir.join("orders-api.pid"));
        if let Some(file) = &pid_file {
            let _ = std::fs::write(file, child.id().to_string());
        }
        let base = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(30);
        while ureq::get(&format!("{base}/readyz")).call().is_err() {
            assert!(Instant::now() < deadline, "orders-api did not become ready");
            std::thread::sleep(Duration::from_millis(100));
        }
        Self {
            child,
            base,
            pid_file,
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
        if let Some(file) = &self.pid_file {
            let _ = std::fs::remove_file(file);
        }
    }
}
