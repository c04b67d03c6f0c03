//! `chaos`'s clients: each a thread (a history's `process`) that creates,
//! updates, cancels and reads orders, each change with a key of its own,
//! and retries as generated API SDKs do: the same key and body on every
//! attempt, `X-Should-Retry` obeyed, otherwise no answer, `408`, `429` and
//! 5xx retried (a bare `409` not), after `Retry-After` when the server gave
//! one and else a doubling pause with jitter — a bounded number of times,
//! within a bounded time. Now and then one re-sends a request it made
//! before (a double submission: a replay is due) or sends another body
//! under a key it used (a refusal is due). Every attempt is recorded.

use std::fs::File;
use std::io::{LineWriter, Write};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use super::rng::Rng;
use crate::history::{Event, F, Process, Type};
use crate::wire;

/// Attempts of one operation at most.
pub const MAX_ATTEMPTS: u32 = 12;
/// How long one operation may keep retrying.
pub const OP_BUDGET: Duration = Duration::from_secs(20);
/// How long one attempt may take.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// The first pause before a retry; it doubles up to [`MAX_BACKOFF`].
const BASE_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(2);
/// The longest `Retry-After` obeyed.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(5);
/// Pages of a listing read at most (100 orders each).
const MAX_PAGES: usize = 1000;
/// Attempts of one page of the closing list (the server may be restarting).
pub const PAGE_ATTEMPTS: u32 = 30;
/// Orders of a user that its clients pick from (the newest), so that
/// several clients work on one order at once.
const RECENT_ORDERS: usize = 16;

/// Nanoseconds since the epoch.
pub fn now_nanos() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or_default()
}

/// The history as it is observed: each event one line, in the order
/// recorded (an invoke before its request is sent, a completion after its
/// answer came), kept and written to the history file as it happens.
pub struct Recorder {
    inner: Mutex<Recorded>,
}

struct Recorded {
    lines: Vec<String>,
    file: Option<LineWriter<File>>,
    /// The first write to the file that failed.
    error: Option<String>,
}

impl Recorder {
    pub fn new(file: Option<File>) -> Self {
        Self {
            inner: Mutex::new(Recorded {
                lines: Vec::new(),
                file: file.map(LineWriter::new),
                error: None,
            }),
        }
    }

    pub fn record(&self, event: &Event) {
        let line = event.to_line();
        let Ok(mut recorded) = self.inner.lock() else {
            return;
        };
        if let Some(file) = recorded.file.as_mut()
            && let Err(e) = writeln!(file, "{line}")
        {
            recorded.error.get_or_insert_with(|| e.to_string());
        }
        recorded.lines.push(line);
    }

    /// Every line so far, and the first write error.
    pub fn finish(&self) -> (Vec<String>, Option<String>) {
        let Ok(mut recorded) = self.inner.lock() else {
            return (Vec::new(), Some("the recorder was poisoned".into()));
        };
        if let Some(file) = recorded.file.as_mut()
            && let Err(e) = file.flush()
        {
            recorded.error.get_or_insert_with(|| e.to_string());
        }
        (recorded.lines.clone(), recorded.error.clone())
    }
}

/// A user the clients act as.
pub struct UserSide {
    /// Its name in the history (`user-a`, `user-b`).
    pub label: String,
    pub token: Option<String>,
    /// Ids of its orders that a create's answer named, newest last.
    pub orders: Mutex<Vec<Value>>,
}

/// One request, and how the history names it.
struct Call {
    f: F,
    method: &'static str,
    path: String,
    key: Option<String>,
    body: Option<Value>,
    /// The invoke's `value`.
    value: Value,
}

/// What the clients share.
pub struct Shared<'a> {
    pub recorder: &'a Recorder,
    /// Where the clients send: the proxy.
    pub base: String,
    pub run_id: String,
    pub users: &'a [UserSide],
    pub seed: u64,
    /// No operation starts after this.
    pub until: Instant,
    /// How long one operation may keep retrying ([`OP_BUDGET`]).
    pub op_budget: Duration,
}

/// The kinds of operation a client picks from, with their weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Create,
    Resend,
    OtherBody,
    Update,
    Cancel,
    Read,
}

