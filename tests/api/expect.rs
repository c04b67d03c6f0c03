//! Assertions the contract tests share: problem documents, replays, the raw
//! text of JSON members, and requests too odd for an HTTP client library.

#![allow(dead_code)] // each test module uses a different part

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use serde_json::Value;

use crate::helpers::{TestApp, TestResponse};

pub const PROBLEM_JSON: &str = "application/problem+json";
pub const MISSING_KEY_DETAIL: &str = "Idempotency-Key header is required";

/// `response` is an RFC 9457 problem with this status and `error` code, and
/// every member the contract names.
pub fn assert_problem(response: &TestResponse, status: u16, code: &str) {
    assert_eq!(
        response.status, status,
        "unexpected status; body: {}",
        response.body
    );
    assert_eq!(
        response.header("Content-Type"),
        Some(PROBLEM_JSON),
        "a problem must be served as {PROBLEM_JSON}; body: {}",
        response.body
    );
    let problem = response.json();
    assert_eq!(problem["error"], code, "{}", response.body);
    assert_eq!(problem["status"], status, "{}", response.body);
    for member in ["type", "title", "detail"] {
        assert!(
            problem[member].is_string(),
            "problem lacks `{member}`: {}",
            response.body
        );
    }
    assert_names_its_request(response);
}

/// The problem's `instance` is `urn:request:` and the id of the request that
/// produced it: the one it answers (its `X-Request-Id` answer header), or on
/// a replay the recorded request's, which [`assert_replay_of`] checks.
pub fn assert_names_its_request(response: &TestResponse) {
    let request_id = response
        .header("X-Request-Id")
        .unwrap_or_else(|| panic!("no X-Request-Id on {}", response.body));
    let instance = response.json()["instance"].clone();
    if response.header("Idempotent-Replayed") == Some("true") {
        assert!(
            instance
                .as_str()
                .is_some_and(|i| i.starts_with("urn:request:")),
            "a replayed problem names the request that produced it: {}",
            response.body
        );
        return;
    }
    assert_eq!(
        instance,
        format!("urn:request:{request_id}"),
        "a problem names its request as `instance`: {}",
        response.body
    );
}

/// A `422 VALIDATION_FAILED` whose `errors` name exactly `fields`, once each.
pub fn assert_invalid_fields(response: &TestResponse, fields: &[&str]) {
    assert_problem(response, 422, "VALIDATION_FAILED");
    let mut got = failing_fields(response);
    got.sort();
    let mut want: Vec<String> = fields.iter().map(|f| (*f).to_owned()).collect();
    want.sort();
    assert_eq!(got, want, "{}", response.body);
}

/// The `field` of every entry of a problem's `errors`.
pub fn failing_fields(response: &TestResponse) -> Vec<String> {
    let problem = response.json();
    let errors = problem["errors"]
        .as_array()
        .unwrap_or_else(|| panic!("no errors array in {}", response.body));
    errors
        .iter()
        .map(|e| {
            assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{e}");
            e["field"]
                .as_str()
                .unwrap_or_else(|| panic!("no field in {e}"))
                .to_owned()
        })
        .collect()
}

/// A `400 VALIDATION_FAILED` about the key whose detail contains `says`.
pub fn assert_key_refused(response: &TestResponse, says: &str) {
    assert_problem(response, 400, "VALIDATION_FAILED");
    let detail = response.json()["detail"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        detail.contains(says),
        "detail {detail:?} should say {says:?}"
    );
}

/// `replay` answers a retry of the request that got `first`: the recorded
/// status (a `201` as `200`), body and allow-listed headers, marked replayed.
pub fn assert_replay_of(first: &TestResponse, replay: &TestResponse) {
    assert_ne!(
        first.header("Idempotent-Replayed"),
        Some("true"),
        "the first answer is no replay"
    );
    let status = if first.status == 201 {
        200
    } else {
        first.status
    };
    assert_eq!(replay.status, status, "{}", replay.body);
    assert_eq!(replay.header("Idempotent-Replayed"), Some("true"));
    assert_eq!(
        replay.body, first.body,
        "a replay is the recorded body byte for byte, a problem's `instance` included"
    );
    for name in ["Content-Type", "Location"] {
        assert_eq!(
            replay.header(name),
            first.header(name),
            "{name} is replayed"
        );
    }
}

/// A fresh answer: the mutation ran for this request.
pub fn assert_not_replayed(response: &TestResponse) {
    assert_eq!(
        response.header("Idempotent-Replayed"),
        None,
        "{}",
        response.body
    );
}

/// The exact JSON text of the top-level member `name` of a flat object, as
/// it is on the wire (no float parsing).
pub fn raw_member<'a>(body: &'a str, name: &str) -> &'a str {
    let needle = format!("\"{name}\":");
    let start = body
        .find(&needle)
        .unwrap_or_else(|| panic!("no `{name}` in {body}"))
        + needle.len();
    let rest = body[start..].trim_start();
    let end = rest.find([',', '}']).unwrap_or(rest.len());
    rest[..end].trim_end()
}

/// The stored order as the API would show it, read straight from the
/// database (`None` when `user` has no such order).
pub fn stored_order(app: &TestApp, user: &str, id: &str) -> Option<Value> {
    let mut pooled = app.pool.get().expect("connection");
    match orders_api::orders::get(&mut pooled.conn(), user, id) {
        Ok(order) => Some(serde_json::to_value(order.view()).expect("order as JSON")),
        Err(orders_api::orders::OrdersError::NotFound) => None,
        Err(e) => panic!("reading order {id}: {e}"),
    }
}

/// The `id` of an order response.
pub fn id_of(response: &TestResponse) -> String {
    response.json()["id"]
        .as_str()
        .unwrap_or_else(|| panic!("no id in {}", response.body))
        .to_owned()
}

/// A raw answer to a raw request.
#[derive(Debug)]
pub struct RawResponse {
    pub status: u16,
    /// The header block, lowercased.
    pub head: String,
    pub body: String,
}

/// Sends `head` (request line and headers, without the blank line, CRLF
/// separated) and `body` byte for byte, for what no client library would
/// send: non-ASCII header bytes, bodies that are not UTF-8.
pub fn raw_request(app: &TestApp, head: &[u8], body: &[u8]) -> RawResponse {
    let authority = app.address.trim_start_matches("http://");
    let mut stream = TcpStream::connect(authority).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .expect("timeout");
    let mut request = head.to_vec();
    request.extend_from_slice(
        format!(
            "\r\nHost: {authority}\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .as_bytes(),
    );
    request.extend_from_slice(body);
    stream.write_all(&request).expect("send");
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).expect("read");
    let text = String::from_utf8_lossy(&answer).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {head}"));
    RawResponse {
        status,
        head: head.to_ascii_lowercase(),
        body: body.to_owned(),
    }
}
