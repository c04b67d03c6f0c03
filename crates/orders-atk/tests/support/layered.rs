//! An orders application behind an idempotency layer of the kind the
//! registries offer as middleware: the layer, not the application, reads
//! the key, records answers and replays them. [`Layer`] sets what the layer
//! does wrong (what it records, how it compares bodies, how long a key may
//! be, what it calls its headers), [`App`] what the application behind it
//! accepts and which routes it has.
//!
//! `POST /orders` takes `{"item", "quantity", "price"}` and answers `201`
//! with an integer id and `Location`; `GET /orders` lists every order (a
//! JSON array); `GET`, `PATCH` and `DELETE /orders/{id}` where the app has
//! them (an Express-style HTML 404 page where it has not). No
//! authentication; one request at a time (one lock), so a race creates one
//! order; one request per connection.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufReader, Write};
use std::net::TcpStream;
use std::sync::{Arc, Mutex};

use orders_atk::history::canonical;
use orders_atk::wire::Message;
use serde_json::{Value, json};

use super::front::Front;

/// How the layer tells a retry from another request under the same key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compare {
    /// The body's canonical JSON: member order and whitespace do not matter.
    Canonical,
    /// The order's members as text, others ignored: `"2"` is `2`, an added
    /// member changes nothing.
    Loose,
    /// The body's bytes: reordered members are another request.
    Bytes,
}

/// The idempotency layer in front of the app.
#[derive(Debug, Clone, Copy)]
pub struct Layer {
    /// The header it reads the key from.
    pub key_header: &'static str,
    /// The header it marks a replay with (value `true`).
    pub replay_header: &'static str,
    /// Records the app's 4xx answers too (and replays them for the key).
    pub records_refusals: bool,
    pub compare: Compare,
    /// Keeps only the first N characters of a key.
    pub key_chars_kept: Option<usize>,
    /// Refuses (400) a key longer than this.
    pub max_key: Option<usize>,
    /// Replays a recorded `201` as `201` (not `200`).
    pub replays_201: bool,
    /// The HTTP server in front refuses a request whose head is longer
    /// than this many bytes with `431`, before the layer sees it.
    pub head_limit: Option<usize>,
    /// Refuses (`422`) the retry of a request it recorded, instead of
    /// replaying it (a cache that lost the body's hash).
    pub refuses_retries: bool,
}

impl Layer {
    /// A careful layer: canonical comparison, refusals not recorded, keys
    /// of 255 characters at most, replays as `200` with `Idempotent-Replayed`.
    pub const CAREFUL: Layer = Layer {
        key_header: "Idempotency-Key",
        replay_header: "Idempotent-Replayed",
        records_refusals: false,
        compare: Compare::Canonical,
        key_chars_kept: None,
        max_key: Some(255),
        replays_201: false,
        head_limit: None,
        refuses_retries: false,
    };
}

