//! An HTTP front of a test server, one request per connection, that can lose
//! answers or answer for the server, and that records the `Idempotency-Key`
//! of every request and any two requests with one key in flight at once.

#![allow(dead_code)] // each test module uses a different part

use std::collections::HashSet;
use std::io::{BufReader, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use orders_atk::wire::Message;

use crate::net::Front;

/// What the front does with one request.
#[derive(Clone, Debug)]
pub enum Step {
    /// Pass it to the server and its answer back.
    Forward,
    /// Pass it to the server, wait for its answer, then close the connection
    /// without relaying it: it took effect, the client does not know.
    ForwardThenCut,
    /// Answer this raw response without asking the server.
    Answer(String),
}

/// A raw problem answer, as the server would send it.
pub fn problem(status: &str, code: &str, retry_after: Option<u32>) -> Step {
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

#[derive(Default)]
struct Seen {
    keys: Vec<String>,
    in_flight: HashSet<String>,
    /// Keys that arrived while a request with the same key was in flight.
    overlaps: Vec<String>,
}

type Policy = Box<dyn Fn(usize) -> Step + Send + Sync>;

pub struct Proxy {
    pub address: String,
    seen: Arc<Mutex<Seen>>,
    cut: Arc<AtomicUsize>,
    _front: Front,
}

impl Proxy {
    /// The n-th request gets `script[n]`, every later one is forwarded.
    pub fn scripted(upstream: &str, script: Vec<Step>) -> Self {
        Self::start(
            upstream,
            Box::new(move |n| script.get(n).cloned().unwrap_or(Step::Forward)),
        )
    }

    /// Every `every`-th request (the 2nd, the 2nd + every, …) reaches the
    /// server and its answer is lost.
    pub fn lossy(upstream: &str, every: usize) -> Self {
        Self::start(
            upstream,
            Box::new(move |n| {
                if n % every == 1 {
                    Step::ForwardThenCut
                } else {
                    Step::Forward
                }
            }),
        )
    }

    fn start(upstream: &str, policy: Policy) -> Self {
        let upstream = upstream.trim_start_matches("http://").to_owned();
        let seen = Arc::new(Mutex::new(Seen::default()));
        let cut = Arc::new(AtomicUsize::new(0));
        let front = {
            let (seen, cut) = (Arc::clone(&seen), Arc::clone(&cut));
            // One request per connection: the n-th connection is the n-th request.
            Front::start(move |client, n| serve(client, &upstream, policy(n), &seen, &cut))
        };
        Self {
            address: front.address(),
            seen,
            cut,
            _front: front,
        }
    }

    /// The key of every request, in arrival order.
    pub fn keys(&self) -> Vec<String> {
        self.seen.lock().unwrap().keys.clone()
    }

    /// Keys sent again while a request with that key was still in flight.
    pub fn overlaps(&self) -> Vec<String> {
        self.seen.lock().unwrap().overlaps.clone()
    }

    /// Answers the server gave that the front did not relay.
    pub fn answers_lost(&self) -> usize {
        self.cut.load(Ordering::SeqCst)
    }
}

fn serve(client: TcpStream, upstream: &str, step: Step, seen: &Mutex<Seen>, cut: &AtomicUsize) {
    let Ok(reader) = client.try_clone() else {
        return;
    };
    let Some(request) = Message::read(&mut BufReader::new(reader)) else {
        return;
    };
    let key = request.header("idempotency-key").map(str::to_owned);
    if let Some(key) = &key {
        let mut seen = seen.lock().unwrap();
        seen.keys.push(key.clone());
        if !seen.in_flight.insert(key.clone()) {
            seen.overlaps.push(key.clone());
        }
    }
    let answer = match &step {
        Step::Answer(raw) => Some(raw.as_bytes().to_vec()),
        Step::Forward | Step::ForwardThenCut => forward(upstream, &request),
    };
    // Out of flight before the client can hear anything, so that its next
    // attempt never counts as an overlap.
    if let Some(key) = &key {
        seen.lock().unwrap().in_flight.remove(key);
    }
    let mut client = client;
    match (answer, &step) {
        (Some(_), Step::ForwardThenCut) => {
            cut.fetch_add(1, Ordering::SeqCst);
        }
        (Some(answer), _) => {
            let _ = client.write_all(&answer);
        }
        (None, _) => {}
    }
    let _ = client.shutdown(Shutdown::Both);
}

/// The server's answer to one request, with `Connection: close` added; `None`
/// when the server is down or went away.
fn forward(upstream: &str, request: &Message) -> Option<Vec<u8>> {
    let mut server = TcpStream::connect(upstream).ok()?;
    server.write_all(&request.to_bytes()).ok()?;
    let mut answer = Message::read(&mut BufReader::new(server))?;
    answer.set_header("Connection", "close");
    Some(answer.to_bytes())
}
