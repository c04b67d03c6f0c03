//! What a check sees of its target: HTTP requests as one of two users (or
//! as nobody, when the target has no authentication), every one kept as
//! evidence (trimmed, tokens hidden); the orders of this run as the
//! target's listing shows them, or as its answers named them; and what the
//! check found: exposures, deviations from the contract, notes, and the
//! requests that got no answer (each listed, never a reason to drop what
//! the target's state shows).

use std::collections::BTreeSet;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::Value;

use crate::shape::Shape;

/// Longest body or header value kept in the evidence, in characters.
pub const EVIDENCE_CHARS: usize = 400;
/// Distinct answers kept per round of a race.
const RACE_EXCHANGES_KEPT: usize = 10;
/// Pages of the listing read to find this run's orders.
const LISTING_PAGES: usize = 5;
/// The control's order: the attacks' usual valid order (quantity 2, price
/// 9.99), so that a target that mixes keys up shows it in the attack.
pub const CONTROL_QUANTITY: &str = "2";
pub const CONTROL_PRICE: &str = "9.99";
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
/// The deployment under attack, its shape, and who the checks act as.
#[derive(Debug, Clone)]
pub struct Target {
    /// `http://host:port`, without a trailing slash.
    pub server: String,
    /// Where its orders live and what their members are called.
    pub shape: Shape,
    /// User A's bearer token; without one, user A's requests carry no
    /// `Authorization` (a target without authentication).
    pub token: Option<String>,
    /// User B's bearer token, for the tenancy checks (skipped without it).
    pub token_b: Option<String>,
    /// Concurrent requests in one round of the race (ATK-05).
    pub concurrency: usize,
    /// Marks everything this run creates: item `atk-<run id>`, keys `atk-<run id>-…`.
    pub run_id: String,
    /// How long one request may take.
    pub timeout: Duration,
}

