//! `kill -9` under load, then a restart on the same database (CONTRACT §4, race
//! guarantee: "an order whose 201 reached the client is never lost, also
//! across a kill -9 and restart"; and "a claim whose holder died … the next
//! request with that key takes it over and runs").

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use orders_api::db::{Backend, Pool};

use crate::both_backends;
use crate::helpers::*;
use crate::net::Client;
use crate::process::{
    HeldOrderRow, ServerProcess, create_token, ledger_count, order_count, order_id_for_key,
    prepare, wait_for_no_session_where, wait_for_session_where,
};

const CLIENTS: usize = 8;
const KEYS_PER_CLIENT: usize = 40;
/// The kill comes once this many creates were answered, with the clients
/// still sending.
const KILL_AFTER_ANSWERS: usize = 60;
/// How often one key is tried after the restart before it counts as stuck.
const MAX_ATTEMPTS: usize = 20;
const CLIENT_TIMEOUT: Duration = Duration::from_secs(30);

/// What one key's first request came to before the kill.
#[derive(Debug, Clone, PartialEq, Eq)]
enum BeforeKill {
    /// `201` reached the client, with this order id.
    Created(String),
    /// Sent before the kill; the connection died without an answer.
    Cut,
    /// Never sent: the process was already dead.
    NotSent,
}

#[derive(Debug)]
struct KeyRecord {
    key: String,
    body: String,
    before_kill: BeforeKill,
}

/// A server killed under load and started again on the same database.
struct Crashed {
    records: Vec<KeyRecord>,
    client: Client,
    pool: Pool,
    server: ServerProcess,
    // Dropped last: the database outlives the server.
    _db: TestDb,
}

