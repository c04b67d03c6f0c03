//! ATK-05's relatives (ATK-05 itself is in `atk.rs`): many requests with one
//! `Idempotency-Key`, released together, run the mutation exactly once
//! (CONTRACT §4, race guarantee).

use std::sync::Barrier;
use std::time::Duration;

use crate::both_backends;
use crate::helpers::*;
use crate::net::Client;
use crate::process::order_id_for_key;

/// Concurrent requests per round; each thread has its own connection.
const THREADS: usize = 50;
const REPLAYED: &str = "Idempotent-Replayed";

/// Sends one request per thread, all released by one barrier; thread `i`
/// sends `body(i)` (JSON) with `key`. Returns the answers in thread order.
pub(crate) fn race(
    app: &TestApp,
    method: &str,
    path: &str,
    key: &str,
    body: impl Fn(usize) -> Option<String>,
) -> Vec<TestResponse> {
    let barrier = Barrier::new(THREADS);
    std::thread::scope(|s| {
        let threads: Vec<_> = (0..THREADS)
            .map(|i| {
                let (barrier, body) = (&barrier, body(i));
                s.spawn(move || {
                    let client = Client::new(&app.address, &app.token, Duration::from_secs(60));
                    barrier.wait();
                    client
                        .call(method, path, Some(key), body.as_deref())
                        .expect("the server answered")
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().expect("client thread"))
            .collect()
    })
}

/// Asserts the race guarantee for one round of identical requests: exactly
/// one answer is the execution (`executed_status`, not marked replayed),
/// every other one replays it byte for byte or is `409
/// IDEMPOTENCY_IN_PROGRESS` with `Retry-After`; nothing is a 5xx. Returns the
/// execution's answer.
pub(crate) fn assert_ran_once(responses: &[TestResponse], executed_status: u16) -> TestResponse {
    for r in responses {
        assert!(
            r.status < 500,
            "a concurrent duplicate got a {}: {}",
            r.status,
            r.body
        );
    }
    let executed: Vec<&TestResponse> = responses
        .iter()
        .filter(|r| r.status == executed_status && r.header(REPLAYED).is_none())
        .collect();
    assert_eq!(
        executed.len(),
        1,
        "expected exactly one execution, got {}: {responses:#?}",
        executed.len()
    );
    let first = executed[0].clone();
    let (mut replays, mut in_progress) = (0, 0);
    for r in responses
        .iter()
        .filter(|r| !(r.status == executed_status && r.header(REPLAYED).is_none()))
    {
        match r.status {
            200 => {
                assert_eq!(r.header(REPLAYED), Some("true"), "{r:?}");
                assert_eq!(
                    r.body, first.body,
                    "a replay differs from the original answer"
                );
                assert_eq!(r.header("Location"), first.header("Location"));
                replays += 1;
            }
            409 => {
                assert_in_progress(r);
                in_progress += 1;
            }
            other => panic!("unexpected {other} for a concurrent duplicate: {}", r.body),
        }
    }
    assert_eq!(1 + replays + in_progress, responses.len());
    eprintln!("round: 1 executed, {replays} replayed, {in_progress} in progress");
    first
}

pub(crate) fn assert_in_progress(r: &TestResponse) {
    assert_eq!(r.status, 409, "{}", r.body);
    assert_eq!(r.error_code(), "IDEMPOTENCY_IN_PROGRESS");
    assert_eq!(r.header("Content-Type"), Some("application/problem+json"));
    let retry_after = r
        .header("Retry-After")
        .expect("Retry-After on IDEMPOTENCY_IN_PROGRESS");
    assert!(
        retry_after.parse::<u32>().is_ok_and(|s| s >= 1),
        "Retry-After must be whole seconds: {retry_after}"
    );
    assert_eq!(
        r.header("X-Should-Retry"),
        Some("true"),
        "X-Should-Retry on IDEMPOTENCY_IN_PROGRESS"
    );
}

both_backends! {
    fn concurrent_requests_with_one_key_and_different_bodies_create_one_order_and_refuse_the_rest(backend) {
        const ROUNDS: usize = 3;
        let app = TestApp::spawn(backend);

        for round in 0..ROUNDS {
            let key = format!("atk-05-different-bodies-{round}");
            let responses = race(&app, "POST", "/v1/orders", &key, |i| Some(order_body("Widget", i as i64 + 1, "9.99")));

            for r in &responses {
                assert!(r.status < 500, "got a {}: {}", r.status, r.body);
            }
            let created: Vec<_> = responses.iter().filter(|r| r.status == 201).collect();
            assert_eq!(created.len(), 1, "{responses:#?}");
            for r in responses.iter().filter(|r| r.status != 201) {
                // Every body differs, so nothing may replay another thread's answer.
                assert_eq!(r.status, 409, "{}", r.body);
                match r.error_code().as_str() {
                    "IDEMPOTENCY_KEY_REUSED_WITH_DIFFERENT_PAYLOAD" => {}
                    "IDEMPOTENCY_IN_PROGRESS" => assert_in_progress(r),
                    other => panic!("unexpected error code {other}"),
                }
            }
            let winner = created[0].json();
            let id = winner["id"].as_str().expect("order id").to_owned();
            assert_eq!(order_id_for_key(&app.pool, "alice", &key), Some(id.clone()));
            let stored = app.call("GET", &format!("/v1/orders/{id}"), None, None);
            assert_eq!(stored.json(), winner, "the stored order is the winner's request");
            assert_eq!(app.order_count(), round as i64 + 1);
        }
        assert_eq!(app.ledger_count(), ROUNDS as i64);
    }

    fn concurrent_patches_and_cancels_with_one_key_run_once(backend) {
        let app = TestApp::spawn(backend);
        let created = app.post_order(Some("race-target"), &order_body("Widget", 2, "9.99"));
        assert_eq!(created.status, 201, "{}", created.body);
        let path = created.header("Location").expect("Location").to_owned();

        for round in 0..3_i64 {
            let quantity = 10 + round;
            let key = format!("race-patch-{round}");
            let responses = race(&app, "PATCH", &path, &key, |_| Some(format!(r#"{{"quantity":{quantity}}}"#)));

            let patched = assert_ran_once(&responses, 200).json();
            assert_eq!(patched["quantity"], quantity);
            assert_eq!(app.call("GET", &path, None, None).json(), patched);
        }
        for round in 0..2 {
            // The second round cancels a cancelled order: a no-op, still run once.
            let key = format!("race-cancel-{round}");
            let responses = race(&app, "DELETE", &path, &key, |_| None);

            let cancelled = assert_ran_once(&responses, 200).json();
            assert_eq!(cancelled["status"], "cancelled");
            assert_eq!(cancelled["quantity"], 12);
        }
        assert_eq!(app.order_count(), 1);
        assert_eq!(app.ledger_count(), 1 + 3 + 2, "one ledger entry per key");
    }
}
