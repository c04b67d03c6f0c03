//! The client library's retries, against the real server behind a scripted
//! front that loses answers or answers for the server and records the
//! `Idempotency-Key` of every attempt: what `examples/retrying_client.rs`
//! proved with a key in memory, now with the key stored in the outbox.

use std::time::Duration;

use orders_client::{NewOperation, Outbox, SendError, Sender, Server, State};
use serde_json::json;

use crate::both_backends;
use crate::client::TempOutbox;
use crate::helpers::*;
use crate::proxy::{Proxy, Step, problem};

fn server(base_url: &str, token: &str) -> Server {
    let mut server = Server::new(base_url, token);
    server.base_delay = Duration::from_millis(5);
    server.max_delay = Duration::from_secs(2);
    server
}

fn create(outbox: &mut Outbox, quantity: i64) -> i64 {
    let body = json!({ "item": "Widget", "quantity": quantity, "price": 9.99 });
    outbox.enqueue(NewOperation::Create { body }).unwrap().id
}

/// Drains `outbox` through `base_url` for at most `max_wait`; the pending count.
fn drain(outbox: &mut Outbox, base_url: &str, token: &str, max_wait: Duration) -> i64 {
    let mut sender = Sender::new(outbox, server(base_url, token)).unwrap();
    sender.drain(max_wait, |_| {}).unwrap().pending
}

