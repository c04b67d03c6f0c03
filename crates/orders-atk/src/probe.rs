//! What a check sees of its target: HTTP requests as one of two users, every
//! one kept as evidence (trimmed, tokens hidden), and the orders of this run
//! as the target's own listing shows them.

use std::collections::BTreeSet;
use std::sync::Barrier;
use std::time::Duration;

use serde::Serialize;
use serde_json::Value;

/// Longest body or header value kept in the evidence, in characters.
const EVIDENCE_CHARS: usize = 400;
/// Distinct answers kept per round of a race.
const RACE_EXCHANGES_KEPT: usize = 10;
/// Pages of the listing read to find this run's orders (newest first).
const LISTING_PAGES: usize = 5;
/// Response headers worth keeping as evidence; the rest is noise.
const EVIDENCE_HEADERS: &[&str] = &[
    "content-type",
    "location",
    "idempotent-replayed",
    "retry-after",
    "allow",
    "access-control-allow-origin",
    "access-control-allow-methods",
    "access-control-allow-headers",
    "access-control-allow-credentials",
];

/// The deployment under attack, and who the checks act as.
#[derive(Debug, Clone)]
pub struct Target {
    /// `http://host:port`, without a trailing slash.
    pub server: String,
    /// Where the orders collection lives, e.g. `/v1/orders`.
    pub base_path: String,
    /// User A's bearer token; checks that need it are skipped without it.
    pub token: Option<String>,
    /// User B's bearer token, for the tenancy checks.
    pub token_b: Option<String>,
    /// Concurrent requests in one round of the race (ATK-05).
    pub concurrency: usize,
    /// Marks everything this run creates: item `atk-<run id>`, keys `atk-<run id>-…`.
    pub run_id: String,
    /// How long one request may take.
    pub timeout: Duration,
}

impl Target {
    /// A target at `server` with the default base path, no tokens, a
    /// concurrency of 50 and a fresh run id.
    pub fn new(server: &str) -> Self {
        Self {
            server: server.trim_end_matches('/').to_owned(),
            base_path: super::DEFAULT_BASE_PATH.to_owned(),
            token: None,
            token_b: None,
            concurrency: super::DEFAULT_CONCURRENCY,
            run_id: new_run_id(),
            timeout: Duration::from_secs(30),
        }
    }

    /// The `item` of every order this run creates.
    pub fn item(&self) -> String {
        format!("atk-{}", self.run_id)
    }

    fn token_of(&self, user: User) -> Option<&str> {
        match user {
            User::A => self.token.as_deref(),
            User::B => self.token_b.as_deref(),
        }
    }

    pub(crate) fn agent(&self) -> ureq::Agent {
        crate::wire::agent(self.timeout, "orders-api-atk")
    }
}