const KINDS: [(Kind, u64); 6] = [
    (Kind::Create, 30),
    (Kind::Resend, 10),
    (Kind::OtherBody, 8),
    (Kind::Update, 25),
    (Kind::Cancel, 10),
    (Kind::Read, 17),
];
/// What every client does first, so that each kind runs in every run.
const PRELUDE: [Kind; 6] = [
    Kind::Create,
    Kind::Resend,
    Kind::OtherBody,
    Kind::Update,
    Kind::Read,
    Kind::Cancel,
];

/// Client `n`: operations until `until`, each retried until answered, or
/// out of attempts or time.
pub fn client(shared: &Shared<'_>, n: usize) {
    let Some(user) = shared.users.get(n % shared.users.len().max(1)) else {
        return;
    };
    let mut rng = Rng::fork(shared.seed, n as u64);
    let agent = wire::agent(REQUEST_TIMEOUT, "orders-atk-chaos");
    // This client's creates: key and body.
    let mut mine: Vec<(String, Value)> = Vec::new();
    let mut count = 0usize;
    while Instant::now() < shared.until {
        let kind = match PRELUDE.get(count) {
            Some(kind) => *kind,
            None => {
                let weights: Vec<u64> = KINDS.iter().map(|(_, w)| *w).collect();
                KINDS
                    .get(rng.weighted(&weights))
                    .map_or(Kind::Create, |(k, _)| *k)
            }
        };
        count += 1;
        let key = format!("chaos-{}-{n}-{count}", shared.run_id);
        let recent = user.orders.lock().ok().and_then(|orders| {
            let from = orders.len().saturating_sub(RECENT_ORDERS);
            let recent = orders.get(from..)?;
            let pick = usize::try_from(rng.below(recent.len() as u64)).ok()?;
            recent.get(pick).cloned()
        });
        let earlier = match mine.len() {
            0 => None,
            len => usize::try_from(rng.below(len as u64))
                .ok()
                .and_then(|i| mine.get(i))
                .cloned(),
        };
        let call = match (kind, earlier, recent) {
            (Kind::Resend, Some((key, body)), _) => create(key, body),
            (Kind::OtherBody, Some((key, mut body)), _) => {
                let quantity = body.get("quantity").and_then(Value::as_u64).unwrap_or(1);
                body["quantity"] = json!(quantity + rng.between(1, 5));
                create(key, body)
            }
            (Kind::Update, _, Some(id)) => {
                let mut body = serde_json::Map::new();
                while body.is_empty() {
                    if rng.percent(40) {
                        body.insert("item".into(), json!(format!("{key}-u")));
                    }
                    if rng.percent(60) {
                        body.insert("quantity".into(), json!(rng.between(1, 50)));
                    }
                    if rng.percent(50) {
                        body.insert("price".into(), price(&mut rng));
                    }
                }
                let body = Value::Object(body);
                Call {
                    f: F::Update,
                    method: "PATCH",
                    path: order_path(&id),
                    key: Some(key),
                    value: json!({"id": id, "body": body}),
                    body: Some(body),
                }
            }
            (Kind::Cancel, _, Some(id)) => Call {
                f: F::Cancel,
                method: "DELETE",
                path: order_path(&id),
                key: Some(key),
                body: None,
                value: json!({"id": id}),
            },
            (Kind::Read, _, Some(id)) => Call {
                f: F::Read,
                method: "GET",
                path: order_path(&id),
                key: None,
                body: None,
                value: json!({"id": id}),
            },
            _ => {
                let body = json!({
                    "item": key.clone(),
                    "quantity": rng.between(1, 20),
                    "price": price(&mut rng),
                });
                mine.push((key.clone(), body.clone()));
                create(key, body)
            }
        };
        let answered = perform(
            shared,
            &agent,
            user,
            &Process::Number(n as u64),
            &call,
            &mut rng,
        );
        if call.f == F::Create
            && let Some(id) = answered.as_ref().and_then(|body| body.get("id"))
            && let Ok(mut orders) = user.orders.lock()
            && !orders.contains(id)
        {
            orders.push(id.clone());
        }
    }
}

