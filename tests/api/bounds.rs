//! Bounds that fire (issue 16, SPEC §4 "Bounds that fire"): each limit the
//! docs state, shown firing with the default settings — writes admitted at
//! once, a writer unit that hangs or panics, a duplicate that waits for the
//! first request with its key. (The body deadline is in `abuse.rs`, the
//! client's `--max-wait` in `client.rs`.)
//!
//! Requests pile up deterministically: the test holds the database (the
//! SQLite writer, or a lock the first request needs) and watches the queue,
//! never the clock.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use orders_api::db::Backend;
use orders_api::http::admission::DEFAULT_WRITE_ADMISSION;

use crate::expect::*;
use crate::group_commit::{HeldWriter, queued};
use crate::helpers::*;

const PATIENCE: Duration = Duration::from_secs(30);

/// A `503` as every one the service sends: problem+json, `Retry-After`,
/// `X-Should-Retry: true`.
pub fn assert_unavailable(response: &TestResponse) {
    assert_problem(response, 503, "SERVICE_UNAVAILABLE");
    assert!(
        response.header("Retry-After").is_some(),
        "503 without Retry-After"
    );
    assert_eq!(response.header("X-Should-Retry"), Some("true"));
}

/// Issue 16.1: with the default settings, more concurrent creates than
/// `WRITE_ADMISSION` while the writer is held: exactly the bound is admitted
/// (waiting in the writer's queue), every other one is answered `503` with
/// `Retry-After` while the writer is still held, reads are answered
/// meanwhile, and each refused key is free for a retry. Before, every
/// create was admitted and waited.
#[test]
fn creates_beyond_the_write_admission_are_answered_503_at_once_and_their_keys_stay_free() {
    let app = TestApp::spawn(Backend::Sqlite);
    let bound = usize::try_from(DEFAULT_WRITE_ADMISSION).unwrap();
    let excess = 16;
    let body = order_body("Widget", 1, "1");
    let answered = AtomicUsize::new(0);

    let held = HeldWriter::hold(&app.pool);
    let responses: Vec<(String, TestResponse)> = std::thread::scope(|s| {
        let posts: Vec<_> = (0..bound + excess)
            .map(|i| {
                let (app, body, answered) = (&app, &body, &answered);
                s.spawn(move || {
                    let key = format!("admit-{i}");
                    let response = app.post_order(Some(&key), body);
                    answered.fetch_add(1, Ordering::SeqCst);
                    (key, response)
                })
            })
            .collect();
        // The excess is answered while the writer is still held.
        let deadline = Instant::now() + PATIENCE;
        while answered.load(Ordering::SeqCst) < excess || queued(&app.pool) < bound {
            assert!(
                Instant::now() < deadline,
                "{} answered, {} queued while the writer is held",
                answered.load(Ordering::SeqCst),
                queued(&app.pool)
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(answered.load(Ordering::SeqCst), excess);
        let read = app.call("GET", "/v1/orders", None, None);
        assert_eq!(
            read.status, 200,
            "a read waits behind held writes: {}",
            read.body
        );
        assert_eq!(app.request("GET", "/healthz", &[], None).status, 200);
        held.release_when_queued(&app.pool, bound);
        posts
            .into_iter()
            .map(|p| p.join().expect("client"))
            .collect()
    });

    let shed: Vec<&String> = responses
        .iter()
        .filter(|(_, r)| r.status == 503)
        .map(|(key, _)| key)
        .collect();
    assert_eq!(shed.len(), excess);
    for (_, response) in &responses {
        match response.status {
            201 => {}
            503 => assert_unavailable(response),
            other => panic!("unexpected {other}: {}", response.body),
        }
    }
    assert_eq!(app.order_count(), i64::try_from(bound).unwrap());
    for key in shed {
        let retry = app.post_order(Some(key), &body);
        assert_eq!(retry.status, 201, "the refused key is free: {}", retry.body);
        assert_not_replayed(&retry);
    }
    assert_eq!(
        (app.order_count(), app.ledger_count()),
        (
            i64::try_from(bound + excess).unwrap(),
            i64::try_from(bound + excess).unwrap()
        )
    );
}