impl Target {
    /// A target at `server` of this API's shape, no tokens, a concurrency
    /// of 50 and a fresh run id.
    pub fn new(server: &str) -> Self {
        Self {
            server: server.trim_end_matches('/').to_owned(),
            shape: Shape::default(),
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

    pub fn base_path(&self) -> &str {
        &self.shape.base_path
    }

    /// The path of order `id` (`{base}/{id}` by default).
    pub fn order_path(&self, id: &str) -> String {
        self.shape.order(&percent_encode(id))
    }

    pub(crate) fn token_of(&self, user: User) -> Option<&str> {
        match user {
            User::A => self.token.as_deref(),
            User::B => self.token_b.as_deref(),
        }
    }

    /// The order id in an answer's body, in this target's shape.
    pub fn id_in(&self, response: &Response) -> Option<String> {
        let json = response.json()?;
        self.shape.id_of(self.shape.order_in(&json)?)
    }

    /// The order an answer's body carries, in this target's shape.
    pub fn order_in(&self, response: &Response) -> Option<Value> {
        let json = response.json()?;
        self.shape.order_in(&json).cloned()
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

/// Who sends a request: user A (`--token`, or nobody without one) or user
/// B (`--token-b`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub enum User {
    A,
    B,
}

/// Why a check cannot judge (no answer, no way to tell which orders exist),
/// in one or two sentences.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CannotJudge(pub String);

/// Why a request has no answer to judge.
enum NoAnswer {
    /// It was never sent (no token for its user).
    NotSent(String),
    /// It was sent and no whole answer came back: `METHOD PATH got no answer: why`.
    Unanswered(String),
}

impl NoAnswer {
    fn why(&self) -> &str {
        match self {
            NoAnswer::NotSent(why) | NoAnswer::Unanswered(why) => why,
        }
    }
}

pub use crate::wire::Response;

/// What the checks read of an answer, beyond [`crate::wire`]'s.
impl Response {
    /// A `2xx`.
    pub fn success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// Marked as a replay by `header` (`Idempotent-Replayed: true` here;
    /// `1` and `yes` are taken as `true` too).
    pub fn replayed_by(&self, header: &str) -> bool {
        self.header(header).is_some_and(|v| {
            ["true", "1", "yes"]
                .iter()
                .any(|t| v.trim().eq_ignore_ascii_case(t))
        })
    }

    /// `status` and the start of the body, its whitespace folded, for a message.
    pub fn brief(&self) -> String {
        format!("{} {}", self.status, trim(&fold(&self.body), 160))
    }

    /// What of its body or headers shows the target's internals, whatever
    /// its status: the kind and the text that shows it.
    fn internals(&self) -> Option<(&'static str, String)> {
        crate::internals::find(&self.body).or_else(|| {
            self.headers
                .iter()
                .find_map(|(name, value)| crate::internals::find(&format!("{name}: {value}")))
        })
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

/// `text` with each run of whitespace (newlines included) as one space:
/// an HTML page as one line.
pub fn fold(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
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
    /// The idempotency key, sent in the shape's key header.
    pub key: Option<String>,
    pub headers: Vec<(&'a str, String)>,
    pub body: Option<String>,
}

impl<'a> Call<'a> {
    pub fn new(method: &'a str, path: &'a str) -> Self {
        Self {
            method,
            path,
            user: None,
            key: None,
            headers: Vec::new(),
            body: None,
        }
    }

    /// As `user`: with their token, if they have one.
    pub fn by(mut self, user: User) -> Self {
        self.user = Some(user);
        self
    }

    pub fn header(mut self, name: &'a str, value: impl Into<String>) -> Self {
        self.headers.push((name, value.into()));
        self
    }

    /// The key (in the target's key header, `Idempotency-Key` here) when
    /// `key` is some.
    pub fn key(mut self, key: Option<&str>) -> Self {
        self.key = key.map(str::to_owned);
        self
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

/// A check's view of the target: it sends, everything it sends is kept,
/// and it collects what the check found.
pub struct Probe<'t> {
    pub(crate) target: &'t Target,
    agent: ureq::Agent,
    /// The control's requests and answers.
    pub(crate) control: Vec<Exchange>,
    /// The attack's requests and answers.
    pub(crate) exchanges: Vec<Exchange>,
    pub(crate) notes: Vec<String>,
    /// What the attack achieved, one sentence each.
    pub(crate) exposures: Vec<String>,
    /// Where the target answered otherwise than this contract, without the
    /// attack achieving anything.
    pub(crate) deviations: Vec<String>,
    /// The requests of the control and the attack that got no whole answer,
    /// each with why: `METHOD PATH got no answer: …`.
    pub(crate) unanswered: Vec<String>,
    /// This run's orders per user when the attack started (the control's included).
    baseline: [BTreeSet<String>; 2],
    /// Whether each user's listing shows the orders they create (the
    /// control's did); without it, new orders are those the answers named.
    listing: [bool; 2],
    /// The orders the controls created, by user.
    control_ids: [Option<String>; 2],
    /// Order ids seen in 2xx answers, by user (for the count and the cleanup).
    pub(crate) seen: BTreeSet<(User, String)>,
}

impl<'t> Probe<'t> {
    pub(crate) fn new(target: &'t Target) -> Self {
        Self {
            target,
            agent: target.agent(),
            control: Vec::new(),
            exchanges: Vec::new(),
            notes: Vec::new(),
            exposures: Vec::new(),
            deviations: Vec::new(),
            unanswered: Vec::new(),
            baseline: [BTreeSet::new(), BTreeSet::new()],
            listing: [false, false],
            control_ids: [None, None],
            seen: BTreeSet::new(),
        }
    }

    pub fn base(&self) -> &str {
        self.target.base_path()
    }

    pub fn shape(&self) -> &Shape {
        &self.target.shape
    }

    /// An `Idempotency-Key` of this run: `atk-<run id>-<suffix>`.
    pub fn key(&self, suffix: &str) -> String {
        format!("atk-{}-{suffix}", self.target.run_id)
    }

    /// An order body of this run's item, with the quantity's and price's
    /// JSON text as given.
    pub fn order_body(&self, quantity: &str, price: &str) -> String {
        self.target
            .shape
            .body(Some(&self.target.item()), Some(quantity), Some(price))
    }

    /// The order id in `response`, in the target's shape.
    pub fn id_in(&self, response: &Response) -> Option<String> {
        self.target.id_in(response)
    }

    /// The order `response` carries, in the target's shape.
    pub fn order_in(&self, response: &Response) -> Option<Value> {
        self.target.order_in(response)
    }

    /// Why `response` looks like an idempotency layer's answer rather than
    /// the application's, if it does: marked as a replay, or a refusal
    /// that speaks of a key used before or still in progress.
    pub fn layer_answer(&self, response: &Response) -> Option<String> {
        if self.replayed(response) {
            return Some(format!(
                "marked as a replay by `{}`",
                self.shape().replay_header
            ));
        }
        if !(400..500).contains(&response.status) {
            return None;
        }
        let body = response.body.to_ascii_lowercase();
        let about_keys = ["idempot", "key", "request id", "request-id"]
            .iter()
            .any(|w| body.contains(w));
        let reused = [
            "reuse",
            "already used",
            "already been used",
            "different payload",
            "different request",
            "does not match",
            "doesn't match",
            "mismatch",
            "in progress",
            "in_progress",
        ]
        .iter()
        .find(|w| body.contains(*w));
        match reused {
            Some(word) if about_keys => Some(format!(
                "{} speaking of a key and {word:?}",
                response.status
            )),
            _ => None,
        }
    }

    /// Whether `response` is marked as a replay, by the target's replay header.
    pub fn replayed(&self, response: &Response) -> bool {
        response.replayed_by(&self.shape().replay_header)
    }

    pub fn note(&mut self, text: impl Into<String>) {
        self.notes.push(text.into());
    }

    /// The attack achieved something: `what` says what.
    pub fn expose(&mut self, what: impl Into<String>) {
        let what = what.into();
        if !self.exposures.contains(&what) {
            self.exposures.push(what);
        }
    }

    /// The target answered otherwise than this contract says, and the attack
    /// achieved nothing by it.
    pub fn deviate(&mut self, what: impl Into<String>) {
        let what = what.into();
        if !self.deviations.contains(&what) {
            self.deviations.push(what);
        }
    }

    /// The control: as each of `users`, a valid create with a fresh key must
    /// be answered 2xx with an order, else the check cannot judge. Then
    /// remembers which orders of this run exist, so that the attack can
    /// tell which ones it created.
    pub(crate) fn control(&mut self, users: &[User], suffix: &str) -> Result<(), CannotJudge> {
        for &user in users {
            let who = match (user, self.target.token_of(user)) {
                (User::B, _) => " as user B",
                (User::A, Some(_)) => " as user A",
                (User::A, None) => "",
            };
            let key = self.key(&format!("{suffix}-control-{user:?}").to_ascii_lowercase());
            let body = self.order_body(CONTROL_QUANTITY, CONTROL_PRICE);
            let base = self.base().to_owned();
            let answer = self.send(Call::new("POST", &base).by(user).key(Some(&key)).json(body));
            self.control.extend(self.exchanges.pop());
            let answer = answer.map_err(|CannotJudge(why)| {
                CannotJudge(format!(
                    "the control (a valid create with a fresh key{who}): {why}"
                ))
            })?;
            let Some(id) = self.id_in(&answer).filter(|_| answer.success()) else {
                return Err(CannotJudge(self.control_refused(&answer, who)));
            };
            let listed = if self.shape().has("LIST") {
                self.run_order_ids(user)
            } else {
                Err(CannotJudge("the profile says the target lacks LIST".into()))
            };
            self.listing[user as usize] = match listed {
                Ok(listed) if listed.contains(&id) => true,
                Ok(_) => self.no_listing(user, &id, "it does not show it")?,
                Err(CannotJudge(why)) => self.no_listing(user, &id, &why)?,
            };
            self.baseline[user as usize].insert(id.clone());
            self.control_ids[user as usize] = Some(id);
            if self.listing[user as usize] {
                let listed = self.run_order_ids(user)?;
                self.baseline[user as usize].extend(listed);
            }
        }
        // A control's order is no attack's, whoever lists it: on a target
        // that lists every order, A's listing shows B's control too.
        let controls: Vec<String> = self.control_ids.iter().flatten().cloned().collect();
        for baseline in &mut self.baseline {
            baseline.extend(controls.iter().cloned());
        }
        Ok(())
    }

    /// Why a control answered without an order cannot judge, with a hint.
    fn control_refused(&self, answer: &Response, who: &str) -> String {
        let shape = self.shape();
        let hint = match answer.status {
            401 | 403 if self.target.token.is_none() => {
                "; no --token was given, and the target requires authentication".to_owned()
            }
            401 | 403 => "; is the token valid?".to_owned(),
            404 | 405 => format!(
                "; are its orders at {} (--base-path, --profile)?",
                shape.base_path
            ),
            400 | 415 | 422 => format!(
                "; does it take orders as {} (--profile)?",
                self.order_body(CONTROL_QUANTITY, CONTROL_PRICE)
            ),
            s if (200..300).contains(&s) => {
                return format!(
                    "the control (a valid create with a fresh key{who}) was answered {} \
                     without an order id in `{}` (--id-field, --profile) — without the \
                     order's id a check cannot tell what an attack did",
                    answer.brief(),
                    shape.id_field
                );
            }
            _ => String::new(),
        };
        format!(
            "the control (a valid create with a fresh key{who}) was answered {}{hint} \
             — a target that refuses a valid request cannot show whether it blocks an attack",
            answer.brief()
        )
    }

    /// The listing does not show the control's order `id`: new orders are
    /// counted from the answers, when an order can be read back by id.
    fn no_listing(&mut self, user: User, id: &str, why: &str) -> Result<bool, CannotJudge> {
        let read = self.read_back(user, id);
        let path = self.target.order_path(id);
        if !read {
            return Err(CannotJudge(format!(
                "neither the listing (GET {}) nor GET {path} shows the control's order {id} \
                 ({why}): cannot tell which orders exist",
                self.list_path(None)
            )));
        }
        self.note(format!(
            "the listing (GET {}) does not show the control's order ({why}): \
             new orders are those the answers named, read back by id",
            self.list_path(None)
        ));
        Ok(false)
    }

    /// The order `user`'s control created.
    pub(crate) fn control_id(&self, user: User) -> Option<String> {
        self.control_ids[user as usize].clone()
    }

    /// The order ids `user`'s 2xx answers named in this check.
    pub(crate) fn named(&self, user: User) -> BTreeSet<String> {
        self.seen
            .iter()
            .filter(|(u, _)| *u == user)
            .map(|(_, id)| id.clone())
            .collect()
    }

    /// Whether `user`'s listing shows the orders they create.
    pub(crate) fn lists(&self, user: User) -> bool {
        self.listing[user as usize]
    }

    /// Whether order `id` still exists for `user`: in their listing, or read
    /// back by id. A listing that worked and fails now says no.
    pub(crate) fn still_there(&mut self, user: User, id: &str) -> bool {
        if self.listing[user as usize] {
            return self.run_order_ids(user).is_ok_and(|ids| ids.contains(id));
        }
        self.read_back(user, id)
    }

    /// Whether `GET {base}/{id}` as `user` answers 2xx (not kept as evidence).
    fn read_back(&self, user: User, id: &str) -> bool {
        if !self.shape().has("GET") {
            return false;
        }
        let path = self.target.order_path(id);
        let (_, result) = send_with(&self.agent, self.target, Call::new("GET", &path).by(user));
        result.is_ok_and(|r| r.success())
    }

    /// Sends `call` and keeps the exchange as evidence; a 5xx that shows
    /// internals is an exposure, whatever the check. A request that got no
    /// answer is listed in [`Probe::unanswered`]; the check decides whether
    /// it can judge without it (the target's state usually can).
    pub(crate) fn send(&mut self, call: Call<'_>) -> Result<Response, CannotJudge> {
        let user = call.user.unwrap_or(User::A);
        let what = format!("{} {}", call.method, call.path);
        let (exchange, result) = send_with(&self.agent, self.target, call);
        self.exchanges.push(exchange);
        let response = result.map_err(|e| self.no_answer(e))?;
        self.judge_answer(user, &what, &response);
        Ok(response)
    }

    /// Lists a request that was sent and got no answer; the reason either way.
    fn no_answer(&mut self, e: NoAnswer) -> CannotJudge {
        if let NoAnswer::Unanswered(why) = &e {
            self.unanswered.push(why.clone());
        }
        CannotJudge(e.why().to_owned())
    }

    /// What every answer tells: the order it names, internals it shows.
    fn judge_answer(&mut self, user: User, what: &str, response: &Response) {
        if response.success()
            && let Some(id) = self.id_in(response)
        {
            self.seen.insert((user, id));
        }
        if let Some((kind, shown)) = response.internals() {
            self.expose(format!(
                "{what} was answered {} showing the target's internals ({kind}): {shown:?}",
                response.status,
            ));
        }
    }

    /// `POST {base}` as `user` with a JSON `body` and `key`, if any.
    pub fn post(
        &mut self,
        user: User,
        key: Option<&str>,
        body: &str,
    ) -> Result<Response, CannotJudge> {
        let base = self.base().to_owned();
        self.send(Call::new("POST", &base).by(user).key(key).json(body))
    }

    /// `GET {base}/{id}` as `user`.
    pub fn get_order(&mut self, user: User, id: &str) -> Result<Response, CannotJudge> {
        let path = self.target.order_path(id);
        self.send(Call::new("GET", &path).by(user))
    }

    /// `count` identical `POST {base}` with one key, released together by a
    /// barrier, each on its own connection. Returns every answer (or why
    /// none came), in thread order, and whether two of the requests were in
    /// flight at once; keeps one exchange per distinct answer (the first
    /// ten), and lists every request that got no answer.
    pub fn race(&mut self, user: User, key: &str, body: &str, count: usize) -> Race {
        let barrier = Barrier::new(count);
        let target = self.target;
        let base = self.base().to_owned();
        type Timed = ((Instant, Instant), (Exchange, Result<Response, NoAnswer>));
        let results: Vec<Timed> = std::thread::scope(|s| {
            let threads: Vec<_> = (0..count)
                .map(|_| {
                    let (barrier, base) = (&barrier, &base);
                    s.spawn(move || {
                        let agent = target.agent();
                        let call = Call::new("POST", base).by(user).key(Some(key)).json(body);
                        barrier.wait();
                        let sent = Instant::now();
                        let result = send_with(&agent, target, call);
                        ((sent, Instant::now()), result)
                    })
                })
                .collect();
            threads
                .into_iter()
                .map(|t| match t.join() {
                    Ok(result) => result,
                    Err(_) => (
                        (Instant::now(), Instant::now()),
                        (
                            no_answer_exchange("POST", &base),
                            Err(NoAnswer::Unanswered(format!(
                                "POST {base} got no answer: its client thread died"
                            ))),
                        ),
                    ),
                })
                .collect()
        });
        let overlapped = overlapped(results.iter().map(|(span, _)| *span).collect());
        let mut kinds = BTreeSet::new();
        let mut dropped = 0;
        let mut answers = Vec::with_capacity(results.len());
        let what = format!("POST {base}");
        for (_, (exchange, result)) in results {
            let kind = match &result {
                Ok(r) => format!(
                    "{} {} {}",
                    r.status,
                    r.replayed_by(&target.shape.replay_header),
                    r.body
                ),
                Err(e) => e.why().to_owned(),
            };
            if kinds.insert(kind) {
                if kinds.len() <= RACE_EXCHANGES_KEPT {
                    self.exchanges.push(exchange);
                } else {
                    dropped += 1;
                }
            }
            if let Ok(r) = &result {
                self.judge_answer(user, &what, r);
            }
            answers.push(result.map_err(|e| self.no_answer(e)));
        }
        if dropped > 0 {
            self.notes.push(format!(
                "{dropped} more distinct answers to this round are not kept"
            ));
        }
        Race {
            answers,
            overlapped,
        }
    }

    /// `GET {list_path}?{list_query}`, then `cursor=` for a later page.
    fn list_path(&self, cursor: Option<&str>) -> String {
        let (path, query) = (self.shape().listing(), &self.shape().list_query);
        let cursor = cursor.map(|c| format!("cursor={}", percent_encode(c)));
        match (query.is_empty(), cursor) {
            (true, None) => path.to_owned(),
            (false, None) => format!("{path}?{query}"),
            (true, Some(cursor)) => format!("{path}?{cursor}"),
            (false, Some(cursor)) => format!("{path}?{query}&{cursor}"),
        }
    }

    /// The ids of this run's orders (item `atk-<run id>`) that `user` lists.
    /// Not kept as evidence: it is bookkeeping.
    pub(crate) fn run_order_ids(&mut self, user: User) -> Result<BTreeSet<String>, CannotJudge> {
        let shape = self.shape().clone();
        Ok(self
            .run_orders(user)?
            .iter()
            .filter_map(|o| shape.id_of(o))
            .collect())
    }

    /// This run's orders as `user` lists them, from the first pages of
    /// `GET {base}`.
    pub fn run_orders(&mut self, user: User) -> Result<Vec<Value>, CannotJudge> {
        let item = Value::String(self.target.item());
        let item_field = self.shape().item_field.clone();
        let mut found = Vec::new();
        let mut cursor: Option<String> = None;
        for _ in 0..LISTING_PAGES {
            let path = self.list_path(cursor.as_deref());
            let (exchange, result) =
                send_with(&self.agent, self.target, Call::new("GET", &path).by(user));
            let page = match result {
                Ok(page) => page,
                Err(e) => {
                    self.exchanges.push(exchange);
                    return Err(self.no_answer(e));
                }
            };
            let json = page.json().filter(|_| page.success());
            let Some(orders) = json.as_ref().and_then(Shape::listed) else {
                self.exchanges.push(exchange);
                return Err(CannotJudge(format!(
                    "listing the orders (GET {path}) answered {}",
                    page.brief()
                )));
            };
            found.extend(
                orders
                    .into_iter()
                    .filter(|o| o.get(&item_field) == Some(&item)),
            );
            let next = json
                .as_ref()
                .and_then(|j| j.get("next_cursor"))
                .and_then(Value::as_str)
                .map(str::to_owned);
            if next.is_none() || next == cursor {
                break;
            }
            cursor = next;
        }
        Ok(found)
    }

    /// The ids of this run's orders that `user` has now and did not have
    /// when the attack started: by the listing, and every order an answer
    /// named that reads back by id. Notes how many.
    pub fn created(&mut self, user: User) -> Result<Vec<String>, CannotJudge> {
        let before = self.baseline[user as usize].clone();
        let mut created: BTreeSet<String> = if self.listing[user as usize] {
            self.run_order_ids(user)?
                .into_iter()
                .filter(|id| !before.contains(id))
                .collect()
        } else {
            BTreeSet::new()
        };
        let named: Vec<String> = self
            .seen
            .iter()
            .filter(|(u, id)| *u == user && !before.contains(id) && !created.contains(id))
            .map(|(_, id)| id.clone())
            .collect();
        for id in named {
            if self.read_back(user, &id) {
                created.insert(id);
            }
        }
        let who = match user {
            User::A => "",
            User::B => " for user B",
        };
        let how = if self.listing[user as usize] {
            "by the listing"
        } else {
            "by the answers, read back"
        };
        self.notes.push(format!(
            "new orders of this run{who}, {how}: {}",
            created.len()
        ));
        Ok(created.into_iter().collect())
    }
}

/// One round of a race: every answer (or why none came), and whether any
/// two requests were in flight at once.
pub struct Race {
    pub answers: Vec<Result<Response, CannotJudge>>,
    /// Some request was sent before another one's answer had come back:
    /// otherwise each was answered before the next was sent, and no race
    /// was tried.
    pub overlapped: bool,
}

/// Whether any two of `spans` (sent, answered) overlap.
pub(crate) fn overlapped(mut spans: Vec<(Instant, Instant)>) -> bool {
    spans.sort();
    let mut answered: Option<Instant> = None;
    for (sent, done) in spans {
        if answered.is_some_and(|last| sent < last) {
            return true;
        }
        answered = Some(answered.map_or(done, |last| last.max(done)));
    }
    false
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
) -> (Exchange, Result<Response, NoAnswer>) {
    let mut headers: Vec<(String, String)> = Vec::new();
    let mut shown: Vec<(String, String)> = Vec::new();
    // Without a token the request carries no `Authorization`: a target
    // without authentication is attacked as it is used.
    let user = call
        .user
        .filter(|u| target.token_of(*u).is_some() || *u == User::B);
    if let Some(user) = user {
        let Some(token) = target.token_of(user) else {
            let mut exchange = no_answer_exchange(call.method, call.path);
            exchange.error = Some("not sent: no token".into());
            return (
                exchange,
                Err(NoAnswer::NotSent(format!("no token for user {user:?}"))),
            );
        };
        headers.push(("Authorization".into(), format!("Bearer {token}")));
        shown.push((
            "Authorization".into(),
            format!("Bearer <token of user {user:?}>"),
        ));
    }
    let key = call
        .key
        .as_ref()
        .map(|key| (target.shape.key_header.as_str(), key.clone()));
    for (name, value) in key.iter().chain(&call.headers) {
        headers.push(((*name).to_owned(), value.clone()));
        shown.push(((*name).to_owned(), quoted(value)));
    }
    let mut exchange = Exchange {
        request: SentRequest {
            method: call.method.to_owned(),
            path: call.path.to_owned(),
            user,
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
                    .filter(|(n, _)| {
                        EVIDENCE_HEADERS.contains(&n.to_ascii_lowercase().as_str())
                            || n.eq_ignore_ascii_case(&target.shape.replay_header)
                    })
                    .cloned()
                    .collect(),
                body: trim(&response.body, EVIDENCE_CHARS),
            });
            (exchange, Ok(response))
        }
        Err(e) => {
            let why = format!("{} {} got no answer: {e}", call.method, call.path);
            exchange.error = Some(e);
            (exchange, Err(NoAnswer::Unanswered(why)))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_overlap_only_when_one_was_sent_before_another_was_answered() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        // One after the other: answered before the next was sent.
        assert!(!overlapped(vec![
            (at(0), at(2)),
            (at(3), at(5)),
            (at(6), at(7))
        ]));
        assert!(!overlapped(vec![(at(0), at(1))]));
        assert!(!overlapped(Vec::new()));
        // The third sent while the second was in flight, in any order given.
        assert!(overlapped(vec![
            (at(6), at(9)),
            (at(0), at(2)),
            (at(3), at(7))
        ]));
    }

    fn answer(status: u16, headers: &[(&str, &str)], body: &str) -> Response {
        Response {
            status,
            headers: headers
                .iter()
                .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
                .collect(),
            body: body.to_owned(),
        }
    }

    #[test]
    fn an_answer_looks_like_the_idempotency_layer_s_when_it_replays_or_speaks_of_a_reused_key() {
        let mut target = Target::new("http://127.0.0.1:1");
        target.shape.replay_header = "X-Idempotent-Replayed".into();
        let probe = Probe::new(&target);
        for layer in [
            answer(
                409,
                &[],
                r#"{"error":"IDEMPOTENCY_KEY_REUSED_WITH_DIFFERENT_PAYLOAD"}"#,
            ),
            answer(
                422,
                &[],
                "Idempotency key already used with another request payload",
            ),
            answer(
                409,
                &[],
                r#"{"message":"A request with this key is in progress"}"#,
            ),
            answer(201, &[("x-idempotent-replayed", "true")], r#"{"id":1}"#),
        ] {
            assert!(probe.layer_answer(&layer).is_some(), "{layer:?}");
        }
        for application in [
            answer(
                422,
                &[],
                r#"{"errors":["quantity must be a positive integer"]}"#,
            ),
            answer(
                400,
                &[],
                r#"{"error":"Idempotency-Key header is required"}"#,
            ),
            answer(409, &[], r#"{"error":"ORDER_NOT_PENDING"}"#),
            answer(201, &[("Idempotent-Replayed", "true")], r#"{"id":1}"#),
            answer(500, &[], "key reused"),
        ] {
            assert!(
                probe.layer_answer(&application).is_none(),
                "{application:?}"
            );
        }
    }
}
