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

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use serde_json::{Value, json};

/// The seed's design on a free port of 127.0.0.1, until dropped.
pub struct SeedServer {
    pub address: String,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    state: Arc<Mutex<State>>,
}

/// An answer as the seed stores it for a key: status, body, Location.
#[derive(Clone)]
struct Answer {
    status: u16,
    body: String,
    location: Option<String>,
}

#[derive(Default)]
struct State {
    orders: Vec<Value>,
    keys: HashMap<String, Answer>,
}

impl SeedServer {
    pub fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the seed server");
        listener.set_nonblocking(true).expect("non-blocking");
        let address = format!("http://{}", listener.local_addr().expect("address"));
        let state = Arc::new(Mutex::new(State::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (stop, state) = (Arc::clone(&stop), Arc::clone(&state));
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    match listener.accept() {
                        Ok((client, _)) => {
                            let state = Arc::clone(&state);
                            std::thread::spawn(move || serve(client, &state));
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(2)),
                    }
                }
            })
        };
        Self {
            address,
            stop,
            thread: Some(thread),
            state,
        }
    }

    /// How many orders it holds.
    pub fn order_count(&self) -> usize {
        self.state.lock().expect("state").orders.len()
    }
}

impl Drop for SeedServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A request: method, path (query dropped), headers (names lower case), body.
struct Request {
    method: String,
    path: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Request {
    fn read(stream: &mut impl BufRead) -> Option<Self> {
        let mut start = String::new();
        stream.read_line(&mut start).ok()?;
        let mut parts = start.split_whitespace();
        let (method, target) = (parts.next()?.to_owned(), parts.next()?);
        let path = target.split('?').next().unwrap_or_default().to_owned();
        let mut headers = Vec::new();
        loop {
            let mut line = String::new();
            stream.read_line(&mut line).ok()?;
            let line = line.trim_end_matches(['\r', '\n']);
            if line.is_empty() {
                break;
            }
            let (name, value) = line.split_once(':')?;
            headers.push((name.trim().to_ascii_lowercase(), value.trim().to_owned()));
        }
        let length = headers
            .iter()
            .find(|(n, _)| n == "content-length")
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or(0);
        let mut body = vec![0; length];
        stream.read_exact(&mut body).ok()?;
        Some(Self {
            method,
            path,
            headers,
            body,
        })
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

fn serve(client: TcpStream, state: &Mutex<State>) {
    client.set_nonblocking(false).expect("blocking");
    let mut reader = BufReader::new(client.try_clone().expect("clone"));
    let Some(request) = Request::read(&mut reader) else {
        return;
    };
    let answer = {
        // One request at a time, as one PHP worker with a table lock would.
        let mut state = state.lock().expect("state");
        route(&request, &mut state)
    };
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

fn answer(status: u16, body: Value) -> Answer {
    Answer {
        status,
        body: body.to_string(),
        location: None,
    }
}

fn route(request: &Request, state: &mut State) -> Answer {
    let id = request.path.strip_prefix("/orders/");
    match (request.method.as_str(), request.path.as_str(), id) {
        ("POST", "/orders", _) => create(request, state),
        ("GET", "/orders", _) => answer(200, Value::Array(state.orders.clone())),
        ("GET", _, Some(id)) => match state
            .orders
            .iter()
            .find(|o| o["id"].as_u64().is_some_and(|n| n.to_string() == id))
        {
            Some(order) => answer(200, order.clone()),
            None => answer(404, json!({"error": "Order not found"})),
        },
        (_, "/orders", _) | (_, _, Some(_)) => answer(405, json!({"error": "Method not allowed"})),
        _ => answer(404, json!({"error": "Not found"})),
    }
}

fn create(request: &Request, state: &mut State) -> Answer {
    let Some(key) = request
        .header("idempotency-key")
        .filter(|k| !k.trim().is_empty())
    else {
        return answer(422, json!({"error": "Idempotency-Key header is required"}));
    };
    // The key alone decides: the body of a retry is not looked at.
    if let Some(first) = state.keys.get(key) {
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
    let mut errors = Vec::new();
    let item = body["item"].as_str().filter(|i| !i.trim().is_empty());
    if item.is_none() {
        errors.push("item is required");
    }
    let quantity = body["quantity"].as_i64().filter(|q| *q >= 1);
    if quantity.is_none() {
        errors.push("quantity must be a positive integer");
    }
    let price = body["price"].as_f64().filter(|p| *p >= 0.0);
    if price.is_none() {
        errors.push("price must be a number >= 0");
    }
    if !errors.is_empty() {
        return answer(422, json!({"errors": errors}));
    }
    let id = state.orders.len() + 1;
    let order = json!({
        "id": id,
        "item": item,
        "quantity": quantity,
        "price": body["price"],
    });
    state.orders.push(order.clone());
    let created = Answer {
        status: 201,
        body: order.to_string(),
        location: Some(format!("/orders/{id}")),
    };
    state.keys.insert(key.to_owned(), created.clone());
    created
}
