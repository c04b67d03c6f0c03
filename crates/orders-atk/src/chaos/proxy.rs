//! `chaos`'s own fault-injecting proxy, on 127.0.0.1: every request of the
//! clients crosses it, one request per connection, and some are broken on
//! the way — dropped before the server sees them, answered by the server
//! but the answer dropped, delayed, or the connection reset (an RST) before
//! or after the server got the request. The faults are drawn from a seeded
//! generator, and each is bounded (a delay lasts at most [`MAX_DELAY`]).
//! A server that cannot be reached is answered `502`, as a gateway would.

use std::io::{BufReader, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use serde::Serialize;

use super::rng::Rng;
use crate::wire::Message;

/// The longest delay the proxy adds to a request or an answer.
pub const MAX_DELAY: Duration = Duration::from_millis(300);
/// How long the proxy waits for a client's request, or the server's answer.
const IO_TIMEOUT: Duration = Duration::from_secs(10);
/// How long it tries to reach the server.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Connections handled at once; more are closed at once.
const MAX_CONNECTIONS: usize = 256;

/// What the proxy did to one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    None,
    /// Waited this long, then passed it on.
    DelayRequest(Duration),
    /// Passed it on, waited this long, then passed the answer back.
    DelayAnswer(Duration),
    /// Closed the connection without passing it on.
    DropRequest,
    /// Passed it on, got the answer, closed the connection without it.
    DropAnswer,
    /// Reset the connection (RST) without passing it on.
    ResetBefore,
    /// Passed it on, got the answer, reset the connection without it.
    ResetAfter,
}

/// How many requests met each fault.
#[derive(Debug, Clone, Default, Serialize)]
pub struct FaultCounts {
    pub requests: usize,
    pub passed: usize,
    pub delayed: usize,
    pub dropped_requests: usize,
    pub dropped_answers: usize,
    pub resets: usize,
    /// Answered `502`: the server could not be reached or gave no answer.
    pub server_unreachable: usize,
    /// Closed at once: too many connections, or no whole request arrived.
    pub refused: usize,
}

struct Shared {
    upstream: SocketAddr,
    rng: Mutex<Rng>,
    counts: Mutex<FaultCounts>,
    open: AtomicUsize,
    /// Set once the run stops: requests still arriving are passed on untouched.
    calm: AtomicBool,
}

/// The proxy, serving until [`FaultProxy::stop`] (or drop).
pub struct FaultProxy {
    pub address: SocketAddr,
    shared: Arc<Shared>,
    stop: Arc<AtomicBool>,
    acceptor: Option<JoinHandle<Vec<JoinHandle<()>>>>,
}

impl FaultProxy {
    /// Listens on a free port of 127.0.0.1 and passes requests on to `upstream`.
    pub fn start(upstream: SocketAddr, seed: u64) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let address = listener.local_addr()?;
        let shared = Arc::new(Shared {
            upstream,
            rng: Mutex::new(Rng::fork(seed, u64::MAX)),
            counts: Mutex::new(FaultCounts::default()),
            open: AtomicUsize::new(0),
            calm: AtomicBool::new(false),
        });
        let stop = Arc::new(AtomicBool::new(false));
        let acceptor = {
            let (shared, stop) = (Arc::clone(&shared), Arc::clone(&stop));
            std::thread::spawn(move || accept(&listener, &shared, &stop))
        };
        Ok(Self {
            address,
            shared,
            stop,
            acceptor: Some(acceptor),
        })
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.address)
    }

    /// From now on, pass every request on untouched.
    pub fn calm(&self) {
        self.shared.calm.store(true, Ordering::SeqCst);
    }

    /// Stops accepting and waits for every connection to end (each is
    /// bounded by its timeouts); returns what happened to the requests.
    pub fn stop(&mut self) -> FaultCounts {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the blocked accept with a connection of our own.
        let _ = TcpStream::connect_timeout(&self.address, CONNECT_TIMEOUT);
        if let Some(acceptor) = self.acceptor.take()
            && let Ok(connections) = acceptor.join()
        {
            for connection in connections {
                let _ = connection.join();
            }
        }
        self.counts()
    }

    pub fn counts(&self) -> FaultCounts {
        self.shared
            .counts
            .lock()
            .map(|c| c.clone())
            .unwrap_or_default()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.stop();
    }
}

fn accept(listener: &TcpListener, shared: &Arc<Shared>, stop: &AtomicBool) -> Vec<JoinHandle<()>> {
    let mut connections: Vec<JoinHandle<()>> = Vec::new();
    for client in listener.incoming() {
        if stop.load(Ordering::SeqCst) {
            break;
        }
        let Ok(client) = client else { continue };
        connections.retain(|c| !c.is_finished());
        if shared.open.load(Ordering::SeqCst) >= MAX_CONNECTIONS {
            count(shared, |c| c.refused += 1);
            let _ = client.shutdown(Shutdown::Both);
            continue;
        }
        shared.open.fetch_add(1, Ordering::SeqCst);
        let shared = Arc::clone(shared);
        connections.push(std::thread::spawn(move || {
            serve(client, &shared);
            shared.open.fetch_sub(1, Ordering::SeqCst);
        }));
    }
    connections
}

fn count(shared: &Shared, f: impl FnOnce(&mut FaultCounts)) {
    if let Ok(mut counts) = shared.counts.lock() {
        f(&mut counts);
    }
}

