//! What a failover does to a write, each case on one PostgreSQL server
//! (the whole failover, on pg_auto_failover, is `scripts/failover-test.sh`):
//!
//! - a node that cannot write now (read-only, as a standby or a fenced
//!   primary is) and a session the server ends answer `503` with
//!   `Retry-After`, never `500`, and record nothing;
//! - a connection lost during `COMMIT` answers `503`: the outcome is
//!   unknown, and the retry with the same key replays the order when it
//!   committed;
//! - a commit waiting for a synchronous standby is waited for, however long
//!   past the lease, and acknowledged only once it completes: no timeout of
//!   the service cuts the wait short into a local-only commit answered
//!   `201`.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::time::Duration;

use diesel::{Connection, PgConnection, RunQueryDsl};
use orders_api::db::{Backend, DatabaseUrl};

use crate::helpers::*;
use crate::net::Front;
use crate::outage::PrivateCluster;
use crate::process::{order_id_for_key, pg_sessions_where, wait_for_session_where};

/// A `503` that asks for a retry.
fn assert_retry_later(r: &TestResponse) {
    assert_eq!(r.status, 503, "{}", r.body);
    assert_eq!(r.error_code(), "SERVICE_UNAVAILABLE");
    assert!(
        r.header("Retry-After")
            .is_some_and(|v| v.parse::<u32>().is_ok()),
        "{:?}",
        r.headers
    );
}

/// Ends every session of the test database but the caller's: the pool's
/// connections are gone, as after a failover.
fn end_sessions(db: &TestDb) {
    db.as_admin(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE datname = '{db}' AND pid <> pg_backend_pid()",
    );
}

crate::postgres_only! {
    fn a_write_to_a_node_that_cannot_write_now_answers_503_with_retry_after_and_records_nothing() {
        // One connection: after the ended session, every request draws the new,
        // read-only one.
        let app = TestApp::spawn_with(Backend::Postgres, |s| s.pool_size = 1);
        let body = order_body("Widget", 1, "2.50");
        app.db
            .as_admin("ALTER DATABASE {db} SET default_transaction_read_only = on");
        // The server ends the pool's session (57P01, as a shutting-down or
        // demoted primary does); the next ones are read-only (25006, as on a
        // standby or a fenced primary).
        end_sessions(&app.db);
        for _ in 0..5 {
            assert_retry_later(&app.post_order(Some("read-only"), &body));
        }
        assert_eq!(app.order_count(), 0);
        assert_eq!(app.ledger_count(), 0);

        // Writable again: the same key creates the order, once.
        app.db
            .as_admin("ALTER DATABASE {db} RESET default_transaction_read_only");
        end_sessions(&app.db);
        let created = (0..20)
            .map(|_| app.post_order(Some("read-only"), &body))
            .find(|r| r.status != 503)
            .expect("writes come back once the database is writable");
        assert_eq!(created.status, 201, "{}", created.body);
        assert_eq!(app.order_count(), 1);
    }
}

/// A TCP relay in front of PostgreSQL that, once armed, passes the next
/// message that commits on to the server — a `COMMIT`, or the
/// one-statement create, which commits by itself — and then cuts both
/// connections without relaying the server's answer: the commit happened,
/// the service cannot know it. (`proxy.rs` is an HTTP front, one request per connection; this
/// relays PostgreSQL's own protocol, so it is a different tool.)
struct CommitCutter {
    front: Front,
    armed: Arc<AtomicBool>,
}

/// The start of the one-statement create's text (the ledger's `pg/create.rs`),
/// which diesel prepares (a Parse message) before it binds and runs it.
const ONE_STATEMENT_CREATE: &[u8] = b"WITH held AS MATERIALIZED";

/// The frontend messages of `chunk` that it holds whole: type and body.
fn messages(chunk: &[u8]) -> Vec<(u8, &[u8])> {
    let mut found = Vec::new();
    let mut rest = chunk;
    while rest.len() >= 5 {
        let len = u32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]) as usize;
        if len < 4 || rest.len() < 1 + len {
            break;
        }
        found.push((rest[0], &rest[5..1 + len]));
        rest = &rest[1 + len..];
    }
    found
}

/// The first NUL-terminated string of `body`, and what follows it.
fn c_string(body: &[u8]) -> (&[u8], &[u8]) {
    let end = body.iter().position(|&b| b == 0).unwrap_or(body.len());
    (&body[..end], body.get(end + 1..).unwrap_or_default())
}

/// Follows one connection's messages: whether a chunk runs a commit — a
/// simple-protocol `COMMIT`, or a Bind of the one-statement create, which
/// commits by itself at its Sync.
#[derive(Default)]
struct CommitWatch {
    create_statement: Option<Vec<u8>>,
}

