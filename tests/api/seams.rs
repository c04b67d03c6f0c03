//! Where two guarantees meet: a key held in flight, the duplicates waiting
//! for it, the per-key waiter cap, write admission and replays — exercised
//! at once, and asserted by the order of events, never by timing.
//!
//! The held key is held at a fault point of the ledger (feature
//! `fault-points`, compiled into test builds only): its first request stops
//! right after it took its key in the process, before anything else, until
//! the test releases it.

use std::sync::mpsc;
use std::time::Duration;

use diesel::connection::SimpleConnection;
use idempotency_ledger::fault::{self, Point};
use orders_api::db::Conn;

use crate::both_backends;
use crate::helpers::*;

/// Duplicates a process lets wait for one key (the ledger's default).
const WAITERS_PER_KEY: usize = idempotency_ledger::DEFAULT_WAITERS_PER_KEY;

/// Starts `count` retries of `key` on threads of `scope`; their answers come
/// on the returned channel.
fn retries<'s>(
    scope: &'s std::thread::Scope<'s, '_>,
    app: &'s TestApp,
    key: &'s str,
    body: &'s str,
    count: usize,
) -> mpsc::Receiver<TestResponse> {
    let (answered, answers) = mpsc::channel();
    for _ in 0..count {
        let answered = answered.clone();
        scope.spawn(move || {
            let _ = answered.send(app.post_order(Some(key), body));
        });
    }
    answers
}