/// Starts the binary, sends creates with distinct keys from `CLIENTS`
/// threads, kills the process with SIGKILL while they are in flight, and
/// starts it again with `restart_args`.
fn kill_under_load(backend: Backend, restart_args: &[&str]) -> Crashed {
    let db = TestDb::fresh(backend);
    let pool = prepare(&db.url);
    let token = create_token(&pool, "alice");
    let mut server = ServerProcess::start(&db.url, &[]);
    let address = server.address();

    let answered = AtomicUsize::new(0);
    let killed = AtomicBool::new(false);
    let records: Vec<KeyRecord> = std::thread::scope(|s| {
        let clients: Vec<_> = (0..CLIENTS)
            .map(|c| {
                let (answered, killed, address, token) = (&answered, &killed, &address, &token);
                s.spawn(move || {
                    let client = Client::new(address, token, CLIENT_TIMEOUT);
                    (0..KEYS_PER_CLIENT)
                        .map(|k| {
                            let key = format!("crash-{c}-{k}");
                            let body =
                                order_body(&format!("Item {c}-{k}"), (k % 9 + 1) as i64, "1.25");
                            let before_kill = if killed.load(Ordering::SeqCst) {
                                BeforeKill::NotSent
                            } else {
                                match client.post_order(&key, &body) {
                                    Ok(r) => {
                                        assert_eq!(
                                            r.status, 201,
                                            "before the kill, {key} got {}",
                                            r.body
                                        );
                                        answered.fetch_add(1, Ordering::SeqCst);
                                        BeforeKill::Created(
                                            r.json()["id"].as_str().expect("order id").to_owned(),
                                        )
                                    }
                                    // Sent before the kill (nothing is sent after it).
                                    Err(_) => BeforeKill::Cut,
                                }
                            };
                            KeyRecord {
                                key,
                                body,
                                before_kill,
                            }
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();

        let deadline = Instant::now() + Duration::from_secs(60);
        while answered.load(Ordering::SeqCst) < KILL_AFTER_ANSWERS {
            assert!(
                Instant::now() < deadline,
                "the load never got going:\n{}",
                server.log_tail()
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        killed.store(true, Ordering::SeqCst);
        server.kill();
        clients
            .into_iter()
            .flat_map(|c| c.join().expect("client thread"))
            .collect()
    });

    let count =
        |state: fn(&BeforeKill) -> bool| records.iter().filter(|r| state(&r.before_kill)).count();
    let cut = count(|b| *b == BeforeKill::Cut);
    eprintln!(
        "before the kill: {} created, {cut} cut in flight, {} never sent",
        count(|b| matches!(b, BeforeKill::Created(_))),
        count(|b| *b == BeforeKill::NotSent),
    );
    assert!(
        cut >= 1,
        "the kill must catch requests in flight for this test to mean anything"
    );

    server.restart(restart_args);
    let client = Client::new(&server.address(), &token, CLIENT_TIMEOUT);
    Crashed {
        records,
        client,
        pool,
        server,
        _db: db,
    }
}

/// The final answer to one key and how many attempts it took. `409
/// IDEMPOTENCY_IN_PROGRESS`, `503` and transport errors are retried (a
/// bounded number of times); anything else is the answer.
fn retry_until_answered(crashed: &Crashed, record: &KeyRecord) -> (TestResponse, usize) {
    for attempt in 1..=MAX_ATTEMPTS {
        match crashed.client.post_order(&record.key, &record.body) {
            Ok(r) if r.status == 409 && r.error_code() == "IDEMPOTENCY_IN_PROGRESS" => {}
            Ok(r) if r.status == 503 => {}
            Ok(r) => return (r, attempt),
            Err(e) => eprintln!("{}: attempt {attempt} failed: {e}", record.key),
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    panic!(
        "{} is stuck: no answer after {MAX_ATTEMPTS} attempts",
        record.key
    );
}

/// Every key ends with exactly one order, the one its answer names; a key
/// whose `201` reached the client before the kill replays that same order.
fn assert_one_order_per_key(crashed: &Crashed, answers: &[TestResponse]) {
    for (record, answer) in crashed.records.iter().zip(answers) {
        let id = answer.json()["id"].as_str().expect("order id").to_owned();
        match &record.before_kill {
            BeforeKill::Created(before) => {
                assert_eq!(answer.status, 200, "{}: {}", record.key, answer.body);
                assert_eq!(answer.header("Idempotent-Replayed"), Some("true"));
                assert_eq!(
                    &id, before,
                    "{}: the order answered before the kill was lost",
                    record.key
                );
            }
            BeforeKill::NotSent => {
                assert_eq!(answer.status, 201, "{}: {}", record.key, answer.body)
            }
            // Rolled back with the process (201 now), or committed with its
            // answer lost on the way (a replay now).
            BeforeKill::Cut => match answer.status {
                201 => assert_eq!(answer.header("Idempotent-Replayed"), None),
                200 => assert_eq!(answer.header("Idempotent-Replayed"), Some("true")),
                other => panic!(
                    "{}: a cut request's retry got {other}: {}",
                    record.key, answer.body
                ),
            },
        }
        assert_eq!(
            order_id_for_key(&crashed.pool, "alice", &record.key),
            Some(id),
            "{}",
            record.key
        );
    }
    let keys = crashed.records.len() as i64;
    assert_eq!(
        order_count(&crashed.pool),
        keys,
        "exactly one order per key"
    );
    assert_eq!(
        ledger_count(&crashed.pool),
        keys,
        "exactly one ledger entry per key"
    );
}

both_backends! {
    fn a_kill_9_under_load_loses_no_answered_order_and_leaves_one_order_per_key(backend) {
        let mut crashed = kill_under_load(backend, &[]);

        let answers: Vec<TestResponse> = crashed
            .records
            .iter()
            .map(|record| retry_until_answered(&crashed, record).0)
            .collect();

        assert_one_order_per_key(&crashed, &answers);
        assert!(crashed.server.is_alive());
    }

    fn after_a_kill_9_the_first_retry_of_every_key_runs_or_replays_without_waiting_for_a_lease(backend) {
        // The key's entry is written in the mutation's transaction, after
        // the change, so a killed holder leaves nothing behind: after the restart, with the
        // default 30 s lease still far from over, the very first retry of
        // every key runs or replays; none is told it is in progress. (No
        // lease is involved: a hold on the key that outlived its holder would
        // answer 409 here.)
        let crashed = kill_under_load(backend, &[]);

        let answers: Vec<TestResponse> = crashed
            .records
            .iter()
            .map(|record| {
                let answer = crashed
                    .client
                    .post_order(&record.key, &record.body)
                    .unwrap_or_else(|e| panic!("{}: no answer after the restart: {e}", record.key));
                assert!(
                    answer.status == 201 || answer.status == 200,
                    "{}: the first retry after the restart got {}: {}",
                    record.key, answer.status, answer.body
                );
                answer
            })
            .collect();

        assert_one_order_per_key(&crashed, &answers);
    }
}

crate::postgres_only! {
    /// The deterministic form of the takeover, on PostgreSQL: the request is
    /// killed while it certainly holds its key (its one statement — the key's
    /// advisory lock, the order and the entry — is blocked on an order row the
    /// test holds). The statement was sent whole, so once the row is released the
    /// server finishes it alone: its order and entry commit together or not at
    /// all, as after a kill that came just after a `COMMIT` was sent. Either way
    /// nothing holds the key after the restart: the first retry is answered at
    /// once — it runs (`201`) when nothing committed, or replays the killed
    /// request's recorded `201` — and the key has exactly one order.
    fn a_claim_held_by_a_killed_process_is_free_after_the_restart() {
        let db = TestDb::fresh(Backend::Postgres);
        let pool = prepare(&db.url);
        let token = create_token(&pool, "alice");
        let mut server = ServerProcess::start(&db.url, &[]);
        let body = order_body("Widget", 2, "9.99");
        let held = HeldOrderRow::hold(&db.url, "alice", "killed-holder");

        let client = Client::new(&server.address(), &token, CLIENT_TIMEOUT);
        let cut = std::thread::scope(|s| {
            let request = s.spawn(|| client.post_order("killed-holder", &body));
            wait_for_session_where(&db.url, "wait_event_type = 'Lock'", Duration::from_secs(10));
            server.kill();
            request.join().expect("client thread")
        });
        assert!(
            cut.is_err(),
            "the request was killed before it could answer: {cut:?}"
        );
        held.release();

        // The killed holder's statement ends by itself: nothing waits a lease.
        wait_for_no_session_where(&db.url, "xact_start IS NOT NULL", Duration::from_secs(10));
        let committed = (order_count(&pool), ledger_count(&pool));
        assert!(
            committed == (0, 0) || committed == (1, 1),
            "the killed request's order and entry commit together or not at all: {committed:?}"
        );

        server.restart(&["--lease-secs", "1"]);
        let client = Client::new(&server.address(), &token, CLIENT_TIMEOUT);
        let retry = client
            .post_order("killed-holder", &body)
            .expect("an answer after the restart");
        let expected = if committed == (1, 1) { 200 } else { 201 };
        assert_eq!(
            retry.status, expected,
            "the retry must be answered at once (run, or replay what committed): {}",
            retry.body
        );
        let id = retry.json()["id"].as_str().expect("order id").to_owned();
        assert_eq!(order_id_for_key(&pool, "alice", "killed-holder"), Some(id));
        assert_eq!((order_count(&pool), ledger_count(&pool)), (1, 1));
    }
}
