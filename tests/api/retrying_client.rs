//! The retrying client of `examples/retrying_client.rs`, against the real
//! server behind a scripted front that loses answers or answers for the
//! server, and records the `Idempotency-Key` of every attempt.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::both_backends;
use crate::helpers::*;

#[path = "../../examples/retrying_client.rs"]
#[allow(dead_code)]
mod example;

use example::{Config, Failure, create_order};

/// What the front does with the n-th request.
#[derive(Clone)]
enum Step {
    /// Pass it to the server and its answer back.
    Forward,
    /// Pass it to the server, wait for its answer, then cut the connection:
    /// the order exists, the client does not know.
    ForwardThenCut,
    /// Answer this raw response without asking the server.
    Answer(String),
}

/// A raw problem answer, as the server would send it.
fn problem(status: &str, code: &str, retry_after: Option<u32>) -> Step {
    let body = format!(r#"{{"error":"{code}"}}"#);
    let retry_after = retry_after
        .map(|s| format!("Retry-After: {s}\r\n"))
        .unwrap_or_default();
    Step::Answer(format!(
        "HTTP/1.1 {status}\r\nContent-Type: application/problem+json\r\n{retry_after}\
         Connection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    ))
}

/// A one-connection-per-request HTTP front of the test server.
struct Front {
    address: String,
    keys: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Front {
    fn new(upstream: &str, script: Vec<Step>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let address = format!("http://{}", listener.local_addr().unwrap());
        let upstream = upstream.trim_start_matches("http://").to_owned();
        let keys = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (keys, stop) = (Arc::clone(&keys), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut n = 0;
                while !stop.load(Ordering::SeqCst) {
                    match listener.accept() {
                        Ok((client, _)) => {
                            client.set_nonblocking(false).unwrap();
                            let step = script.get(n).cloned().unwrap_or(Step::Forward);
                            serve(client, &upstream, step, &keys);
                            n += 1;
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(2)),
                    }
                }
            })
        };
        Self {
            address,
            keys,
            stop,
            thread: Some(thread),
        }
    }

    fn keys(&self) -> Vec<String> {
        self.keys.lock().unwrap().clone()
    }
}

impl Drop for Front {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Reads one HTTP/1.1 message (head, then a `Content-Length` body).
fn read_message(stream: &mut BufReader<TcpStream>) -> (String, Vec<u8>) {
    let mut head = String::new();
    loop {
        let mut line = String::new();
        stream.read_line(&mut line).unwrap();
        head.push_str(&line);
        if line == "\r\n" || line.is_empty() {
            break;
        }
    }
    let length = head
        .lines()
        .find_map(|l| {
            l.split_once(':')
                .filter(|(n, _)| n.eq_ignore_ascii_case("content-length"))
        })
        .and_then(|(_, v)| v.trim().parse().ok())
        .unwrap_or(0);
    let mut body = vec![0; length];
    stream.read_exact(&mut body).unwrap();
    (head, body)
}

fn serve(client: TcpStream, upstream: &str, step: Step, keys: &Mutex<Vec<String>>) {
    let mut reader = BufReader::new(client.try_clone().unwrap());
    let (head, body) = read_message(&mut reader);
    if let Some(key) = head.lines().find_map(|l| {
        l.split_once(':')
            .filter(|(n, _)| n.eq_ignore_ascii_case("idempotency-key"))
    }) {
        keys.lock().unwrap().push(key.1.trim().to_owned());
    }
    let mut client = client;
    let answer = match step {
        Step::Answer(ref raw) => raw.as_bytes().to_vec(),
        Step::Forward | Step::ForwardThenCut => {
            let mut server = TcpStream::connect(upstream).unwrap();
            server.write_all(head.as_bytes()).unwrap();
            server.write_all(&body).unwrap();
            let (head, body) = read_message(&mut BufReader::new(server));
            // One request per connection: tell the client.
            let head = head.replacen("\r\n", "\r\nConnection: close\r\n", 1);
            [head.into_bytes(), body].concat()
        }
    };
    if !matches!(step, Step::ForwardThenCut) {
        client.write_all(&answer).unwrap();
    }
    let _ = client.shutdown(std::net::Shutdown::Both);
}

fn config(base_url: &str, token: &str) -> Config {
    let mut config = Config::new(base_url, token);
    config.base_delay = Duration::from_millis(5);
    config.max_delay = Duration::from_secs(2);
    config
}

both_backends! {
    fn the_retrying_client_retries_a_lost_answer_with_the_same_key_and_gets_the_replay(backend) {
        let app = TestApp::spawn(backend);
        let front = Front::new(&app.address, vec![Step::ForwardThenCut]);

        let created = create_order(&config(&front.address, &app.token), &order_body("Widget", 2, "9.99")).unwrap();

        assert_eq!(front.keys(), vec![created.key.clone(), created.key.clone()], "the retry used the same key");
        assert!(created.replayed, "the second attempt replayed the first one's order");
        assert_eq!(created.attempts, 2);
        assert_eq!(app.order_count(), 1);
        let id = created.order["id"].as_str().unwrap();
        assert_eq!(app.call("GET", &format!("/v1/orders/{id}"), None, None).json(), created.order);
    }

    fn the_retrying_client_waits_out_in_progress_and_5xx_answers_with_the_same_key(backend) {
        let app = TestApp::spawn(backend);
        let front = Front::new(&app.address, vec![
            problem("409 Conflict", "IDEMPOTENCY_IN_PROGRESS", Some(1)),
            problem("503 Service Unavailable", "SERVICE_UNAVAILABLE", None),
            Step::Forward,
        ]);

        let created = create_order(&config(&front.address, &app.token), &order_body("Widget", 1, "1.00")).unwrap();

        let keys = front.keys();
        assert_eq!(keys.len(), 3);
        assert!(keys.iter().all(|k| *k == created.key), "{keys:?}");
        assert!(!created.replayed);
        assert_eq!(created.attempts, 3);
        assert_eq!(app.order_count(), 1);
    }

    fn the_retrying_client_does_not_retry_a_request_the_server_refused(backend) {
        let app = TestApp::spawn(backend);
        let front = Front::new(&app.address, vec![]);

        let failure = create_order(&config(&front.address, &app.token), &order_body("Widget", 0, "1.00")).unwrap_err();

        assert!(matches!(failure, Failure::Rejected { status: 422, .. }), "{failure}");
        assert_eq!(front.keys().len(), 1, "one attempt only");
        assert_eq!(app.order_count(), 0);
    }

    fn the_retrying_client_gives_up_after_its_attempts_when_nothing_answers(backend) {
        let app = TestApp::spawn(backend);
        let nobody = format!("http://127.0.0.1:{}", crate::process::free_port());
        let mut config = config(&nobody, &app.token);
        config.max_attempts = 3;

        let failure = create_order(&config, &order_body("Widget", 1, "1.00")).unwrap_err();

        assert!(matches!(failure, Failure::GaveUp { attempts: 3, .. }), "{failure}");
        assert_eq!(app.order_count(), 0);
    }

    fn the_retrying_client_uses_a_new_key_only_for_a_new_order(backend) {
        let app = TestApp::spawn(backend);
        let config = config(&app.address, &app.token);
        let body = order_body("Widget", 1, "1.00");

        let first = create_order(&config, &body).unwrap();
        let second = create_order(&config, &body).unwrap();

        assert_ne!(first.key, second.key);
        assert_ne!(first.order["id"], second.order["id"]);
        assert_eq!(app.order_count(), 2);
    }
}