/// The application behind the layer.
#[derive(Debug, Clone, Copy)]
pub struct App {
    /// Takes a number with an integral value as a quantity (`1.0`, `1e2`).
    pub lax_quantity: bool,
    /// A body without an item is answered with this status and body (a
    /// crash page), instead of `422`.
    pub crash: Option<(u16, &'static str)>,
    pub has_patch: bool,
    pub has_delete: bool,
}

impl App {
    /// Strict validation, every route.
    pub const STRICT: App = App {
        lax_quantity: false,
        crash: None,
        has_patch: true,
        has_delete: true,
    };
}

pub struct Layered {
    pub address: String,
    _front: Front,
    state: Arc<Mutex<State>>,
}

struct Recorded {
    fingerprint: String,
    status: u16,
    body: String,
    location: Option<String>,
}

struct State {
    layer: Layer,
    app: App,
    orders: Vec<Value>,
    records: HashMap<String, Recorded>,
}

/// An answer: status, content type, body, Location, replayed.
struct Answer {
    status: u16,
    html: bool,
    body: String,
    location: Option<String>,
    replayed: bool,
}

fn answer(status: u16, body: Value) -> Answer {
    Answer {
        status,
        html: false,
        body: body.to_string(),
        location: None,
        replayed: false,
    }
}

impl Layered {
    pub fn start(layer: Layer, app: App) -> Self {
        let state = Arc::new(Mutex::new(State {
            layer,
            app,
            orders: Vec::new(),
            records: HashMap::new(),
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

    /// How many orders the app holds.
    pub fn order_count(&self) -> usize {
        self.state.lock().expect("state").orders.len()
    }
}

fn serve(client: TcpStream, state: &Mutex<State>) {
    let mut reader = BufReader::new(client.try_clone().expect("clone"));
    let Some(request) = Message::read(&mut reader) else {
        return;
    };
    let (answer, replay_header) = {
        let mut state = state.lock().expect("state");
        let head: usize = request.start.len()
            + request
                .headers
                .iter()
                .map(|(n, v)| n.len() + v.len() + 4)
                .sum::<usize>();
        let answer = match state.layer.head_limit {
            Some(limit) if head > limit => Answer {
                status: 431,
                html: true,
                body: "<h1>431 Request Header Fields Too Large</h1>".to_owned(),
                location: None,
                replayed: false,
            },
            _ => layer(&request, &mut state),
        };
        (answer, state.layer.replay_header)
    };
    let content_type = if answer.html {
        "text/html; charset=utf-8"
    } else {
        "application/json"
    };
    let mut head = format!(
        "HTTP/1.1 {} Layered\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n",
        answer.status,
        answer.body.len()
    );
    if let Some(location) = &answer.location {
        head.push_str(&format!("Location: {location}\r\n"));
    }
    if answer.replayed {
        head.push_str(&format!("{replay_header}: true\r\n"));
    }
    head.push_str("\r\n");
    let mut client = client;
    let _ = client.write_all(head.as_bytes());
    let _ = client.write_all(answer.body.as_bytes());
    let _ = client.flush();
}

/// The body as the layer compares it.
fn fingerprint(compare: Compare, request: &Message) -> String {
    let body = serde_json::from_slice::<Value>(&request.body).unwrap_or(Value::Null);
    let what = match compare {
        Compare::Canonical => canonical(&body),
        Compare::Bytes => String::from_utf8_lossy(&request.body).into_owned(),
        Compare::Loose => {
            let text = |v: Option<&Value>| match v {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Null) | None => String::new(),
                Some(other) => other.to_string(),
            };
            let members: BTreeMap<&str, String> = ["item", "quantity", "price"]
                .into_iter()
                .map(|m| (m, text(body.get(m))))
                .collect();
            format!("{members:?}")
        }
    };
    format!("{} {} {what}", request.method(), request.path())
}

fn layer(request: &Message, state: &mut State) -> Answer {
    let layer = state.layer;
    if !matches!(request.method(), "POST" | "PATCH" | "DELETE") {
        return app(request, state);
    }
    let Some(key) = request
        .header(layer.key_header)
        .filter(|k| !k.trim().is_empty())
    else {
        return answer(
            400,
            json!({"error": format!("{} header is required", layer.key_header)}),
        );
    };
    if layer.max_key.is_some_and(|max| key.len() > max) {
        return answer(400, json!({"error": "idempotency key too long"}));
    }
    let key: String = match layer.key_chars_kept {
        Some(kept) => key.chars().take(kept).collect(),
        None => key.to_owned(),
    };
    let fingerprint = fingerprint(layer.compare, request);
    if let Some(recorded) = state.records.get(&key) {
        if recorded.fingerprint != fingerprint {
            return answer(
                409,
                json!({"error": "Idempotency key reused with a different request payload"}),
            );
        }
        if layer.refuses_retries {
            return answer(
                422,
                json!({"error": "Payload does not match stored record for this event key"}),
            );
        }
        let status = if recorded.status == 201 && !layer.replays_201 {
            200
        } else {
            recorded.status
        };
        return Answer {
            status,
            html: false,
            body: recorded.body.clone(),
            location: recorded.location.clone(),
            replayed: true,
        };
    }
    let answer = app(request, state);
    if answer.status < 400 || (answer.status < 500 && layer.records_refusals) {
        state.records.insert(
            key,
            Recorded {
                fingerprint,
                status: answer.status,
                body: answer.body.clone(),
                location: answer.location.clone(),
            },
        );
    }
    answer
}

fn not_found(request: &Message) -> Answer {
    Answer {
        status: 404,
        html: true,
        body: format!(
            "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>Error</title>\n</head>\n<body>\n<pre>Cannot {} {}</pre>\n</body>\n</html>\n",
            request.method(),
            request.path()
        ),
        location: None,
        replayed: false,
    }
}

fn app(request: &Message, state: &mut State) -> Answer {
    let path = request.path();
    let id = path.strip_prefix("/orders/");
    let position = id.and_then(|id| {
        state
            .orders
            .iter()
            .position(|o| o["id"].as_u64() == id.parse().ok())
    });
    match (request.method(), path, position) {
        ("POST", "/orders", _) => create(request, state),
        ("GET", "/orders", _) => answer(200, Value::Array(state.orders.clone())),
        ("GET", _, Some(at)) => answer(200, state.orders[at].clone()),
        ("PATCH", _, Some(at)) if state.app.has_patch => {
            let body = serde_json::from_slice::<Value>(&request.body).unwrap_or(Value::Null);
            if let Some(quantity) = body.get("quantity").filter(|q| q.is_u64()) {
                state.orders[at]["quantity"] = quantity.clone();
            }
            answer(200, state.orders[at].clone())
        }
        ("DELETE", _, Some(at)) if state.app.has_delete => {
            state.orders[at]["status"] = json!("cancelled");
            answer(200, state.orders[at].clone())
        }
        ("GET", _, None) if id.is_some() => answer(404, json!({"error": "order not found"})),
        ("PATCH", _, None) if id.is_some() && state.app.has_patch => {
            answer(404, json!({"error": "order not found"}))
        }
        ("DELETE", _, None) if id.is_some() && state.app.has_delete => {
            answer(404, json!({"error": "order not found"}))
        }
        _ => not_found(request),
    }
}

fn create(request: &Message, state: &mut State) -> Answer {
    let json_body = request
        .header("content-type")
        .is_some_and(|t| t.starts_with("application/json"));
    if !json_body {
        return answer(415, json!({"error": "application/json only"}));
    }
    let Ok(body) = serde_json::from_slice::<Value>(&request.body) else {
        return answer(400, json!({"error": "invalid JSON"}));
    };
    let item = body["item"].as_str().filter(|i| !i.trim().is_empty());
    if item.is_none()
        && let Some((status, page)) = state.app.crash
    {
        return Answer {
            status,
            html: page.trim_start().starts_with('<'),
            body: page.to_owned(),
            location: None,
            replayed: false,
        };
    }
    let quantity = &body["quantity"];
    let quantity_ok = if state.app.lax_quantity {
        quantity
            .as_f64()
            .is_some_and(|q| q >= 1.0 && q.fract() == 0.0)
    } else {
        quantity.is_u64() && quantity.as_u64().is_some_and(|q| q >= 1)
    };
    let price_ok = body["price"].as_f64().is_some_and(|p| p >= 0.0);
    if item.is_none() || !quantity_ok || !price_ok {
        return answer(422, json!({"error": "validation failed"}));
    }
    let id = state.orders.len() + 1;
    let order = json!({
        "id": id,
        "item": item,
        "quantity": quantity,
        "price": body["price"],
        "status": "pending",
    });
    state.orders.push(order.clone());
    Answer {
        status: 201,
        html: false,
        body: order.to_string(),
        location: Some(format!("/orders/{id}")),
        replayed: false,
    }
}