both_backends! {
    fn the_client_resends_a_lost_answer_with_the_stored_key_and_records_the_replay(backend) {
        let app = TestApp::spawn(backend);
        let front = Proxy::scripted(&app.address, vec![Step::ForwardThenCut]);
        let file = TempOutbox::new();
        let mut outbox = Outbox::open(&file.path).unwrap();
        let id = create(&mut outbox, 2);

        assert_eq!(drain(&mut outbox, &front.address, &app.token, Duration::from_secs(30)), 0);

        let op = outbox.get(id).unwrap();
        assert_eq!(front.keys(), vec![op.idempotency_key.clone(), op.idempotency_key.clone()], "the retry used the stored key");
        assert_eq!((op.state, op.response_status, op.attempts), (State::Done, Some(200), 2), "the second attempt replayed the first one's order");
        assert_eq!(app.order_count(), 1);
        let order = op.order_id.unwrap();
        let stored = app.call("GET", &format!("/v1/orders/{order}"), None, None).json();
        assert_eq!(serde_json::from_str::<serde_json::Value>(op.response_body.as_deref().unwrap()).unwrap(), stored);
    }

    fn the_client_waits_out_in_progress_and_5xx_answers_with_the_stored_key(backend) {
        let app = TestApp::spawn(backend);
        let front = Proxy::scripted(&app.address, vec![
            problem("409 Conflict", "IDEMPOTENCY_IN_PROGRESS", Some(1)),
            problem("503 Service Unavailable", "SERVICE_UNAVAILABLE", None),
            problem("500 Internal Server Error", "INTERNAL", None),
            Step::Forward,
        ]);
        let file = TempOutbox::new();
        let mut outbox = Outbox::open(&file.path).unwrap();
        let id = create(&mut outbox, 1);

        assert_eq!(drain(&mut outbox, &front.address, &app.token, Duration::from_secs(30)), 0);

        let op = outbox.get(id).unwrap();
        let keys = front.keys();
        assert_eq!(keys.len(), 4);
        assert!(keys.iter().all(|k| *k == op.idempotency_key), "{keys:?}");
        assert_eq!((op.state, op.response_status, op.attempts), (State::Done, Some(201), 4));
        assert_eq!(app.order_count(), 1);
    }

    fn the_client_keeps_a_refused_operation_as_failed_with_its_problem_and_never_resends_it(backend) {
        let app = TestApp::spawn(backend);
        let front = Proxy::scripted(&app.address, vec![]);
        let file = TempOutbox::new();
        let mut outbox = Outbox::open(&file.path).unwrap();
        let id = create(&mut outbox, 0);

        assert_eq!(drain(&mut outbox, &front.address, &app.token, Duration::from_secs(30)), 0);
        assert_eq!(drain(&mut outbox, &front.address, &app.token, Duration::from_secs(1)), 0);

        let op = outbox.get(id).unwrap();
        assert_eq!((op.state, op.response_status), (State::Failed, Some(422)));
        let problem: serde_json::Value = serde_json::from_str(op.response_body.as_deref().unwrap()).unwrap();
        assert_eq!(problem["error"], "VALIDATION_FAILED");
        assert_eq!(front.keys().len(), 1, "one attempt only, across two drains");
        assert_eq!(app.order_count(), 0);
    }

    fn the_client_keeps_an_operation_pending_when_nothing_answers_until_its_wait_is_over(backend) {
        let app = TestApp::spawn(backend);
        let nobody = format!("http://127.0.0.1:{}", crate::process::free_port());
        let file = TempOutbox::new();
        let mut outbox = Outbox::open(&file.path).unwrap();
        let id = create(&mut outbox, 1);

        assert_eq!(drain(&mut outbox, &nobody, &app.token, Duration::from_millis(300)), 1);

        let op = outbox.get(id).unwrap();
        assert_eq!(op.state, State::Pending);
        assert!(op.attempts >= 1 && op.last_error.is_some(), "{op:?}");
        assert_eq!(app.order_count(), 0);
        // It is still there, with its key: the next drain sends it.
        assert_eq!(drain(&mut outbox, &app.address, &app.token, Duration::from_secs(30)), 0);
        assert_eq!(outbox.get(id).unwrap().state, State::Done);
        assert_eq!(app.order_count(), 1);
    }

    /// A `Retry-After` longer than the backoff ceiling was cut to it (10 s
    /// at most), so the retry came before the server asked. It is honoured
    /// now (up to 5 minutes): the operation is due no sooner, a drain that
    /// ends before then does not send it again, and `sync` stops at its
    /// `--max-wait` saying when the next try is due.
    fn a_retry_after_longer_than_the_backoff_is_honoured_and_a_sync_waits_for_it_only_within_its_max_wait(backend) {
        let app = TestApp::spawn(backend);
        let front = Proxy::scripted(&app.address, vec![
            problem("503 Service Unavailable", "SERVICE_UNAVAILABLE", Some(60)),
        ]);
        let file = TempOutbox::new();
        let mut outbox = Outbox::open(&file.path).unwrap();
        let id = create(&mut outbox, 1);
        let before = orders_client::outbox::now_millis();

        assert_eq!(drain(&mut outbox, &front.address, &app.token, Duration::from_secs(3)), 1);

        let op = outbox.get(id).unwrap();
        assert_eq!((op.state, op.attempts), (State::Pending, 1), "{op:?}");
        assert!(op.next_attempt_at >= before + 60_000, "due after the server's 60 s, not before: {op:?}");
        assert_eq!(front.keys().len(), 1, "not sent again within the drain");

        let sync = std::process::Command::new(env!("CARGO_BIN_EXE_orders-api"))
            .args(["client", "sync", "--max-wait", "1"])
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("ORDERS_OUTBOX", &file.path)
            .env("ORDERS_API_URL", &front.address)
            .env("ORDERS_API_TOKEN", &app.token)
            .output()
            .unwrap();
        let line = String::from_utf8_lossy(&sync.stderr);
        assert!(!sync.status.success(), "{line}");
        assert_eq!(line.trim().lines().count(), 1, "{line}");
        assert!(line.contains("1 operation(s) still pending after 1s") && line.contains("next try in"), "{line}");
        assert_eq!(front.keys().len(), 1, "sync waited for the Retry-After, within its --max-wait");
        assert_eq!(app.order_count(), 0);
    }

    fn the_client_stops_on_a_refused_token_and_keeps_the_operation_pending(backend) {
        let app = TestApp::spawn(backend);
        let file = TempOutbox::new();
        let mut outbox = Outbox::open(&file.path).unwrap();
        let id = create(&mut outbox, 1);

        let mut sender = Sender::new(&mut outbox, server(&app.address, "oa_wrong")).unwrap();
        let stopped = sender.drain(Duration::from_secs(30), |_| {});

        assert!(matches!(stopped, Err(SendError::Unauthorized)), "{stopped:?}");
        assert_eq!(outbox.get(id).unwrap().state, State::Pending);
        assert_eq!(drain(&mut outbox, &app.address, &app.token, Duration::from_secs(30)), 0);
        assert_eq!(app.order_count(), 1);
    }

    fn each_operation_has_its_own_key_and_only_a_new_operation_a_new_one(backend) {
        let app = TestApp::spawn(backend);
        let file = TempOutbox::new();
        let mut outbox = Outbox::open(&file.path).unwrap();
        let (first, second) = (create(&mut outbox, 1), create(&mut outbox, 1));

        assert_eq!(drain(&mut outbox, &app.address, &app.token, Duration::from_secs(30)), 0);

        let (first, second) = (outbox.get(first).unwrap(), outbox.get(second).unwrap());
        assert_ne!(first.idempotency_key, second.idempotency_key);
        assert!(first.order_id.is_some() && second.order_id.is_some());
        assert_ne!(first.order_id, second.order_id);
        assert_eq!(app.order_count(), 2);
    }
}
