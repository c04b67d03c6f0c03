//! CONTRACT §1 and the race guarantee: "Several server processes may share one
//! PostgreSQL database; every guarantee must hold across processes, not only
//! across threads." Two real binaries, one database, one key.

use std::sync::Barrier;
use std::time::{Duration, Instant};

use orders_api::db::Backend;

use crate::both_backends;
use crate::helpers::*;
use crate::net::Client;
use crate::process::{
    HeldOrderRow, ServerProcess, create_token, ledger_count, order_count, order_id_for_key,
    prepare, wait_for_session_where,
};
use crate::race::assert_ran_once;

/// Concurrent requests per round, split evenly across the two processes.
const THREADS: usize = 40;
const ROUNDS: usize = 4;

/// A fresh database, the test's own pool on it, a token of `alice`'s, and
/// two server processes serving it.
fn two_processes(backend: Backend) -> (TestDb, orders_api::db::Pool, String, [ServerProcess; 2]) {
    let db = TestDb::fresh(backend);
    let pool = prepare(&db.url);
    let token = create_token(&pool, "alice");
    let servers = [
        ServerProcess::start(&db.url, &[]),
        ServerProcess::start(&db.url, &[]),
    ];
    (db, pool, token, servers)
}

both_backends! {
    /// On SQLite the two processes' writers take turns on the file's lock
    /// (`BEGIN IMMEDIATE` per batch); on PostgreSQL the key's advisory lock
    /// serialises them.
    fn concurrent_requests_with_one_key_sent_to_two_processes_create_exactly_one_order(backend) {
        let (_db, pool, token, servers) = two_processes(backend);
        let body = order_body("Widget", 3, "4.50");

        for round in 0..ROUNDS {
            let key = format!("two-processes-{round}");
            let barrier = Barrier::new(THREADS);
            let responses: Vec<TestResponse> = std::thread::scope(|s| {
                let threads: Vec<_> = (0..THREADS)
                    .map(|i| {
                        let client =
                            Client::new(&servers[i % 2].address(), &token, Duration::from_secs(30));
                        let (barrier, key, body) = (&barrier, &key, &body);
                        s.spawn(move || {
                            barrier.wait();
                            client
                                .post_order(key, body)
                                .unwrap_or_else(|e| panic!("process {} did not answer: {e}", i % 2))
                        })
                    })
                    .collect();
                threads
                    .into_iter()
                    .map(|t| t.join().expect("client thread"))
                    .collect()
            });

            let created = assert_ran_once(&responses, 201);
            assert_eq!(responses.iter().filter(|r| r.status == 201).count(), 1);
            let id = created.json()["id"].as_str().expect("order id").to_owned();
            assert_eq!(order_id_for_key(&pool, "alice", &key), Some(id));
            assert_eq!(
                order_count(&pool),
                round as i64 + 1,
                "round {round} created more than one order"
            );
        }
        assert_eq!(ledger_count(&pool), ROUNDS as i64);
    }

    fn requests_with_distinct_keys_sent_to_two_processes_are_all_stored_once(backend) {
        let (_db, pool, token, servers) = two_processes(backend);
        let barrier = Barrier::new(THREADS);
        let per_thread = 5;
        std::thread::scope(|s| {
            for i in 0..THREADS {
                let client = Client::new(&servers[i % 2].address(), &token, Duration::from_secs(30));
                let barrier = &barrier;
                s.spawn(move || {
                    barrier.wait();
                    for n in 0..per_thread {
                        let r = client
                            .post_order(&format!("distinct-{i}-{n}"), &order_body("Widget", 1, "1"))
                            .unwrap_or_else(|e| panic!("process {} did not answer: {e}", i % 2));
                        assert_eq!(r.status, 201, "{}", r.body);
                    }
                });
            }
        });
        let expected = (THREADS * per_thread) as i64;
        assert_eq!((order_count(&pool), ledger_count(&pool)), (expected, expected));
    }
}

crate::postgres_only! {
    /// CONTRACT §4: "a claim whose holder died (process killed mid-request) blocks
    /// its key for at most IDEMPOTENCY_LEASE_SECS; after that the next request
    /// with that key takes it over and runs" — here the next request goes to the
    /// other process, which never restarts. The first process is killed while
    /// its request certainly holds the key (its one statement blocked on an order
    /// row the test holds, with the key's advisory lock taken). That statement was
    /// sent whole, so once the row is released the server may finish it alone
    /// (its order and entry together); the other process then replays it, or
    /// runs the key itself when nothing committed — never a second order.
    fn a_claim_held_by_a_killed_process_is_taken_over_by_the_other_process() {
        let db = TestDb::fresh(Backend::Postgres);
        let pool = prepare(&db.url);
        let token = create_token(&pool, "alice");
        let mut doomed = ServerProcess::start(&db.url, &[]);
        let survivor = ServerProcess::start(&db.url, &["--lease-secs", "2"]);
        let body = order_body("Widget", 1, "7.00");
        let held = HeldOrderRow::hold(&db.url, "alice", "orphaned-claim");

        let doomed_client = Client::new(&doomed.address(), &token, Duration::from_secs(30));
        let cut = std::thread::scope(|s| {
            let request = s.spawn(|| doomed_client.post_order("orphaned-claim", &body));
            wait_for_session_where(&db.url, "wait_event_type = 'Lock'", Duration::from_secs(10));
            doomed.kill();
            request.join().expect("client thread")
        });
        assert!(
            cut.is_err(),
            "the request was killed before it could answer: {cut:?}"
        );
        held.release();

        // Retried at the surviving process: in progress at most for a lease, then it runs.
        let client = Client::new(&survivor.address(), &token, Duration::from_secs(30));
        // Bounded well beyond the survivor's 2 s lease.
        let deadline = Instant::now() + Duration::from_secs(10);
        let answer = loop {
            let r = client
                .post_order("orphaned-claim", &body)
                .expect("the surviving process answers");
            if r.status != 409 {
                break r;
            }
            crate::race::assert_in_progress(&r);
            assert!(
                Instant::now() < deadline,
                "the orphaned claim was never taken over"
            );
            std::thread::sleep(Duration::from_millis(100));
        };
        assert!(
            answer.status == 201
                || (answer.status == 200 && answer.header("idempotent-replayed").is_some()),
            "run, or a replay of what the killed request committed: {} {}",
            answer.status,
            answer.body
        );
        let id = answer.json()["id"].as_str().expect("order id").to_owned();
        assert_eq!(order_id_for_key(&pool, "alice", "orphaned-claim"), Some(id));
        assert_eq!((order_count(&pool), ledger_count(&pool)), (1, 1));
    }
}