both_backends! {
    fn a_held_key_and_fifty_retries_of_it_leave_other_writes_and_replays_answered(backend) {
        // Fewer write slots than waiting duplicates: a waiter that took one
        // would starve the other user's create.
        // Waiters that outlast the test's steps, whatever the machine's load.
        let app = TestApp::spawn_with(backend, |s| {
            s.write_admission = 4;
            s.idempotency_wait_secs = 120;
        });
        let body = order_body("Widget", 2, "9.99");
        let recorded = app.post_order(Some("recorded-key"), &body);
        assert_eq!(recorded.status, 201, "{}", recorded.body);
        let bob = app.create_token("bob");
        // Fault holds are process-wide: each backend's copy holds its own key.
        let held_key = format!("held-key-{backend:?}");
        let held_key: &str = &held_key;
        let hold = fault::hold(Point::AfterEnter, held_key);

        std::thread::scope(|s| {
            let holder = s.spawn(|| app.post_order(Some(held_key), &body));
            assert!(hold.wait_reached(Duration::from_secs(30)), "the first request holds its key");
            let answers = retries(s, &app, held_key, &body, 50);
            // Past the cap the duplicates are answered at once: once these
            // are in, the cap's worth of others is waiting for the key.
            let mut early = Vec::new();
            while early.len() < 50 - WAITERS_PER_KEY {
                early.push(answers.recv_timeout(Duration::from_secs(30)).expect("an answer at once"));
            }
            for answer in &early {
                assert_eq!(answer.status, 409, "{}", answer.body);
                assert_eq!(answer.header("X-Should-Retry"), Some("true"));
            }

            // With the key held and its waiters waiting: another user's
            // create runs, and a replay of a recorded key is answered.
            let other = app.call_as(&bob, "POST", "/v1/orders", Some("bob-key"), Some(&body));
            assert_eq!(other.status, 201, "another user's create: {}", other.body);
            let replay = app.post_order(Some("recorded-key"), &body);
            assert_eq!(replay.status, 200, "{}", replay.body);
            assert_eq!(replay.header("Idempotent-Replayed"), Some("true"));
            assert_eq!(replay.body, recorded.body);
            assert!(!holder.is_finished(), "all of that while the key was still held");

            hold.release();
            let first = holder.join().expect("holder");
            assert_eq!(first.status, 201, "{}", first.body);
            for answer in answers.iter().take(WAITERS_PER_KEY) {
                match answer.status {
                    200 => assert_eq!(answer.body, first.body, "a waiter replays the first answer"),
                    409 => assert_eq!(answer.header("X-Should-Retry"), Some("true")),
                    other => panic!("a waiting duplicate got {other}: {}", answer.body),
                }
            }
        });
        // The recorded create, the held one and bob's: no duplicate ran.
        assert_eq!((app.order_count(), app.ledger_count()), (3, 3));
    }

    fn retries_of_a_recorded_key_are_replayed_at_once_while_another_of_them_holds_the_key(backend) {
        let app = TestApp::spawn_with(backend, |s| s.idempotency_wait_secs = 120);
        let body = order_body("Widget", 2, "9.99");
        // Fault holds are process-wide: each backend's copy holds its own key.
        let key = format!("recorded-and-held-{backend:?}");
        let key: &str = &key;
        let recorded = app.post_order(Some(key), &body);
        assert_eq!(recorded.status, 201, "{}", recorded.body);
        let hold = fault::hold(Point::AfterEnter, key);

        std::thread::scope(|s| {
            let holder = s.spawn(|| app.post_order(Some(key), &body));
            assert!(hold.wait_reached(Duration::from_secs(30)), "a retry holds the key");
            // More retries than the key may have waiters: none waits, none
            // is refused; each is the recorded answer, given while the key
            // is still held.
            let answers = retries(s, &app, key, &body, WAITERS_PER_KEY + 8);
            for _ in 0..WAITERS_PER_KEY + 8 {
                let answer = answers.recv_timeout(Duration::from_secs(30)).expect("an answer at once");
                assert_eq!(answer.status, 200, "{}", answer.body);
                assert_eq!(answer.header("Idempotent-Replayed"), Some("true"));
                assert_eq!(answer.body, recorded.body);
            }
            assert!(!holder.is_finished(), "all of them while the key was still held");
            hold.release();
            let held = holder.join().expect("holder");
            assert_eq!(held.status, 200, "{}", held.body);
            assert_eq!(held.body, recorded.body);
        });
        assert_eq!((app.order_count(), app.ledger_count()), (1, 1));
    }

    fn duplicates_past_the_per_key_waiter_cap_are_answered_409_at_once_and_the_first_still_records(backend) {
        let app = TestApp::spawn_with(backend, |s| s.idempotency_wait_secs = 120);
        let body = order_body("Widget", 1, "1.00");
        // Fault holds are process-wide: each backend's copy holds its own key.
        let crowded_key = format!("crowded-key-{backend:?}");
        let crowded_key: &str = &crowded_key;
        let hold = fault::hold(Point::AfterEnter, crowded_key);
        std::thread::scope(|s| {
            let holder = s.spawn(|| app.post_order(Some(crowded_key), &body));
            assert!(hold.wait_reached(Duration::from_secs(30)));
            let answers = retries(s, &app, crowded_key, &body, WAITERS_PER_KEY + 3);
            // Three more than the cap: three are answered while the key is
            // still held, each with its retry hints.
            for _ in 0..3 {
                let answer = answers.recv_timeout(Duration::from_secs(30)).expect("an answer at once");
                assert_eq!(answer.status, 409, "{}", answer.body);
                assert!(answer.body.contains("IDEMPOTENCY_IN_PROGRESS"), "{}", answer.body);
                assert!(answer.header("Retry-After").is_some());
                assert_eq!(answer.header("X-Should-Retry"), Some("true"));
            }
            assert!(!holder.is_finished());
            hold.release();
            let first = holder.join().expect("holder");
            assert_eq!(first.status, 201, "{}", first.body);
            for answer in answers.iter().take(WAITERS_PER_KEY) {
                assert!(matches!(answer.status, 200 | 409), "{}: {}", answer.status, answer.body);
            }
        });
        assert_eq!((app.order_count(), app.ledger_count()), (1, 1));
    }

    fn a_stored_answer_that_cannot_be_replayed_is_answered_500_and_never_made_up(backend) {
        let app = TestApp::spawn(backend);
        let body = order_body("Widget", 2, "9.99");
        let first = app.post_order(Some("tampered-key"), &body);
        assert_eq!(first.status, 201, "{}", first.body);
        for tampering in [
            "response_status = 999",
            "response_status = 42",
            "response_headers = '[[\"Bad Name\",\"v\"]]'",
            "response_headers = 'not json'",
        ] {
            let mut pooled = app.pool.get().expect("connection");
            let sql = format!(
                "UPDATE idempotency_ledger SET response_status = 201, \
                 response_headers = '[[\"Content-Type\",\"application/json\"]]'; \
                 UPDATE idempotency_ledger SET {tampering}"
            );
            match pooled.conn() {
                Conn::Sqlite(c) => c.batch_execute(&sql),
                Conn::Postgres(c) => c.batch_execute(&sql),
            }
            .expect("tamper with the entry");
            drop(pooled);
            let replay = app.post_order(Some("tampered-key"), &body);
            assert_eq!(replay.status, 500, "{tampering}: {}", replay.body);
            assert_eq!(replay.header("Idempotent-Replayed"), None);
            assert!(replay.body.contains("\"INTERNAL_ERROR\""), "{}", replay.body);
            // Every member but `instance`, a random request id that may
            // itself contain "999".
            let mut problem = replay.json();
            problem.as_object_mut().map(|members| members.remove("instance"));
            let shown = problem.to_string();
            assert!(!shown.contains("999") && !shown.contains("Bad Name"), "no internals: {}", replay.body);
        }
        assert_eq!(app.order_count(), 1, "nothing ran again");
    }
}