/// Eight hex digits, fresh for each run.
fn new_run_id() -> String {
    let mut bytes = [0u8; 4];
    if getrandom::fill(&mut bytes).is_err() {
        // No entropy: the clock still tells runs apart.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or_default();
        bytes = nanos.to_be_bytes();
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Who sends a request: user A (`--token`) or user B (`--token-b`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub enum User {
    A,
    B,
}

/// Why a check failed, in one or two sentences.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure(pub String);

/// `Ok` when `holds`, else a failure that says `why`.
pub(crate) fn ensure(holds: bool, why: impl FnOnce() -> String) -> Result<(), Failure> {
    if holds { Ok(()) } else { Err(Failure(why())) }
}

pub use crate::wire::Response;

/// What the checks read of an answer, beyond [`crate::wire`]'s.
impl Response {
    /// The `id` member of a JSON object body.
    pub fn id(&self) -> Option<String> {
        self.json()?.get("id")?.as_str().map(str::to_owned)
    }

    /// Marked as a replay (`Idempotent-Replayed: true`).
    pub fn replayed(&self) -> bool {
        self.header("Idempotent-Replayed")
            .is_some_and(|v| v.eq_ignore_ascii_case("true"))
    }

    /// `status` and the start of the body, for a failure message.
    pub fn brief(&self) -> String {
        format!("{} {}", self.status, trim(&self.body, 160))
    }
}

/// One request and what came back, as kept in a report.
#[derive(Debug, Clone, Serialize)]
pub struct Exchange {
    pub request: SentRequest,
    /// `None` when no whole answer arrived (see `error`).
    pub response: Option<Answer>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct SentRequest {
    pub method: String,
    pub path: String,
    /// As user A or B; `None` without a token.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user: Option<User>,
    /// The headers sent, `Authorization` masked, values trimmed.
    pub headers: Vec<(String, String)>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub body: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Answer {
    pub status: u16,
    /// The headers a check judges (content type, location, replay, CORS…).
    pub headers: Vec<(String, String)>,
    pub body: String,
}

/// `text` cut to `max` characters, saying how long it was.
pub fn trim(text: &str, max: usize) -> String {
    let count = text.chars().count();
    if count <= max {
        return text.to_owned();
    }
    let kept: String = text.chars().take(max).collect();
    format!("{kept}… ({count} characters)")
}

/// A header value as evidence: quoted (whitespace shows), long ones cut.
fn quoted(value: &str) -> String {
    let count = value.chars().count();
    if count <= 80 {
        return format!("{value:?}");
    }
    let kept: String = value.chars().take(60).collect();
    format!("{kept:?}… ({count} characters)")
}

/// One request to send.
pub(crate) struct Call<'a> {
    pub method: &'a str,
    /// Relative to the server, e.g. `/v1/orders/…`.
    pub path: &'a str,
    pub user: Option<User>,
    pub headers: Vec<(&'a str, String)>,
    pub body: Option<String>,
}

impl<'a> Call<'a> {
    pub fn new(method: &'a str, path: &'a str) -> Self {
        Self {
            method,
            path,
            user: None,
            headers: Vec::new(),
            body: None,
        }
    }

    pub fn by(mut self, user: User) -> Self {
        self.user = Some(user);
        self
    }

    pub fn header(mut self, name: &'a str, value: impl Into<String>) -> Self {
        self.headers.push((name, value.into()));
        self
    }

    /// `Idempotency-Key: key` when `key` is some.
    pub fn key(self, key: Option<&str>) -> Self {
        match key {
            Some(key) => self.header("Idempotency-Key", key),
            None => self,
        }
    }

    /// A JSON body.
    pub fn json(self, body: impl Into<String>) -> Self {
        self.header("Content-Type", "application/json").body(body)
    }

    pub fn body(mut self, body: impl Into<String>) -> Self {
        self.body = Some(body.into());
        self
    }
}

/// A check's view of the target: it sends, and everything it sends is kept.
pub struct Probe<'t> {
    pub(crate) target: &'t Target,
    agent: ureq::Agent,
    pub(crate) exchanges: Vec<Exchange>,
    pub(crate) notes: Vec<String>,
    /// This run's orders per user before the check started.
    baseline: [BTreeSet<String>; 2],
    /// Order ids seen in answers (for the cleanup).
    pub(crate) seen: BTreeSet<(User, String)>,
}

impl<'t> Probe<'t> {
    pub(crate) fn new(target: &'t Target) -> Self {
        Self {
            target,
            agent: target.agent(),
            exchanges: Vec::new(),
            notes: Vec::new(),
            baseline: [BTreeSet::new(), BTreeSet::new()],
            seen: BTreeSet::new(),
        }
    }

    /// Remembers which orders of this run exist now, so that a check can
    /// tell which ones it created.
    pub(crate) fn take_baseline(&mut self) -> Result<(), Failure> {
        for user in [User::A, User::B] {
            if self.target.token_of(user).is_some() {
                self.baseline[user as usize] = self.run_order_ids(user)?;
            }
        }
        Ok(())
    }

    pub fn base(&self) -> &str {
        &self.target.base_path
    }

    /// An `Idempotency-Key` of this run: `atk-<run id>-<suffix>`.
    pub fn key(&self, suffix: &str) -> String {
        format!("atk-{}-{suffix}", self.target.run_id)
    }

    /// An order body of this run's item, with the members' JSON text as given.
    pub fn order_body(&self, quantity: &str, price: &str) -> String {
        format!(
            r#"{{"item":"{}","quantity":{quantity},"price":{price}}}"#,
            self.target.item()
        )
    }

    pub fn note(&mut self, text: impl Into<String>) {
        self.notes.push(text.into());
    }

    /// Sends `call` and keeps the exchange as evidence.
    pub(crate) fn send(&mut self, call: Call<'_>) -> Result<Response, Failure> {
        let (exchange, result) = send_with(&self.agent, self.target, call);
        self.exchanges.push(exchange);
        let response = result?;
        if (200..300).contains(&response.status)
            && let (Some(user), Some(id)) = (self.last_user(), response.id())
        {
            self.seen.insert((user, id));
        }
        Ok(response)
    }

    fn last_user(&self) -> Option<User> {
        self.exchanges.last().and_then(|e| e.request.user)
    }

    /// `POST {base}` as `user` with a JSON `body` and `key`, if any.
    pub fn post(&mut self, user: User, key: Option<&str>, body: &str) -> Result<Response, Failure> {
        let base = self.base().to_owned();
        self.send(Call::new("POST", &base).by(user).key(key).json(body))
    }

    /// `GET {base}/{id}` as `user`.
    pub fn get_order(&mut self, user: User, id: &str) -> Result<Response, Failure> {
        let path = format!("{}/{id}", self.base());
        self.send(Call::new("GET", &path).by(user))
    }

    /// `count` identical `POST {base}` with one key, released together by a
    /// barrier, each on its own connection. Returns every answer (or why
    /// none came), in thread order; keeps one exchange per distinct answer
    /// (the first ten).
    pub fn race(
        &mut self,
        user: User,
        key: &str,
        body: &str,
        count: usize,
    ) -> Vec<Result<Response, Failure>> {
        let barrier = Barrier::new(count);
        let target = self.target;
        let base = self.base().to_owned();
        let results: Vec<(Exchange, Result<Response, Failure>)> = std::thread::scope(|s| {
            let threads: Vec<_> = (0..count)
                .map(|_| {
                    let (barrier, base) = (&barrier, &base);
                    s.spawn(move || {
                        let agent = target.agent();
                        let call = Call::new("POST", base).by(user).key(Some(key)).json(body);
                        barrier.wait();
                        send_with(&agent, target, call)
                    })
                })
                .collect();
            threads
                .into_iter()
                .map(|t| match t.join() {
                    Ok(result) => result,
                    Err(_) => (
                        no_answer_exchange("POST", &base),
                        Err(Failure("a client thread died".into())),
                    ),
                })
                .collect()
        });
        let mut kinds = BTreeSet::new();
        let mut dropped = 0;
        let mut answers = Vec::with_capacity(results.len());
        for (exchange, result) in results {
            let kind = match &result {
                Ok(r) => format!("{} {} {}", r.status, r.replayed(), r.body),
                Err(f) => f.0.clone(),
            };
            if kinds.insert(kind) {
                if kinds.len() <= RACE_EXCHANGES_KEPT {
                    self.exchanges.push(exchange);
                } else {
                    dropped += 1;
                }
            }
            if let Ok(r) = &result
                && (200..300).contains(&r.status)
                && let Some(id) = r.id()
            {
                self.seen.insert((user, id));
            }
            answers.push(result);
        }
        if dropped > 0 {
            self.notes.push(format!(
                "{dropped} more distinct answers to this round are not kept"
            ));
        }
        answers
    }

    /// The ids of this run's orders (item `atk-<run id>`) that `user` lists,
    /// from the first pages of `GET {base}` (newest first). Not kept as
    /// evidence: it is bookkeeping.
    pub(crate) fn run_order_ids(&mut self, user: User) -> Result<BTreeSet<String>, Failure> {
        Ok(self
            .run_orders(user)?
            .iter()
            .filter_map(|o| o.get("id")?.as_str().map(str::to_owned))
            .collect())
    }

    /// This run's orders as `user` lists them.
    pub fn run_orders(&mut self, user: User) -> Result<Vec<Value>, Failure> {
        let item = self.target.item();
        let mut found = Vec::new();
        let mut cursor: Option<String> = None;
        for _ in 0..LISTING_PAGES {
            let path = match &cursor {
                Some(c) => format!("{}?limit=100&cursor={}", self.base(), percent_encode(c)),
                None => format!("{}?limit=100", self.base()),
            };
            let (exchange, result) =
                send_with(&self.agent, self.target, Call::new("GET", &path).by(user));
            let page = result?;
            let Some(json) = page.json().filter(|_| page.status == 200) else {
                self.exchanges.push(exchange);
                return Err(Failure(format!(
                    "listing the orders ({path}) answered {}: cannot tell which orders exist",
                    page.brief()
                )));
            };
            let data = match &json {
                Value::Array(orders) => orders.clone(),
                other => other
                    .get("data")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default(),
            };
            found.extend(
                data.into_iter()
                    .filter(|o| o.get("item").and_then(Value::as_str) == Some(item.as_str())),
            );
            cursor = json
                .get("next_cursor")
                .and_then(Value::as_str)
                .map(str::to_owned);
            if cursor.is_none() {
                break;
            }
        }
        Ok(found)
    }

    /// The orders of this run that `user` lists now and did not before the
    /// check started.
    pub fn new_orders(&mut self, user: User) -> Result<Vec<Value>, Failure> {
        let before = self.baseline[user as usize].clone();
        Ok(self
            .run_orders(user)?
            .into_iter()
            .filter(|o| {
                o.get("id")
                    .and_then(Value::as_str)
                    .is_some_and(|id| !before.contains(id))
            })
            .collect())
    }

    /// Fails unless the check so far created exactly `count` orders for
    /// `user` (as the target's listing shows them); returns them.
    pub fn expect_created(&mut self, user: User, count: usize) -> Result<Vec<Value>, Failure> {
        let created = self.new_orders(user)?;
        let ids: Vec<&str> = created
            .iter()
            .filter_map(|o| o.get("id")?.as_str())
            .collect();
        let who = match user {
            User::A => "",
            User::B => " for user B",
        };
        self.notes.push(format!(
            "new orders of this run{who}, by the listing: {}",
            created.len()
        ));
        ensure(created.len() == count, || {
            if count == 0 {
                format!(
                    "{} order(s) were created{who} although every request should have been refused: {}",
                    created.len(),
                    ids.join(", ")
                )
            } else {
                format!(
                    "expected {count} new order(s){who}, the listing shows {}: {}",
                    created.len(),
                    ids.join(", ")
                )
            }
        })?;
        Ok(created)
    }
}

/// Percent-encodes everything but RFC 3986's unreserved characters.
fn percent_encode(raw: &str) -> String {
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

fn no_answer_exchange(method: &str, path: &str) -> Exchange {
    Exchange {
        request: SentRequest {
            method: method.to_owned(),
            path: path.to_owned(),
            user: None,
            headers: Vec::new(),
            body: None,
        },
        response: None,
        error: Some("no answer".into()),
    }
}

/// Sends `call` with `agent`; returns the exchange to keep and the answer.
fn send_with(
    agent: &ureq::Agent,
    target: &Target,
    call: Call<'_>,
) -> (Exchange, Result<Response, Failure>) {
    let mut headers: Vec<(String, String)> = Vec::new();
    let mut shown: Vec<(String, String)> = Vec::new();
    if let Some(user) = call.user {
        let Some(token) = target.token_of(user) else {
            let exchange = no_answer_exchange(call.method, call.path);
            return (
                exchange,
                Err(Failure(format!("no token for user {user:?}"))),
            );
        };
        headers.push(("Authorization".into(), format!("Bearer {token}")));
        shown.push((
            "Authorization".into(),
            format!("Bearer <token of user {user:?}>"),
        ));
    }
    for (name, value) in &call.headers {
        headers.push(((*name).to_owned(), value.clone()));
        shown.push(((*name).to_owned(), quoted(value)));
    }
    let mut exchange = Exchange {
        request: SentRequest {
            method: call.method.to_owned(),
            path: call.path.to_owned(),
            user: call.user,
            headers: shown,
            body: call.body.as_deref().map(|b| trim(b, EVIDENCE_CHARS)),
        },
        response: None,
        error: None,
    };
    let url = format!("{}{}", target.server, call.path);
    match request(agent, call.method, &url, &headers, call.body.as_deref()) {
        Ok(response) => {
            exchange.response = Some(Answer {
                status: response.status,
                headers: response
                    .headers
                    .iter()
                    .filter(|(n, _)| EVIDENCE_HEADERS.contains(&n.to_ascii_lowercase().as_str()))
                    .cloned()
                    .collect(),
                body: trim(&response.body, EVIDENCE_CHARS),
            });
            (exchange, Ok(response))
        }
        Err(e) => {
            let why = format!("{} {} got no answer: {e}", call.method, call.path);
            exchange.error = Some(e);
            (exchange, Err(Failure(why)))
        }
    }
}

/// One request; `Err` when no whole answer arrived.
pub(crate) fn request(
    agent: &ureq::Agent,
    method: &str,
    url: &str,
    headers: &[(String, String)],
    body: Option<&str>,
) -> Result<Response, String> {
    crate::wire::exchange(agent, method, url, headers, body).map_err(|e| e.to_string())
}
