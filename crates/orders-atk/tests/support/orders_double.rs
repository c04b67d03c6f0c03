//! A small implementation of this contract's orders API, to point `chaos`
//! at: `POST /v1/orders`, `GET /v1/orders` (`{"data": […], "next_cursor":
//! null}`, newest first), `GET`, `PATCH` and `DELETE /v1/orders/{id}`, every
//! change under an `Idempotency-Key` whose first answer below 500 is
//! recorded and replayed (`201` as `200`), a different request under a used
//! key refused `409`. No authentication; one request at a time (one lock),
//! so what it does is linearizable by construction; one request per
//! connection. [`Mode`] breaks one rule on purpose.

use std::collections::HashMap;
use std::io::{BufReader, Write};
use std::net::TcpStream;
use std::sync::{Arc, Mutex};

use orders_atk::history::canonical;
use orders_atk::wire::Message;
use serde_json::{Value, json};

use super::front::Front;

/// What the double gets wrong, if anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Keeps the contract.
    Faithful,
    /// A used key replays its first answer whatever the request: a changed
    /// body gets the first order (the seed's design).
    ReplaysChangedBody,
}

pub struct OrdersDouble {
    pub address: String,
    _front: Front,
}

struct Recorded {
    fingerprint: String,
    status: u16,
    body: Value,
}

struct State {
    mode: Mode,
    orders: Vec<Value>,
    ledger: HashMap<String, Recorded>,
    next: u64,
}

impl OrdersDouble {
    pub fn start(mode: Mode) -> Self {
        let state = Arc::new(Mutex::new(State {
            mode,
            orders: Vec::new(),
            ledger: HashMap::new(),
            next: 1,
        }));
        let front = Front::start(move |client| serve(client, &state));
        Self {
            address: front.address.clone(),
            _front: front,
        }
    }
}

fn serve(client: TcpStream, state: &Mutex<State>) {
    let mut reader = BufReader::new(client.try_clone().expect("clone"));
    let Some(request) = Message::read(&mut reader) else {
        return;
    };
    let (status, body) = {
        let mut state = state.lock().expect("state");
        route(&request, &mut state)
    };
    let body = body.to_string();
    let head = format!(
        "HTTP/1.1 {status} Double\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let mut client = client;
    let _ = client.write_all(head.as_bytes());
    let _ = client.write_all(body.as_bytes());
    let _ = client.flush();
}

fn route(request: &Message, state: &mut State) -> (u16, Value) {
    let path = request.path().to_owned();
    let id = path.strip_prefix("/v1/orders/").map(str::to_owned);
    match (request.method(), path.as_str(), id) {
        ("GET", "/v1/orders", _) => {
            let newest_first: Vec<Value> = state.orders.iter().rev().cloned().collect();
            (200, json!({"data": newest_first, "next_cursor": null}))
        }
        ("GET", _, Some(id)) => match state.orders.iter().find(|o| o["id"] == id.as_str()) {
            Some(order) => (200, order.clone()),
            None => (404, json!({"error": "NOT_FOUND"})),
        },
        (method @ ("POST" | "PATCH" | "DELETE"), _, id) => {
            let Some(key) = request.header("idempotency-key").map(str::to_owned) else {
                return (400, json!({"error": "VALIDATION_FAILED"}));
            };
            let body: Value = if request.body.is_empty() {
                Value::Null
            } else {
                match serde_json::from_slice(&request.body) {
                    Ok(body) => body,
                    Err(_) => return (400, json!({"error": "MALFORMED_JSON"})),
                }
            };
            let fingerprint = format!("{method} {path} {}", canonical(&body));
            if let Some(first) = state.ledger.get(&key) {
                if first.fingerprint != fingerprint && state.mode == Mode::Faithful {
                    return (
                        409,
                        json!({"error": "IDEMPOTENCY_KEY_REUSED_WITH_DIFFERENT_PAYLOAD"}),
                    );
                }
                let status = if first.status == 201 {
                    200
                } else {
                    first.status
                };
                return (status, first.body.clone());
            }
            let (status, answer) = match (method, id) {
                ("POST", None) => create(state, &body),
                ("PATCH", Some(id)) => update(state, &id, &body),
                ("DELETE", Some(id)) => cancel(state, &id),
                _ => return (405, json!({"error": "METHOD_NOT_ALLOWED"})),
            };
            if status != 422 {
                state.ledger.insert(
                    key,
                    Recorded {
                        fingerprint,
                        status,
                        body: answer.clone(),
                    },
                );
            }
            (status, answer)
        }
        _ => (404, json!({"error": "NOT_FOUND"})),
    }
}

fn create(state: &mut State, body: &Value) -> (u16, Value) {
    let valid = body["item"].is_string() && body["quantity"].is_u64() && body["price"].is_number();
    if !valid {
        return (422, json!({"error": "VALIDATION_FAILED"}));
    }
    let id = format!("d-{}", state.next);
    state.next += 1;
    let order = json!({
        "id": id,
        "item": body["item"],
        "quantity": body["quantity"],
        "price": body["price"],
        "status": "pending",
    });
    state.orders.push(order.clone());
    (201, order)
}

fn update(state: &mut State, id: &str, body: &Value) -> (u16, Value) {
    let Some(order) = state.orders.iter_mut().find(|o| o["id"] == id) else {
        return (404, json!({"error": "NOT_FOUND"}));
    };
    if order["status"] == "cancelled" {
        return (409, json!({"error": "ORDER_NOT_PENDING"}));
    }
    for field in ["item", "quantity", "price"] {
        if let Some(value) = body.get(field) {
            order[field] = value.clone();
        }
    }
    (200, order.clone())
}

fn cancel(state: &mut State, id: &str) -> (u16, Value) {
    let Some(order) = state.orders.iter_mut().find(|o| o["id"] == id) else {
        return (404, json!({"error": "NOT_FOUND"}));
    };
    order["status"] = json!("cancelled");
    (200, order.clone())
}
