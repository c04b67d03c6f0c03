//! A second implementation of the pattern, to point the runner at: the
//! seed's design, built literally. `POST /orders` takes
//! `{"item", "quantity", "price"}` and answers `201` with an integer id;
//! `GET /orders` lists every order (a JSON array), `GET /orders/{id}` reads
//! one. On purpose, as the seed does it:
//! - no authentication (an `Authorization` header is ignored);
//! - one global key space, not one per user;
//! - a missing or blank `Idempotency-Key` is `422`;
//! - a known key replays its first answer as it was (`201`, no
//!   `Idempotent-Replayed`), whatever the body: a changed body gets the
//!   first order;
//! - no limit on a key's length;
//! - a body that is not `application/json` is `400`;
//! - no `PATCH`, no `DELETE`, no CORS (`405`).
//!
//! It validates the body strictly (integer quantity ≥ 1, numeric price ≥ 0,
//! a non-empty item) and runs one request at a time, so a race creates one
//! order. std::net and a thread per connection; one request per connection.
//!
//! [`Dialect`] gives the same design another shape (another path, other
//! member names, string ids, answers wrapped in `{"data": …}`), for the
//! runner's profiles; [`Quirks`] makes it worse still (an order for every
//! request, answers that never come back), for the runner's judging from
//! the target's state.

use std::collections::HashMap;
use std::io::{BufReader, Write};
use std::net::TcpStream;
use std::sync::{Arc, Mutex};

use orders_atk::wire::Message;
use serde_json::{Value, json};

use super::front::Front;

/// How the server writes its orders.
#[derive(Clone)]
pub struct Dialect {
    pub base: &'static str,
    pub item: &'static str,
    pub quantity: &'static str,
    pub price: &'static str,
    /// Ids as strings (`"p-1"`) instead of integers.
    pub string_ids: bool,
    /// Every answer's order (or list) under `data`.
    pub envelope: bool,
}

impl Dialect {
    /// The seed's own: `/orders`, `item`/`quantity`/`price`, integer ids, bare bodies.
    pub const SEED: Dialect = Dialect {
        base: "/orders",
        item: "item",
        quantity: "quantity",
        price: "price",
        string_ids: false,
        envelope: false,
    };

    fn wrap(&self, body: Value) -> Value {
        if self.envelope {
            json!({ "data": body })
        } else {
            body
        }
    }
}

/// Ways the seed's design can be made worse.
#[derive(Clone, Copy)]
pub struct Quirks {
    /// Every create makes a new order, whatever its key (the key is
    /// recorded but never looked up).
    pub order_per_request: bool,
    /// Whether the answer to a create is dropped (the connection closed
    /// after the create ran, nothing sent), given its key and how many
    /// creates with that key came before it.
    pub drops: fn(key: &str, before: usize) -> bool,
}

impl Quirks {
    /// None: the seed as it ships.
    pub const NONE: Quirks = Quirks {
        order_per_request: false,
        drops: |_, _| false,
    };
}

/// The seed's design on a free port of 127.0.0.1, until dropped.
pub struct SeedServer {
    pub address: String,
    _front: Front,
    state: Arc<Mutex<State>>,
}

/// An answer as the seed stores it for a key: status, body, Location.
#[derive(Clone)]
struct Answer {
    status: u16,
    body: String,
    location: Option<String>,
}

struct State {
    dialect: Dialect,
    quirks: Quirks,
    orders: Vec<Value>,
    keys: HashMap<String, Answer>,
    /// Creates seen per key.
    creates: HashMap<String, usize>,
}

impl SeedServer {
    pub fn start() -> Self {
        Self::speaking(Dialect::SEED)
    }

    pub fn speaking(dialect: Dialect) -> Self {
        Self::with_quirks(dialect, Quirks::NONE)
    }

    pub fn with_quirks(dialect: Dialect, quirks: Quirks) -> Self {
        let state = Arc::new(Mutex::new(State {
            dialect,
            quirks,
            orders: Vec::new(),
            keys: HashMap::new(),
            creates: HashMap::new(),
        }));
        let front = {
            let state = Arc::clone(&state);
            Front::start(move |client| serve(client, &state))
        };
        Self {
            address: front.address.clone(),
            _front: front,
            state,
        }
    }

    /// How many orders it holds.
    pub fn order_count(&self) -> usize {
        self.state.lock().expect("state").orders.len()
    }
}

