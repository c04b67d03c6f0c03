//! SPEC §1 and the race guarantee: "Several server processes may share one
//! PostgreSQL database; every guarantee must hold across processes, not only
//! across threads." Two real binaries, one database, one key.

use std::sync::Barrier;
use std::time::Duration;

use orders_api::db::Backend;

use crate::helpers::*;
use crate::process::{
    Client, ServerProcess, create_token, ledger_count, order_count, order_id_for_key, prepare,
};
use crate::race::assert_ran_once;

/// Concurrent requests per round, split evenly across the two processes.
const THREADS: usize = 40;
const ROUNDS: usize = 4;

#[test]
fn concurrent_requests_with_one_key_sent_to_two_processes_create_exactly_one_order() {
    if !postgres_available() {
        return;
    }
    let db = TestDb::fresh(Backend::Postgres);
    let pool = prepare(&db.url);
    let token = create_token(&pool, "alice");
    let servers = [
        ServerProcess::start(&db.url, &[]),
        ServerProcess::start(&db.url, &[]),
    ];
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