fn create(key: String, body: Value) -> Call {
    Call {
        f: F::Create,
        method: "POST",
        path: "/v1/orders".into(),
        key: Some(key),
        value: body.clone(),
        body: Some(body),
    }
}

/// A price of whole cents, written with two decimals (`12.30`).
fn price(rng: &mut Rng) -> Value {
    let cents = rng.between(1, 99_999);
    let text = format!("{}.{:02}", cents / 100, cents % 100);
    text.parse::<serde_json::Number>()
        .map(Value::Number)
        .unwrap_or(Value::Null)
}

fn order_path(id: &Value) -> String {
    let id = crate::history::id_text(id);
    let encoded: String = id
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect();
    format!("/v1/orders/{encoded}")
}

/// What an answer was: its type in the history, its value, and whether to
/// try again (and after how long, when the server said).
struct Judged {
    kind: Type,
    value: Value,
    retry: bool,
    after: Option<Duration>,
}

fn judge(answer: &Result<wire::Response, ureq::Error>) -> Judged {
    let response = match answer {
        Ok(response) => response,
        Err(e) => {
            return Judged {
                kind: Type::Info,
                value: json!({"error": e.to_string()}),
                retry: true,
                after: None,
            };
        }
    };
    let status = response.status;
    let body = response
        .json()
        .unwrap_or_else(|| Value::String(response.body.clone()));
    let kind = match status {
        200..=299 => Type::Ok,
        400 | 401 | 404 | 409 | 413 | 415 | 422 => Type::Fail,
        _ => Type::Info,
    };
    let hinted = response
        .header("X-Should-Retry")
        .map(|v| v.trim().eq_ignore_ascii_case("true"));
    let retry = kind != Type::Ok && hinted.unwrap_or(matches!(status, 408 | 429) || status >= 500);
    let after = response
        .header("Retry-After-Ms")
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_millis)
        .or_else(|| {
            response
                .header("Retry-After")
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map(Duration::from_secs)
        })
        .map(|d| d.min(MAX_RETRY_AFTER));
    Judged {
        kind,
        value: json!({"status": status, "body": body}),
        retry,
        after,
    }
}

/// Sends `call` until it is answered for good, or out of attempts or time;
/// records every attempt. The body of its ok, if one came.
fn perform(
    shared: &Shared<'_>,
    agent: &ureq::Agent,
    user: &UserSide,
    process: &Process,
    call: &Call,
    rng: &mut Rng,
) -> Option<Value> {
    let started = Instant::now();
    let mut headers: Vec<(&str, String)> = Vec::new();
    if let Some(token) = &user.token {
        headers.push(("Authorization", format!("Bearer {token}")));
    }
    if let Some(key) = &call.key {
        headers.push(("Idempotency-Key", key.clone()));
    }
    if call.body.is_some() {
        headers.push(("Content-Type", "application/json".into()));
    }
    let body = call.body.as_ref().map(Value::to_string);
    let url = format!("{}{}", shared.base, call.path);
    let event = |kind, value| Event {
        process: process.clone(),
        kind,
        f: call.f,
        user: user.label.clone(),
        key: call.key.clone(),
        value,
        time: now_nanos(),
    };
    for attempt in 0..MAX_ATTEMPTS {
        shared
            .recorder
            .record(&event(Type::Invoke, call.value.clone()));
        let answer = wire::exchange(agent, call.method, &url, &headers, body.as_deref());
        let judged = judge(&answer);
        shared
            .recorder
            .record(&event(judged.kind, judged.value.clone()));
        if judged.kind == Type::Ok {
            return judged.value.get("body").cloned();
        }
        if !judged.retry {
            return None;
        }
        let doubled = BASE_BACKOFF
            .saturating_mul(1u32.checked_shl(attempt).unwrap_or(u32::MAX))
            .min(MAX_BACKOFF);
        let most = u64::try_from(doubled.as_millis()).unwrap_or(2000);
        let pause = judged
            .after
            .unwrap_or_else(|| Duration::from_millis(rng.between(most / 2, most)));
        if started.elapsed() + pause >= shared.op_budget {
            return None;
        }
        std::thread::sleep(pause);
    }
    None
}