fn serve(client: TcpStream, state: &Mutex<State>) {
    let mut reader = BufReader::new(client.try_clone().expect("clone"));
    let Some(request) = Message::read(&mut reader) else {
        return;
    };
    let (answer, dropped) = {
        // One request at a time, as one PHP worker with a table lock would.
        let mut state = state.lock().expect("state");
        let dropped = dropped(&request, &mut state);
        (route(&request, &mut state), dropped)
    };
    if dropped {
        // It ran; the client never hears of it.
        return;
    }
    let mut head = format!(
        "HTTP/1.1 {} Seed\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n",
        answer.status,
        answer.body.len()
    );
    if let Some(location) = &answer.location {
        head.push_str(&format!("Location: {location}\r\n"));
    }
    head.push_str("\r\n");
    let mut client = client;
    let _ = client.write_all(head.as_bytes());
    let _ = client.write_all(answer.body.as_bytes());
    let _ = client.flush();
}

/// Whether the answer to `request` is to be dropped ([`Quirks::drops`]).
fn dropped(request: &Message, state: &mut State) -> bool {
    if request.method() != "POST" {
        return false;
    }
    let key = request
        .header("idempotency-key")
        .unwrap_or_default()
        .to_owned();
    let before = state.creates.entry(key.clone()).or_default();
    let drop = (state.quirks.drops)(&key, *before);
    *before += 1;
    drop
}

fn answer(status: u16, body: Value) -> Answer {
    Answer {
        status,
        body: body.to_string(),
        location: None,
    }
}

fn route(request: &Message, state: &mut State) -> Answer {
    let d = state.dialect.clone();
    let path = request.path();
    let id = path
        .strip_prefix(d.base)
        .and_then(|rest| rest.strip_prefix('/'));
    match (request.method(), path == d.base, id) {
        ("POST", true, _) => create(request, state),
        ("GET", true, _) => answer(200, d.wrap(Value::Array(state.orders.clone()))),
        ("GET", _, Some(id)) => match state.orders.iter().find(|o| id_text(&o["id"]) == id) {
            Some(order) => answer(200, d.wrap(order.clone())),
            None => answer(404, json!({"error": "Order not found"})),
        },
        (_, true, _) | (_, _, Some(_)) => answer(405, json!({"error": "Method not allowed"})),
        _ => answer(404, json!({"error": "Not found"})),
    }
}

/// An id as it appears in a path.
fn id_text(id: &Value) -> String {
    match id {
        Value::String(id) => id.clone(),
        other => other.to_string(),
    }
}

fn create(request: &Message, state: &mut State) -> Answer {
    let Some(key) = request
        .header("idempotency-key")
        .filter(|k| !k.trim().is_empty())
    else {
        return answer(422, json!({"error": "Idempotency-Key header is required"}));
    };
    // The key alone decides: the body of a retry is not looked at.
    if let Some(first) = state.keys.get(key)
        && !state.quirks.order_per_request
    {
        return first.clone();
    }
    let json_body = request
        .header("content-type")
        .is_some_and(|t| t.starts_with("application/json"));
    if !json_body {
        return answer(
            400,
            json!({"error": "Content-Type must be application/json"}),
        );
    }
    let Ok(body) = serde_json::from_slice::<Value>(&request.body) else {
        return answer(400, json!({"error": "Invalid JSON"}));
    };
    let d = state.dialect.clone();
    let mut errors = Vec::new();
    let item = body[d.item].as_str().filter(|i| !i.trim().is_empty());
    if item.is_none() {
        errors.push(format!("{} is required", d.item));
    }
    let quantity = body[d.quantity].as_i64().filter(|q| *q >= 1);
    if quantity.is_none() {
        errors.push(format!("{} must be a positive integer", d.quantity));
    }
    if body[d.price].as_f64().is_none_or(|p| p < 0.0) {
        errors.push(format!("{} must be a number >= 0", d.price));
    }
    if !errors.is_empty() {
        return answer(422, json!({ "errors": errors }));
    }
    let n = state.orders.len() + 1;
    let id = if d.string_ids {
        Value::from(format!("p-{n}"))
    } else {
        Value::from(n)
    };
    let mut order = serde_json::Map::new();
    order.insert("id".into(), id.clone());
    order.insert(d.item.into(), Value::from(item));
    order.insert(d.quantity.into(), Value::from(quantity));
    order.insert(d.price.into(), body[d.price].clone());
    let order = Value::Object(order);
    state.orders.push(order.clone());
    let created = Answer {
        status: 201,
        body: d.wrap(order).to_string(),
        location: Some(format!("{}/{}", d.base, id_text(&id))),
    };
    state.keys.insert(key.to_owned(), created.clone());
    created
}
