//! Abuse and resource bounds: what an unauthenticated
//! client can make the service keep — metric series, database work per
//! scrape, connections held by slow or oversized requests — is bounded.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use orders_api::startup::{MAX_REQUEST_HEAD_BYTES, MAX_REQUEST_HEADERS};

use crate::both_backends;
use crate::helpers::*;
use crate::net::Client;
use crate::operability::scrape_text;
use crate::process::{self, ServerProcess};

const TIMEOUT: Duration = Duration::from_secs(30);
/// Far beyond every limit under test: a connection still open then was
/// never cut off.
const PATIENCE: Duration = Duration::from_secs(20);

/// The value of the unlabelled ledger gauge, if the scrape has it.
fn ledger_rows(metrics: &str) -> Option<f64> {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix("idempotency_ledger_rows "))
        .and_then(|v| v.trim().parse().ok())
}

/// A client inventing HTTP methods (no token needed) creates no
/// new series: before the fix each method added a counter and a histogram.
#[test]
fn a_thousand_invented_http_methods_leave_the_metrics_the_same_size() {
    let db = TestDb::fresh(orders_api::db::Backend::Sqlite);
    process::prepare(&db.url);
    let server = ServerProcess::start(&db.url, &[]);
    let address = server.address();
    // By hand: HTTP clients refuse to send methods they do not know.
    let send = |method: &str, path: &str| {
        let request =
            format!("{method} {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
        let (answer, _) = exchange(&address, request.as_bytes());
        assert!(
            answer.starts_with("HTTP/1.1 "),
            "{method} {path}: {answer:?}"
        );
    };
    let paths = ["/healthz", "/v1/orders", "/no/such/path"];
    // Every series the loop below can touch exists once before measuring.
    for path in paths {
        send("WARMUP", path);
    }
    let before = scrape_text(&server);

    for i in 0..1_000 {
        send(&format!("FOO{i}"), paths[i % paths.len()]);
    }
    let after = scrape_text(&server);

    assert!(
        after.len().abs_diff(before.len()) < 2_048,
        "/metrics grew from {} to {} bytes",
        before.len(),
        after.len()
    );
    assert!(
        !after.contains("FOO") && !after.contains("WARMUP"),
        "{after}"
    );
    assert!(after.contains(r#"method="other""#), "{after}");
}

both_backends! {
    /// `/metrics` is unauthenticated, so a scrape must not cost a
    /// count over the ledger: it reads the count the background task made
    /// (at start, then every minute at most). Rows written after that count
    /// do not show however often the service is scraped.
    fn a_scrape_reads_the_last_background_count_and_never_counts_the_ledger_itself(backend) {
        let db = TestDb::fresh(backend);
        let pool = process::prepare(&db.url);
        let token = process::create_token(&pool, "alice");
        let server = ServerProcess::start(&db.url, &[]);
        let client = Client::new(&server.address(), &token, TIMEOUT);
        let deadline = std::time::Instant::now() + TIMEOUT;
        while ledger_rows(&scrape_text(&server)).is_none() {
            assert!(std::time::Instant::now() < deadline, "the ledger was never counted");
            std::thread::sleep(Duration::from_millis(50));
        }

        for key in ["scrape-1", "scrape-2"] {
            assert_eq!(client.post_order(key, &order_body("Widget", 1, "1.00")).unwrap().status, 201);
        }
        let gauges: Vec<Option<f64>> = (0..20).map(|_| ledger_rows(&scrape_text(&server))).collect();

        assert_eq!(process::ledger_count(&pool), 2);
        assert_eq!(gauges, vec![Some(0.0); 20], "a scrape counted the ledger");
    }

    /// A body trickled one byte a second after a complete head
    /// is answered `408 REQUEST_TIMEOUT` once `BODY_TIMEOUT` (10 s) has
    /// passed, long before `PATIENCE`, and the connection closed; nothing
    /// is recorded and the key stays free. Before, the body had no
    /// deadline: the connection stayed open as long as the client trickled.
    fn a_client_trickling_its_body_is_answered_408_disconnected_and_nothing_is_recorded(backend) {
        let app = TestApp::spawn(backend);
        let body = order_body("Widget", 1, "1.00");
        let padded = format!("{body:<200}");
        let mut stream = connect(&app.address);
        let head = format!(
            "POST /v1/orders HTTP/1.1\r\nHost: test\r\nAuthorization: Bearer {}\r\n\
             Idempotency-Key: trickled\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n",
            app.token,
            padded.len()
        );
        stream.write_all(head.as_bytes()).expect("send the head");
        let done = AtomicBool::new(false);

        let (answer, closed) = std::thread::scope(|s| {
            let mut writer = stream.try_clone().expect("clone the stream");
            let (done, bytes) = (&done, padded.as_bytes());
            s.spawn(move || {
                for byte in bytes.chunks(1).take(PATIENCE.as_secs() as usize + 5) {
                    if done.load(Ordering::SeqCst) || writer.write_all(byte).is_err() {
                        return;
                    }
                    std::thread::sleep(Duration::from_secs(1));
                }
            });
            let result = read_until_closed(&mut stream);
            done.store(true, Ordering::SeqCst);
            result
        });

        assert!(answer.starts_with("HTTP/1.1 408"), "answer: {answer:?}");
        assert!(answer.contains("REQUEST_TIMEOUT"), "answer: {answer:?}");
        assert!(closed, "the trickling client's connection is still open");
        assert_eq!((app.order_count(), app.ledger_count()), (0, 0), "nothing recorded");
        let retry = app.post_order(Some("trickled"), &body);
        assert_eq!(retry.status, 201, "the key is free: {}", retry.body);
    }

    /// A chunked body whose chunk announces more than is sent (`10001`,
    /// then `ab` and silence) is answered `408 REQUEST_TIMEOUT` at the body
    /// deadline and its connection closed: what the client sends after the
    /// answer — the rest of the body and a pipelined create — is never
    /// parsed, and nothing is created. Before, the server went on reading
    /// the chunked body after its `408` (`connection: close` notwithstanding)
    /// and answered the pipelined create `201`.
    fn an_unfinished_chunked_body_is_answered_408_closed_and_nothing_after_it_is_read(backend) {
        let app = TestApp::spawn(backend);
        let mut stream = connect(&app.address);
        let head = format!(
            "POST /v1/orders HTTP/1.1\r\nHost: test\r\nAuthorization: Bearer {}\r\n\
             Idempotency-Key: unfinished\r\nContent-Type: application/json\r\n\
             Transfer-Encoding: chunked\r\n\r\n10001\r\nab",
            app.token
        );
        stream.write_all(head.as_bytes()).expect("send the head");
        let answered = read_until(&mut stream, "REQUEST_TIMEOUT");

        let body = order_body("Widget", 1, "1.00");
        let rest = format!(
            "{}\r\n0\r\n\r\nPOST /v1/orders HTTP/1.1\r\nHost: test\r\nAuthorization: Bearer {}\r\n\
             Idempotency-Key: pipelined\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n{body}",
            "a".repeat(0x10001 - 2),
            app.token,
            body.len()
        );
        // The server may have closed already: a failed write is fine.
        let _ = stream.write_all(rest.as_bytes());
        let (after, closed) = read_until_closed(&mut stream);

        assert!(answered.starts_with("HTTP/1.1 408"), "answer: {answered:?}");
        assert!(
            answered.to_ascii_lowercase().contains("connection: close"),
            "answer: {answered:?}"
        );
        assert!(!after.contains("HTTP/1.1 "), "answered after the 408: {after:?}");
        assert!(closed, "the connection is still open after its 408");
        assert_eq!((app.order_count(), app.ledger_count()), (0, 0), "nothing created");
    }

    /// A client without a token holds thousands of unfinished chunked
    /// requests open (`10001`, `ab`, then silence): each is answered (`401`)
    /// and closed by the server, and another user's requests are answered
    /// meanwhile. Before, the server kept reading each unfinished body after
    /// its answer, with no deadline: every connection stayed open for as long
    /// as the client kept it, and enough of them (two workers' 4,096 each)
    /// left no connection for anyone else.
    fn thousands_of_unfinished_chunked_requests_without_a_token_are_answered_and_closed(backend) {
        let app = TestApp::spawn(backend);
        let held = flood_connections();
        let request = b"POST /v1/orders HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n\
                        Transfer-Encoding: chunked\r\n\r\n10001\r\nab";
        let mut streams: Vec<TcpStream> = (0..held)
            .map(|_| {
                let mut stream = connect(&app.address);
                stream.write_all(request).expect("send the unfinished request");
                stream
            })
            .collect();

        let listed = app.call("GET", "/v1/orders", None, None);
        let created = app.post_order(Some("beside-the-flood"), &order_body("Widget", 1, "1.00"));

        assert_eq!(listed.status, 200, "{}", listed.body);
        assert_eq!(created.status, 201, "{}", created.body);
        for (i, stream) in streams.iter_mut().enumerate() {
            let (answer, closed) = read_until_closed(stream);
            assert!(answer.starts_with("HTTP/1.1 401"), "connection {i}: {answer:?}");
            assert!(closed, "connection {i} of {held} is still held open by the server");
        }
    }
}

/// Reads until the server closes the connection (or `PATIENCE` runs out);
/// returns what arrived and whether the server closed it.
fn read_until_closed(stream: &mut TcpStream) -> (String, bool) {
    stream
        .set_read_timeout(Some(PATIENCE))
        .expect("read timeout");
    let mut received = Vec::new();
    let mut chunk = [0_u8; 4096];
    let closed = loop {
        match stream.read(&mut chunk) {
            Ok(0) => break true,
            Ok(n) => received.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                break false;
            }
            // A reset is the server closing too.
            Err(_) => break true,
        }
    };
    (String::from_utf8_lossy(&received).into_owned(), closed)
}

/// Reads until what arrived contains `needle` (or `PATIENCE` runs out, or
/// the connection closes); returns what arrived.
fn read_until(stream: &mut TcpStream, needle: &str) -> String {
    stream
        .set_read_timeout(Some(PATIENCE))
        .expect("read timeout");
    let mut received = Vec::new();
    let mut chunk = [0_u8; 4096];
    while !String::from_utf8_lossy(&received).contains(needle) {
        match stream.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => received.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    String::from_utf8_lossy(&received).into_owned()
}

/// How many connections the flood holds: 2,000, or fewer when this process
/// may not open that many files (both ends of each connection are ours).
fn flood_connections() -> usize {
    let limit = std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|limits| {
            limits
                .lines()
                .find(|l| l.starts_with("Max open files"))
                .and_then(|l| l.split_whitespace().nth(3)?.parse::<usize>().ok())
        })
        .unwrap_or(1024);
    2_000.min(limit.saturating_sub(512) / 2)
}

fn connect(address: &str) -> TcpStream {
    TcpStream::connect(address.trim_start_matches("http://")).expect("connect")
}

/// Sends `bytes` on a new connection to `address` and reads until the server
/// closes it: what arrived, and whether it was closed.
fn exchange(address: &str, bytes: &[u8]) -> (String, bool) {
    let mut stream = connect(address);
    stream.write_all(bytes).expect("send");
    read_until_closed(&mut stream)
}

/// A client that sends its headers one byte a second is answered
/// `408` and disconnected (`CLIENT_REQUEST_TIMEOUT`, 5 s), long before
/// `PATIENCE` — it cannot hold a connection by trickling.
#[test]
fn a_client_trickling_its_headers_is_answered_408_and_disconnected() {
    let app = TestApp::spawn(orders_api::db::Backend::Sqlite);
    let mut stream = connect(&app.address);
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: test\r\nX-Slow: ")
        .expect("send the start of the head");
    let done = AtomicBool::new(false);

    let (answer, closed) = std::thread::scope(|s| {
        let mut writer = stream.try_clone().expect("clone the stream");
        let done = &done;
        s.spawn(move || {
            for _ in 0..PATIENCE.as_secs() {
                if done.load(Ordering::SeqCst) || writer.write_all(b"a").is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_secs(1));
            }
        });
        let result = read_until_closed(&mut stream);
        done.store(true, Ordering::SeqCst);
        result
    });

    assert!(answer.starts_with("HTTP/1.1 408"), "answer: {answer:?}");
    assert!(closed, "the trickling client's connection is still open");
}

/// An idle keep-alive connection is closed by the server
/// (`KEEP_ALIVE`, 5 s) instead of being held open.
#[test]
fn an_idle_keep_alive_connection_is_closed_by_the_server() {
    let app = TestApp::spawn(orders_api::db::Backend::Sqlite);

    let (answer, closed) = exchange(&app.address, b"GET /healthz HTTP/1.1\r\nHost: test\r\n\r\n");

    assert!(answer.starts_with("HTTP/1.1 200"), "answer: {answer:?}");
    assert_eq!(answer.matches("HTTP/1.1 ").count(), 1, "{answer:?}");
    assert!(closed, "the idle connection is still open");
}

/// A request head over `MAX_REQUEST_HEAD_BYTES`, or with more than
/// `MAX_REQUEST_HEADERS` fields, is refused with `431` and the connection
/// closed; a head well inside the limits is served.
#[test]
fn a_request_head_over_the_limits_is_refused_with_431() {
    let app = TestApp::spawn(orders_api::db::Backend::Sqlite);
    let start = "GET /healthz HTTP/1.1\r\nHost: test\r\nX-Big: ";

    // Exactly the limit, and still no end of the head.
    let filler = "a".repeat(MAX_REQUEST_HEAD_BYTES - start.len());
    let (answer, closed) = exchange(&app.address, format!("{start}{filler}").as_bytes());
    assert!(answer.starts_with("HTTP/1.1 431"), "answer: {answer:?}");
    assert!(closed);

    let fields: String = (0..MAX_REQUEST_HEADERS)
        .map(|i| format!("X-Field-{i}: {i}\r\n"))
        .collect();
    let request = format!("GET /healthz HTTP/1.1\r\nHost: test\r\n{fields}\r\n");
    let (answer, closed) = exchange(&app.address, request.as_bytes());
    assert!(answer.starts_with("HTTP/1.1 431"), "answer: {answer:?}");
    assert!(closed);

    let half = "a".repeat(MAX_REQUEST_HEAD_BYTES / 2);
    let served = app.request("GET", "/healthz", &[("X-Big", half.as_str())], None);
    assert_eq!(served.status, 200, "{}", served.body);
}

/// What actix-http refuses before the application sees a request, as the
/// wire shows it (and API.md documents it): a folded header, two
/// `Content-Length`s (equal or not), and `Content-Length` with
/// `Transfer-Encoding` are each answered an empty `400` with
/// `connection: close` — no problem document, which the application never
/// gets to write — and the connection is closed; nothing is created.
#[test]
fn requests_refused_below_the_application_get_an_empty_400_and_a_closed_connection() {
    let app = TestApp::spawn(orders_api::db::Backend::Sqlite);
    let post = |framing: &str, body: &str| {
        format!(
            "POST /v1/orders HTTP/1.1\r\nHost: test\r\nAuthorization: Bearer {}\r\n\
             Idempotency-Key: framed\r\nContent-Type: application/json\r\n{framing}\r\n{body}",
            app.token
        )
    };
    let order = order_body("Widget", 1, "1.00");
    let n = order.len();
    for (what, request) in [
        (
            "a folded header",
            "GET /healthz HTTP/1.1\r\nHost: test\r\nX-Folded: a\r\n b\r\n\r\n".to_owned(),
        ),
        (
            "two Content-Lengths",
            post(
                &format!("Content-Length: {n}\r\nContent-Length: 2\r\n"),
                &order,
            ),
        ),
        (
            "two equal Content-Lengths",
            post(
                &format!("Content-Length: {n}\r\nContent-Length: {n}\r\n"),
                &order,
            ),
        ),
        (
            "Content-Length and Transfer-Encoding",
            post(
                &format!("Content-Length: {n}\r\nTransfer-Encoding: chunked\r\n"),
                &format!("{n:x}\r\n{order}\r\n0\r\n\r\n"),
            ),
        ),
    ] {
        let (answer, closed) = exchange(&app.address, request.as_bytes());
        let lower = answer.to_ascii_lowercase();
        assert!(answer.starts_with("HTTP/1.1 400"), "{what}: {answer:?}");
        assert!(
            lower.contains("content-length: 0\r\n"),
            "{what}: {answer:?}"
        );
        assert!(
            lower.contains("connection: close\r\n"),
            "{what}: {answer:?}"
        );
        assert!(closed, "{what}: the connection is still open");
    }
    assert_eq!(app.order_count(), 0);
}

/// A chunk whose size overflows or is negative is, to actix-http, an I/O
/// error on the connection: it is closed, and the application's answer
/// (`400 MALFORMED_JSON`, the body could not be read) reaches the client
/// only when it was already being written. Either way nothing is created,
/// no `2xx` is sent, and the connection does not stay open.
#[test]
fn a_malformed_chunk_is_never_taken_and_its_connection_is_closed() {
    let app = TestApp::spawn(orders_api::db::Backend::Sqlite);
    for (i, chunk) in ["ffffffffffffffffffff\r\nab", "-1\r\nab"]
        .into_iter()
        .enumerate()
    {
        let request = format!(
            "POST /v1/orders HTTP/1.1\r\nHost: test\r\nAuthorization: Bearer {}\r\n\
             Idempotency-Key: chunk-{i}\r\nContent-Type: application/json\r\n\
             Transfer-Encoding: chunked\r\n\r\n{chunk}",
            app.token
        );
        let (answer, closed) = exchange(&app.address, request.as_bytes());
        assert!(
            answer.is_empty() || answer.starts_with("HTTP/1.1 400"),
            "{chunk:?}: {answer:?}"
        );
        if !answer.is_empty() {
            assert!(answer.contains("MALFORMED_JSON"), "{chunk:?}: {answer:?}");
        }
        assert!(closed, "{chunk:?}: the connection is still open");
    }
    assert_eq!((app.order_count(), app.ledger_count()), (0, 0));
}