/// Every order of `user`, read page by page straight from the server (not
/// through the proxy), recorded as one `list` by process `lister`; the
/// server may be restarting, so each page is tried up to `attempts` times
/// ([`PAGE_ATTEMPTS`]: about a minute).
pub fn list_all(
    recorder: &Recorder,
    server: &str,
    user: &UserSide,
    attempts: u32,
) -> Result<usize, String> {
    let agent = wire::agent(REQUEST_TIMEOUT, "orders-atk-chaos");
    let event = |kind, value| Event {
        process: Process::Name("lister".into()),
        kind,
        f: F::List,
        user: user.label.clone(),
        key: None,
        value,
        time: now_nanos(),
    };
    recorder.record(&event(Type::Invoke, Value::Null));
    let mut headers: Vec<(&str, String)> = Vec::new();
    if let Some(token) = &user.token {
        headers.push(("Authorization", format!("Bearer {token}")));
    }
    let mut orders: Vec<Value> = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..MAX_PAGES {
        let query = match &cursor {
            Some(c) => format!("limit=100&cursor={}", query_encode(c)),
            None => "limit=100".into(),
        };
        let url = format!("{server}/v1/orders?{query}");
        let mut last = String::new();
        let mut page = None;
        for attempt in 0..attempts {
            match wire::exchange(&agent, "GET", &url, &headers, None) {
                Ok(r) if r.status == 200 => {
                    page = r.json();
                    if page.is_none() {
                        last = format!("200 with a body that is not JSON: {}", r.body);
                    }
                    break;
                }
                Ok(r) if r.status < 500 && r.status != 408 && r.status != 429 => {
                    last = format!("{} {}", r.status, r.body);
                    break;
                }
                Ok(r) => last = format!("{} {}", r.status, r.body),
                Err(e) => last = e.to_string(),
            }
            let pause = BASE_BACKOFF
                .saturating_mul(1u32.checked_shl(attempt).unwrap_or(u32::MAX))
                .min(MAX_BACKOFF);
            std::thread::sleep(pause);
        }
        let Some(page) = page else {
            recorder.record(&event(Type::Info, json!({"error": last})));
            return Err(format!(
                "listing the orders of {} (GET {url}): {last}",
                user.label
            ));
        };
        let Some(data) = page.get("data").and_then(Value::as_array) else {
            recorder.record(&event(Type::Info, json!({"error": "no data array"})));
            return Err(format!(
                "listing the orders of {} (GET {url}) gave no `data` array: {page}",
                user.label
            ));
        };
        orders.extend(data.iter().cloned());
        let next = page
            .get("next_cursor")
            .and_then(Value::as_str)
            .map(str::to_owned);
        if next.is_none() || next == cursor {
            let count = orders.len();
            recorder.record(&event(Type::Ok, json!({"status": 200, "body": orders})));
            return Ok(count);
        }
        cursor = next;
    }
    recorder.record(&event(Type::Info, json!({"error": "too many pages"})));
    Err(format!(
        "{} has more than {} orders: too many to list",
        user.label,
        MAX_PAGES * 100
    ))
}