impl CommitWatch {
    fn commits(&mut self, chunk: &[u8]) -> bool {
        let mut commits = false;
        for (kind, body) in messages(chunk) {
            match kind {
                b'Q' => commits |= body == b"COMMIT\0",
                b'P' => {
                    let (name, query) = c_string(body);
                    if query.starts_with(ONE_STATEMENT_CREATE) {
                        self.create_statement = Some(name.to_vec());
                    }
                }
                b'B' => {
                    let (_portal, rest) = c_string(body);
                    let (statement, _) = c_string(rest);
                    commits |= self.create_statement.as_deref() == Some(statement);
                }
                _ => {}
            }
        }
        commits
    }
}

impl CommitCutter {
    fn start(upstream: String) -> Self {
        let armed = Arc::new(AtomicBool::new(false));
        let arm = armed.clone();
        let front = Front::start(move |client, _| {
            if let Ok(server) = TcpStream::connect(&upstream) {
                Self::relay(client, server, arm.clone());
            }
        });
        Self { front, armed }
    }

    fn relay(client: TcpStream, server: TcpStream, armed: Arc<AtomicBool>) {
        let cut = Arc::new(AtomicBool::new(false));
        let (mut from_client, mut to_server) =
            (client.try_clone().unwrap(), server.try_clone().unwrap());
        let (mut from_server, mut to_client) = (server, client);
        let cut_requested = cut.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 16 * 1024];
            let mut watch = CommitWatch::default();
            while let Ok(n) = from_client.read(&mut buf) {
                if n == 0 {
                    break;
                }
                let chunk = &buf[..n];
                if watch.commits(chunk) && armed.swap(false, Ordering::SeqCst) {
                    cut_requested.store(true, Ordering::SeqCst);
                }
                if to_server.write_all(chunk).is_err() {
                    break;
                }
            }
            let _ = to_server.shutdown(Shutdown::Both);
        });
        std::thread::spawn(move || {
            let mut buf = [0u8; 16 * 1024];
            while let Ok(n) = from_server.read(&mut buf) {
                if n == 0 {
                    break;
                }
                // The server's answer to the cut commit: never relayed.
                if cut.load(Ordering::SeqCst) {
                    break;
                }
                if to_client.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            let _ = to_client.shutdown(Shutdown::Both);
            let _ = from_server.shutdown(Shutdown::Both);
        });
    }

    /// The next commit through the relay is cut from its answer.
    fn arm(&self) {
        self.armed.store(true, Ordering::SeqCst);
    }
}

/// Where `url`'s `host:port` is in it.
pub(crate) fn authority(url: &DatabaseUrl) -> std::ops::Range<usize> {
    let raw = url.as_str();
    let start = raw.find('@').map_or("postgres://".len(), |at| at + 1);
    let end = raw[start..]
        .find('/')
        .map(|i| start + i)
        .expect("a database name after the host");
    assert!(!raw[start..end].contains(','), "one host: {raw}");
    start..end
}

/// `url` with its `host:port` replaced by `127.0.0.1:port`.
pub(crate) fn through(url: &DatabaseUrl, port: u16) -> DatabaseUrl {
    let mut raw = url.as_str().to_owned();
    raw.replace_range(authority(url), &format!("127.0.0.1:{port}"));
    DatabaseUrl::parse(&raw).expect("relayed URL")
}

crate::postgres_only! {
    fn a_connection_lost_during_commit_answers_503_and_the_retry_with_the_same_key_replays_the_order() {
        let db = TestDb::fresh(Backend::Postgres);
        let cutter = CommitCutter::start(db.url.as_str()[authority(&db.url)].to_owned());
        let relayed = through(&db.url, cutter.front.port);
        let app = TestApp::spawn_on(db, |s| s.database_url = relayed);
        let body = order_body("Widget", 3, "4.00");

        cutter.arm();
        let cut = app.post_order(Some("cut-commit"), &body);
        // The commit went through, but the service could not know it: it says
        // "retry", not "nothing happened" and not "created".
        assert_retry_later(&cut);
        assert_eq!(app.order_count(), 1, "the COMMIT reached the server");
        let stored = order_id_for_key(&app.pool, "alice", "cut-commit").expect("the order is stored");

        let retry = app.post_order(Some("cut-commit"), &body);
        assert_eq!(retry.status, 200, "{}", retry.body);
        assert_eq!(retry.header("Idempotent-Replayed"), Some("true"));
        assert_eq!(retry.json()["id"], stored.as_str());
        assert_eq!(app.order_count(), 1);
    }
}

