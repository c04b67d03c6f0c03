//! Graceful shutdown of the real binary: on SIGTERM new connections are
//! refused, in-flight requests finish and their results are recorded, the
//! process exits 0; after a restart every key's retry replays or creates
//! exactly one order.

use std::io::{BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use orders_atk::wire::Message;
use serde_json::Value;

use crate::both_backends;
use crate::helpers::*;
use crate::net::Client;
use crate::process::{self, ServerProcess};

const TIMEOUT: Duration = Duration::from_secs(60);
/// Clients sending creates while the server is asked to stop.
const CLIENTS: usize = 4;

/// A `POST /v1/orders` whose body is sent in two halves, on a raw
/// connection, so the test decides when the request ends.
struct SlowCreate {
    stream: TcpStream,
    rest: Vec<u8>,
}

impl SlowCreate {
    /// Sends the headers (with `Expect: 100-continue`) and waits for the
    /// server's `100 Continue`: from then on the request is in a handler,
    /// reading its body. Then sends the first half of the body.
    fn start(address: &str, token: &str, key: &str, body: &str) -> Self {
        let host = address.trim_start_matches("http://");
        let mut stream = TcpStream::connect(host).expect("connect");
        stream.set_read_timeout(Some(TIMEOUT)).unwrap();
        let head = format!(
            "POST /v1/orders HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\n\
             Idempotency-Key: {key}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nExpect: 100-continue\r\n\r\n",
            body.len()
        );
        stream.write_all(head.as_bytes()).unwrap();
        let mut continue_line = [0u8; 25];
        stream.read_exact(&mut continue_line).expect("100 Continue");
        assert_eq!(&continue_line, b"HTTP/1.1 100 Continue\r\n\r\n");
        let (first, rest) = body.as_bytes().split_at(body.len() / 2);
        stream.write_all(first).unwrap();
        stream.flush().unwrap();
        Self {
            stream,
            rest: rest.to_vec(),
        }
    }

    /// Sends the rest of the body and reads the whole response.
    fn finish(mut self) -> (u16, Vec<(String, String)>, String) {
        self.stream.write_all(&self.rest).unwrap();
        let answer = Message::read(&mut BufReader::new(self.stream)).expect("a whole response");
        let headers = answer
            .headers
            .iter()
            .map(|(name, value)| (name.to_ascii_lowercase(), value.clone()))
            .collect();
        (
            answer.status(),
            headers,
            String::from_utf8(answer.body).expect("UTF-8"),
        )
    }
}

fn connection_refused(address: &str) -> bool {
    TcpStream::connect(address.trim_start_matches("http://")).is_err()
}

both_backends! {
    fn sigterm_lets_in_flight_creates_finish_and_after_a_restart_no_order_is_lost_or_doubled(backend) {
        let db = TestDb::fresh(backend);
        let pool = process::prepare(&db.url);
        let token = process::create_token(&pool, "alice");
        let mut server = ServerProcess::start(&db.url, &[]);
        let address = server.address();
        let body = |n: usize| order_body("Widget", (n % 1000 + 1) as i64, "2.50");

        // Creates that keep coming until the signal, each with its own key.
        let stop = Arc::new(AtomicBool::new(false));
        let answered = Arc::new(AtomicUsize::new(0));
        let clients: Vec<_> = (0..CLIENTS)
            .map(|c| {
                let client = Client::new(&address, &token, TIMEOUT);
                let stop = Arc::clone(&stop);
                let answered = Arc::clone(&answered);
                std::thread::spawn(move || {
                    let mut results = Vec::new();
                    let mut n = 0;
                    while !stop.load(Ordering::SeqCst) {
                        let key = format!("load-{c}-{n}");
                        let sent = body(n);
                        let result = client
                            .call_whole_or_none("POST", "/v1/orders", Some(&key), Some(&sent))
                            .map(|r| (r.status, r.body.clone()));
                        if result.is_some() {
                            answered.fetch_add(1, Ordering::SeqCst);
                        }
                        results.push((key, sent, result));
                        n += 1;
                    }
                    results
                })
            })
            .collect();
        // The server is busy with them before the signal.
        let deadline = Instant::now() + TIMEOUT;
        while answered.load(Ordering::SeqCst) < CLIENTS * 5 {
            assert!(Instant::now() < deadline, "the clients' creates are answered");
            std::thread::sleep(Duration::from_millis(5));
        }
        // One create that is certainly in flight when the signal arrives.
        let slow_body = body(7);
        let slow = SlowCreate::start(&address, &token, "slow", &slow_body);

        server.terminate();
        let deadline = Instant::now() + TIMEOUT;
        while !connection_refused(&address) {
            assert!(Instant::now() < deadline, "new connections are still accepted after SIGTERM");
            std::thread::sleep(Duration::from_millis(10));
        }
        stop.store(true, Ordering::SeqCst);
        let (slow_status, slow_headers, slow_response) = slow.finish();
        let exit = server.wait_for_exit(TIMEOUT);

        assert!(exit.success(), "orders-api exited with {exit} after SIGTERM:\n{}", server.log_text());
        assert_eq!(slow_status, 201, "the in-flight create finished: {slow_response}");
        let slow_order: Value = serde_json::from_str(&slow_response).expect("a complete JSON order");
        assert!(slow_headers.iter().any(|(n, v)| n == "location" && v.ends_with(slow_order["id"].as_str().unwrap())));
        let mut attempts = vec![("slow".to_owned(), slow_body, Some(slow_order))];
        for client in clients {
            for (key, sent, result) in client.join().expect("a client thread") {
                // Every answer that arrived is complete: a created order.
                let order = result.map(|(status, body)| {
                    assert_eq!(status, 201, "{key}: {body}");
                    serde_json::from_str::<Value>(&body).unwrap_or_else(|e| panic!("{key}: {e}: {body}"))
                });
                attempts.push((key, sent, order));
            }
        }
        assert!(attempts.len() > 1, "the clients sent creates");

        // After a restart, each key's retry replays its order or creates it now.
        server.restart(&[]);
        let client = Client::new(&server.address(), &token, TIMEOUT);
        for (key, sent, answered) in &attempts {
            let retry = client.post_order(key, sent).expect("the restarted server answers");
            match answered {
                Some(order) => {
                    assert_eq!(retry.status, 200, "{key} replays: {}", retry.body);
                    assert_eq!(retry.header("Idempotent-Replayed"), Some("true"), "{key}");
                    assert_eq!(&retry.json(), order, "{key} replays the recorded order");
                }
                None => assert!(
                    [200, 201].contains(&retry.status),
                    "{key}: an unanswered create is replayed or made now: {}",
                    retry.body
                ),
            }
            assert!(process::order_id_for_key(&pool, "alice", key).is_some(), "{key} has its order");
        }
        let keys = attempts.len() as i64;
        assert_eq!(process::order_count(&pool), keys, "one order per key, none lost, none doubled");
        assert_eq!(process::ledger_count(&pool), keys, "every order has its recorded answer");
    }
}

/// What the server sent to a `Type=notify` service manager's socket: each
/// datagram's lines, until one contains `line` (or the wait runs out).
fn notifications_until(socket: &std::os::unix::net::UnixDatagram, line: &str) -> Vec<String> {
    let mut seen = Vec::new();
    let mut buffer = [0u8; 4096];
    while !seen.iter().any(|l| l == line) {
        let Ok(n) = socket.recv(&mut buffer) else {
            panic!("no {line:?} within {TIMEOUT:?}; got {seen:?}");
        };
        let datagram = String::from_utf8_lossy(&buffer[..n]).into_owned();
        seen.extend(datagram.lines().map(str::to_owned));
    }
    seen
}

#[test]
fn under_systemd_the_server_reports_ready_once_it_listens_and_stopping_on_sigterm() {
    let db = TestDb::fresh(orders_api::db::Backend::Sqlite);
    let path = std::env::temp_dir().join(format!("notify-{}.sock", uuid::Uuid::new_v4().simple()));
    let socket = std::os::unix::net::UnixDatagram::bind(&path).expect("bind the notify socket");
    socket.set_read_timeout(Some(TIMEOUT)).unwrap();
    let notify_socket = path.display().to_string();

    let mut server =
        ServerProcess::start_with_env(&db.url, &[], &[("NOTIFY_SOCKET", &notify_socket)]);
    let ready = notifications_until(&socket, "READY=1");
    server.terminate();
    let stopping = notifications_until(&socket, "STOPPING=1");
    let status = server.wait_for_exit(TIMEOUT);
    let _ = std::fs::remove_file(&path);

    let listening = format!("STATUS=listening on {}", server.address());
    assert!(ready.contains(&listening), "{ready:?}");
    assert!(!ready.iter().any(|l| l == "STOPPING=1"), "{ready:?}");
    assert!(
        stopping.iter().any(|l| l.starts_with("STATUS=")),
        "{stopping:?}"
    );
    assert!(status.success(), "{status}");
}