/// The fault for the next request: most pass untouched.
fn draw(shared: &Shared) -> Fault {
    if shared.calm.load(Ordering::SeqCst) {
        return Fault::None;
    }
    let Ok(mut rng) = shared.rng.lock() else {
        return Fault::None;
    };
    let delay = |rng: &mut Rng| {
        let most = u64::try_from(MAX_DELAY.as_millis()).unwrap_or(300);
        Duration::from_millis(rng.between(1, most))
    };
    // Out of 100: 70 untouched, 8 + 4 delayed, 5 dropped requests, 7
    // dropped answers, 3 + 3 resets.
    match rng.weighted(&[70, 8, 4, 5, 7, 3, 3]) {
        1 => Fault::DelayRequest(delay(&mut rng)),
        2 => Fault::DelayAnswer(delay(&mut rng)),
        3 => Fault::DropRequest,
        4 => Fault::DropAnswer,
        5 => Fault::ResetBefore,
        6 => Fault::ResetAfter,
        _ => Fault::None,
    }
}

/// Closes `stream` with an RST: the client sees "connection reset".
fn reset(stream: TcpStream) {
    let _ = socket2::SockRef::from(&stream).set_linger(Some(Duration::ZERO));
    drop(stream);
}

fn serve(client: TcpStream, shared: &Shared) {
    let _ = client.set_read_timeout(Some(IO_TIMEOUT));
    let _ = client.set_write_timeout(Some(IO_TIMEOUT));
    let Ok(reading) = client.try_clone() else {
        return;
    };
    let Some(mut request) = Message::read(&mut BufReader::new(reading)) else {
        count(shared, |c| c.refused += 1);
        return;
    };
    let fault = draw(shared);
    count(shared, |c| {
        c.requests += 1;
        match fault {
            Fault::None => c.passed += 1,
            Fault::DelayRequest(_) | Fault::DelayAnswer(_) => c.delayed += 1,
            Fault::DropRequest => c.dropped_requests += 1,
            Fault::DropAnswer => c.dropped_answers += 1,
            Fault::ResetBefore | Fault::ResetAfter => c.resets += 1,
        }
    });
    match fault {
        Fault::DropRequest => {
            let _ = client.shutdown(Shutdown::Both);
            return;
        }
        Fault::ResetBefore => return reset(client),
        Fault::DelayRequest(pause) => std::thread::sleep(pause),
        _ => {}
    }
    request.set_header("Connection", "close");
    let Some(mut answer) = forward(shared.upstream, &request) else {
        count(shared, |c| c.server_unreachable += 1);
        let body = r#"{"title":"Bad Gateway","status":502,"detail":"chaos proxy: the server gave no answer"}"#;
        let _ = (&client).write_all(
            format!(
                "HTTP/1.1 502 Bad Gateway\r\nContent-Type: application/problem+json\r\n\
                 Connection: close\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            )
            .as_bytes(),
        );
        return;
    };
    match fault {
        Fault::DropAnswer => {
            let _ = client.shutdown(Shutdown::Both);
            return;
        }
        Fault::ResetAfter => return reset(client),
        Fault::DelayAnswer(pause) => std::thread::sleep(pause),
        _ => {}
    }
    answer.set_header("Connection", "close");
    let mut client = client;
    let _ = client.write_all(&answer.to_bytes());
    let _ = client.flush();
}

/// Passes `request` to the server on a connection of its own; its answer.
fn forward(upstream: SocketAddr, request: &Message) -> Option<Message> {
    let mut server = TcpStream::connect_timeout(&upstream, CONNECT_TIMEOUT).ok()?;
    server.set_read_timeout(Some(IO_TIMEOUT)).ok()?;
    server.set_write_timeout(Some(IO_TIMEOUT)).ok()?;
    server.write_all(&request.to_bytes()).ok()?;
    server.flush().ok()?;
    Message::read(&mut BufReader::new(server))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shared() -> Shared {
        Shared {
            upstream: SocketAddr::from(([127, 0, 0, 1], 9)),
            rng: Mutex::new(Rng::new(3)),
            counts: Mutex::new(FaultCounts::default()),
            open: AtomicUsize::new(0),
            calm: AtomicBool::new(false),
        }
    }

    #[test]
    fn faults_are_a_minority_each_kind_occurs_and_no_delay_exceeds_the_bound() {
        let shared = shared();
        let faults: Vec<Fault> = (0..10_000).map(|_| draw(&shared)).collect();
        let untouched = faults.iter().filter(|f| **f == Fault::None).count();
        assert!((6_500..7_500).contains(&untouched), "{untouched}");
        for kind in [
            Fault::DropRequest,
            Fault::DropAnswer,
            Fault::ResetBefore,
            Fault::ResetAfter,
        ] {
            assert!(faults.contains(&kind), "{kind:?}");
        }
        for fault in faults {
            if let Fault::DelayRequest(d) | Fault::DelayAnswer(d) = fault {
                assert!(d > Duration::ZERO && d <= MAX_DELAY, "{d:?}");
            }
        }
        shared.calm.store(true, Ordering::SeqCst);
        assert!((0..1_000).all(|_| draw(&shared) == Fault::None));
    }

    #[test]
    fn a_server_that_cannot_be_reached_is_answered_502() {
        let mut proxy = FaultProxy::start(
            SocketAddr::from(([127, 0, 0, 1], crate::chaos::tests_free_port())),
            1,
        )
        .unwrap();
        proxy.calm();
        let agent = crate::wire::agent(Duration::from_secs(5), "test");
        let answer = crate::wire::exchange::<&str, &str>(
            &agent,
            "GET",
            &format!("{}/v1/orders", proxy.url()),
            &[],
            None,
        )
        .unwrap();
        assert_eq!(answer.status, 502);
        let counts = proxy.stop();
        assert_eq!((counts.requests, counts.server_unreachable), (1, 1));
    }
}