crate::postgres_only! {
    /// The contract (a commit already under way is waited for, and no
    /// timeout of the service's turns a cancelled commit into an
    /// acknowledgement): a commit that waits for a synchronous standby is
    /// still unanswered well past the lease, still waiting, and is answered
    /// `201` once it completes — after the lease, as the contract wants.
    fn a_commit_waiting_for_a_synchronous_standby_is_waited_for_past_the_lease_and_acknowledged_only_once_it_completes() {
        // A server of this test's own, durable, whose commits will wait for a
        // synchronous standby that never connects.
        let cluster = PrivateCluster::start_with_server_options("-c synchronous_commit=on");
        let db = TestDb::fresh_postgres_on(&cluster.admin_url);
        let lease = Duration::from_secs(1);
        let app = TestApp::spawn_on(db, |s| s.lease_secs = lease.as_secs());
        // From here on every commit with synchronous_commit on waits; the guard
        // lets them go when the test ends, however it ends (dropped before the
        // app, whose database cannot be dropped while a standby is required).
        let standby = AbsentStandby::require(&cluster.admin_url);
        let (tx, rx) = mpsc::channel();
        let (address, token) = (app.address.clone(), app.token.clone());
        let body = order_body("Widget", 1, "1.00");
        let request_body = body.clone();
        std::thread::spawn(move || {
            let client = crate::net::Client::new(&address, &token, Duration::from_secs(120));
            let _ = tx.send(client.post_order("sync-wait", &request_body));
        });
        // The request's COMMIT waits for the standby ...
        wait_for_session_where(
            &app.db.url,
            "wait_event = 'SyncRep'",
            Duration::from_secs(30),
        );
        // ... and still does, unanswered, well past the lease (which bounds
        // every statement: it must not cancel the wait into a local-only
        // commit answered 201).
        std::thread::sleep(lease * 3);
        assert_eq!(
            pg_sessions_where(&app.db.url, "wait_event = 'SyncRep'"),
            1,
            "the commit stopped waiting for the standby"
        );
        assert!(
            matches!(rx.try_recv(), Err(mpsc::TryRecvError::Empty)),
            "the request was answered before the standby confirmed its commit"
        );

        // No synchronous standby any more: the commit completes, and only now
        // is it acknowledged.
        drop(standby);
        let created = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("the request was answered")
            .expect("an HTTP answer");
        assert_eq!(created.status, 201, "{}", created.body);
        assert_eq!(app.order_count(), 1);
        let replay = app.post_order(Some("sync-wait"), &body);
        assert_eq!(replay.status, 200, "{}", replay.body);
        assert_eq!(replay.json()["id"], created.json()["id"]);
    }
}

/// A synchronous standby that never connects, required while this lives:
/// every commit (with `synchronous_commit` on) waits for it.
struct AbsentStandby {
    admin_url: String,
    released: Arc<AtomicBool>,
}

impl AbsentStandby {
    /// Names the standby and returns once commits do wait for it: the
    /// setting takes effect a moment after the reload (the checkpointer
    /// publishes it), so a probe commits in the admin database until one
    /// waits.
    fn require(admin_url: &str) -> Self {
        let guard = Self {
            admin_url: admin_url.to_owned(),
            released: Arc::new(AtomicBool::new(false)),
        };
        guard.run("CREATE TABLE IF NOT EXISTS orders_test_sync_probe (x int)");
        guard.run("ALTER SYSTEM SET synchronous_standby_names = 'orders_test_absent_standby'");
        let (probe_url, released) = (admin_url.to_owned(), guard.released.clone());
        std::thread::spawn(move || {
            let mut probe = PgConnection::establish(&probe_url).expect("connect the probe");
            // Each probe commit writes a row (WAL), so it waits once the
            // standby is required; until then it returns at once.
            while !released.load(Ordering::SeqCst)
                && diesel::sql_query("INSERT INTO orders_test_sync_probe VALUES (1)")
                    .execute(&mut probe)
                    .is_ok()
            {
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        let admin = DatabaseUrl::parse(&guard.admin_url).expect("admin URL");
        wait_for_session_where(&admin, "wait_event = 'SyncRep'", Duration::from_secs(30));
        guard
    }

    fn run(&self, sql: &str) {
        let mut admin = PgConnection::establish(&self.admin_url).expect("connect as admin");
        diesel::sql_query(sql)
            .execute(&mut admin)
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
        diesel::sql_query("SELECT pg_reload_conf()")
            .execute(&mut admin)
            .expect("reload");
    }
}

impl Drop for AbsentStandby {
    fn drop(&mut self) {
        self.released.store(true, Ordering::SeqCst);
        self.run("ALTER SYSTEM RESET synchronous_standby_names");
    }
}
