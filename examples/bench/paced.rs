//! The open-loop case's load, as cheap per request as the stack allows, so
//! that on a machine it shares with the server it measures the server and
//! not itself: one thread, a tokio current-thread runtime, keep-alive
//! connections each driven by a task, every request written from a fixed
//! head (only its `Idempotency-Key` differs) and every answer read with
//! `httparse`. The 256 blocking senders it replaced cost as much CPU per
//! request as the server did, and on SQLite fell behind the rate they were
//! to hold (`docs/PERFORMANCE.md`, "Open-loop overload").
//!
//! [`paced`] offers requests at a fixed rate (wrk2's pacing: request *i* is
//! due at *start + i / rate*, the next free connection sends it, and its
//! latency counts from when it was due, so a request that waited for a
//! connection is charged its wait); [`closed`] sends each connection's next
//! request as soon as its answer came (the capacity, and the unloaded p99).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// One create's answer: its status (0: no answer), its latency, its key.
pub struct Sent {
    pub status: u16,
    pub micros: u64,
    pub key: String,
}

/// Where and how creates are sent.
#[derive(Clone)]
pub struct Target {
    addr: SocketAddr,
    /// The request up to its `Idempotency-Key` value.
    head: Arc<str>,
    body: Arc<str>,
}

impl Target {
    /// Creates of `body` to `base` (`http://127.0.0.1:PORT`) as `token`.
    pub fn new(base: &str, token: &str, body: &str) -> Self {
        let addr = base
            .trim_start_matches("http://")
            .parse()
            .expect("http://IP:PORT");
        let head = format!(
            "POST /v1/orders HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\nIdempotency-Key: ",
            body.len()
        );
        Self {
            addr,
            head: head.into(),
            body: body.into(),
        }
    }
}

/// A keep-alive connection, opened again when the server closes it.
struct Connection {
    target: Target,
    stream: Option<TcpStream>,
    out: Vec<u8>,
    buf: Vec<u8>,
}

impl Connection {
    fn new(target: Target) -> Self {
        Self {
            target,
            stream: None,
            out: Vec::with_capacity(512),
            buf: Vec::with_capacity(4096),
        }
    }

    /// Sends one create with `key`; its status, or 0 when no answer came.
    async fn create(&mut self, key: &str) -> u16 {
        match self.exchange(key).await {
            Ok(status) => status,
            Err(_) => {
                self.stream = None;
                0
            }
        }
    }

    async fn exchange(&mut self, key: &str) -> std::io::Result<u16> {
        if self.stream.is_none() {
            let stream = TcpStream::connect(self.target.addr).await?;
            stream.set_nodelay(true)?;
            self.stream = Some(stream);
            self.buf.clear();
        }
        let stream = self
            .stream
            .as_mut()
            .ok_or(std::io::ErrorKind::NotConnected)?;
        self.out.clear();
        self.out.extend_from_slice(self.target.head.as_bytes());
        self.out.extend_from_slice(key.as_bytes());
        self.out.extend_from_slice(b"\r\n\r\n");
        self.out.extend_from_slice(self.target.body.as_bytes());
        stream.write_all(&self.out).await?;
        loop {
            let mut headers = [httparse::EMPTY_HEADER; 32];
            let mut response = httparse::Response::new(&mut headers);
            if let httparse::Status::Complete(head_len) = response
                .parse(&self.buf)
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?
            {
                let status = response.code.unwrap_or(0);
                let length = response
                    .headers
                    .iter()
                    .find(|h| h.name.eq_ignore_ascii_case("content-length"))
                    .and_then(|h| std::str::from_utf8(h.value).ok()?.trim().parse().ok())
                    .unwrap_or(0usize);
                let closes = response.headers.iter().any(|h| {
                    h.name.eq_ignore_ascii_case("connection")
                        && h.value.eq_ignore_ascii_case(b"close")
                });
                let whole = head_len + length;
                while self.buf.len() < whole {
                    read_more(stream, &mut self.buf).await?;
                }
                self.buf.drain(..whole);
                if closes {
                    self.stream = None;
                }
                return Ok(status);
            }
            read_more(stream, &mut self.buf).await?;
        }
    }
}

async fn read_more(stream: &mut TcpStream, buf: &mut Vec<u8>) -> std::io::Result<()> {
    let mut chunk = [0u8; 4096];
    let n = stream.read(&mut chunk).await?;
    if n == 0 {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    buf.extend_from_slice(&chunk[..n]);
    Ok(())
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
}

/// Creates offered at `rate` per second for `seconds` over `connections`
/// connections, keys `prefix-i`; every answer, and how many were sent more
/// than 1 ms after they were due.
pub fn paced(
    target: &Target,
    rate: f64,
    connections: usize,
    seconds: u64,
    prefix: &str,
) -> (Vec<Sent>, usize) {
    let total = (rate * seconds as f64) as u64;
    let next = Arc::new(AtomicU64::new(0));
    let late = Arc::new(AtomicUsize::new(0));
    let sent = runtime().block_on(async {
        let start = tokio::time::Instant::now() + Duration::from_millis(100);
        let tasks: Vec<_> = (0..connections)
            .map(|_| {
                let (next, late) = (Arc::clone(&next), Arc::clone(&late));
                let mut connection = Connection::new(target.clone());
                let prefix = prefix.to_owned();
                tokio::spawn(async move {
                    let mut sent = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= total {
                            return sent;
                        }
                        let due = start + Duration::from_secs_f64(i as f64 / rate);
                        let now = tokio::time::Instant::now();
                        if due > now {
                            tokio::time::sleep_until(due).await;
                        } else if now - due > Duration::from_millis(1) {
                            late.fetch_add(1, Ordering::Relaxed);
                        }
                        let key = format!("{prefix}-{i}");
                        let status = connection.create(&key).await;
                        sent.push(Sent {
                            status,
                            micros: due.elapsed().as_micros() as u64,
                            key,
                        });
                    }
                })
            })
            .collect();
        let mut all = Vec::new();
        for task in tasks {
            all.extend(task.await.expect("a sender"));
        }
        all
    });
    (sent, late.load(Ordering::Relaxed))
}

/// Creates from `connections` connections for `seconds`, each sent as soon
/// as its connection's previous one was answered; keys `prefix-c-n`.
pub fn closed(target: &Target, connections: usize, seconds: u64, prefix: &str) -> Vec<Sent> {
    runtime().block_on(async {
        let stop = Instant::now() + Duration::from_secs(seconds);
        let tasks: Vec<_> = (0..connections)
            .map(|c| {
                let mut connection = Connection::new(target.clone());
                let prefix = prefix.to_owned();
                tokio::spawn(async move {
                    let mut sent = Vec::new();
                    let mut n = 0u64;
                    while Instant::now() < stop {
                        let key = format!("{prefix}-{c}-{n}");
                        n += 1;
                        let started = Instant::now();
                        let status = connection.create(&key).await;
                        sent.push(Sent {
                            status,
                            micros: started.elapsed().as_micros() as u64,
                            key,
                        });
                    }
                    sent
                })
            })
            .collect();
        let mut all = Vec::new();
        for task in tasks {
            all.extend(task.await.expect("a client"));
        }
        all
    })
}