fn query_encode(raw: &str) -> String {
    raw.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::io::BufReader;
    use std::net::TcpListener;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::history::parse;
    use crate::wire::Message;

    /// A server on 127.0.0.1 that answers every request with `answer`, and
    /// how many requests it got.
    fn answering(answer: &'static str) -> (String, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = format!("http://{}", listener.local_addr().unwrap());
        let count = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&count);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { return };
                let Ok(reading) = stream.try_clone() else {
                    return;
                };
                if Message::read(&mut BufReader::new(reading)).is_some() {
                    counted.fetch_add(1, Ordering::SeqCst);
                    let _ = stream.write_all(answer.as_bytes());
                }
            }
        });
        (address, count)
    }

    fn user() -> UserSide {
        UserSide {
            label: "user-a".into(),
            token: None,
            orders: Mutex::new(Vec::new()),
        }
    }

    /// One create sent with `budget`; how many attempts the server got, and
    /// the history's lines.
    fn create_once(answer: &'static str, budget: Duration) -> (usize, Vec<String>) {
        let (address, count) = answering(answer);
        let recorder = Recorder::new(None);
        let users = [user()];
        let shared = Shared {
            recorder: &recorder,
            base: address,
            run_id: "test".into(),
            users: &users,
            seed: 1,
            until: Instant::now(),
            op_budget: budget,
        };
        let call = create(
            "k".into(),
            json!({"item": "pen", "quantity": 1, "price": 1}),
        );
        let agent = wire::agent(REQUEST_TIMEOUT, "test");
        let answered = perform(
            &shared,
            &agent,
            &users[0],
            &Process::Number(1),
            &call,
            &mut Rng::new(1),
        );
        assert_eq!(answered, None);
        (count.load(Ordering::SeqCst), recorder.finish().0)
    }

    const UNAVAILABLE: &str = "HTTP/1.1 503 Service Unavailable\r\nRetry-After-Ms: 0\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}";

    #[test]
    fn an_operation_is_tried_at_most_twelve_times_each_attempt_recorded() {
        let (attempts, lines) = create_once(UNAVAILABLE, OP_BUDGET);
        assert_eq!(attempts, MAX_ATTEMPTS as usize);
        let history = parse(&lines.join("\n")).unwrap();
        assert_eq!(history.operations.len(), MAX_ATTEMPTS as usize);
        assert!(
            lines.iter().all(|l| l.contains(r#""key":"k""#)),
            "the same key each time"
        );
        assert!(
            lines
                .iter()
                .skip(1)
                .step_by(2)
                .all(|l| l.contains(r#""type":"info""#))
        );
    }

    #[test]
    fn an_operation_stops_retrying_when_its_time_is_up() {
        let (attempts, _) = create_once(UNAVAILABLE, Duration::ZERO);
        assert_eq!(attempts, 1);
    }

    #[test]
    fn a_bare_409_is_not_retried_and_x_should_retry_decides_either_way() {
        let bare = "HTTP/1.1 409 Conflict\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}";
        assert_eq!(create_once(bare, OP_BUDGET).0, 1);
        let hinted = "HTTP/1.1 409 Conflict\r\nX-Should-Retry: true\r\nRetry-After-Ms: 0\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}";
        assert_eq!(create_once(hinted, OP_BUDGET).0, MAX_ATTEMPTS as usize);
        let refused = "HTTP/1.1 500 Internal Server Error\r\nX-Should-Retry: false\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}";
        assert_eq!(create_once(refused, OP_BUDGET).0, 1);
    }

    #[test]
    fn retry_after_is_obeyed_up_to_five_seconds() {
        let answer = |retry_after: &str| wire::Response {
            status: 503,
            headers: vec![("Retry-After".into(), retry_after.into())],
            body: String::new(),
        };
        assert_eq!(judge(&Ok(answer("2"))).after, Some(Duration::from_secs(2)));
        assert_eq!(judge(&Ok(answer("3600"))).after, Some(MAX_RETRY_AFTER));
        assert_eq!(judge(&Ok(answer("soon"))).after, None);
    }

    #[test]
    fn each_answer_is_recorded_as_the_contract_classifies_it() {
        let status = |status: u16| {
            judge(&Ok(wire::Response {
                status,
                headers: Vec::new(),
                body: "{}".into(),
            }))
            .kind
        };
        for s in [200, 201] {
            assert_eq!(status(s), Type::Ok);
        }
        for s in [400, 401, 404, 409, 413, 415, 422] {
            assert_eq!(status(s), Type::Fail, "{s}");
        }
        for s in [408, 429, 500, 502, 503, 403, 405] {
            assert_eq!(status(s), Type::Info, "{s}");
        }
    }

    #[test]
    fn a_page_of_the_closing_list_is_tried_its_number_of_times_then_the_list_is_unknown() {
        let (address, count) = answering(UNAVAILABLE);
        let recorder = Recorder::new(None);
        let refused = list_all(&recorder, &address, &user(), 3).unwrap_err();
        assert!(refused.contains("503"), "{refused}");
        assert_eq!(count.load(Ordering::SeqCst), 3);
        let (lines, _) = recorder.finish();
        assert_eq!(lines.len(), 2);
        assert!(lines[1].contains(r#""type":"info""#), "{lines:?}");
    }
}
