//! The suite's two network tools, one of each: its HTTP client ([`Client`],
//! which every test's requests go through, the runner's own exchange on
//! ureq) and its accept loop ([`Front`], which every test server stands on:
//! the HTTP fronts of `proxy.rs` and `atk_broken.rs`, the PostgreSQL relay
//! of `failover.rs`, a server that never answers in `client.rs`).
//! Raw sockets stay where a test needs what no client would send
//! (`expect.rs`, `abuse.rs`, `shutdown.rs`).

#![allow(dead_code)] // each test module uses a different part

use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::helpers::TestResponse;

/// An HTTP client of one server (`http://host:port`), as the owner of a
/// token or as nobody, that hands every status back instead of failing on
/// 4xx/5xx; `Err` when no whole answer arrived (refused, cut, timed out).
#[derive(Clone)]
pub struct Client {
    agent: ureq::Agent,
    base: String,
    token: Option<String>,
}

impl Client {
    /// A client acting as the owner of `token`; each request gives up after
    /// `timeout`.
    pub fn new(base: &str, token: &str, timeout: Duration) -> Self {
        Self {
            token: Some(token.to_owned()),
            ..Self::anonymous(base, timeout)
        }
    }

    /// A client without a token.
    pub fn anonymous(base: &str, timeout: Duration) -> Self {
        Self {
            agent: orders_atk::wire::agent(timeout, "orders-api-tests"),
            base: base.trim_end_matches('/').to_owned(),
            token: None,
        }
    }

    /// Any request to `path`, with exactly the given headers.
    pub fn request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&str>,
    ) -> Result<TestResponse, ureq::Error> {
        let url = format!("{}{path}", self.base);
        orders_atk::wire::exchange(&self.agent, method, &url, headers, body).map(TestResponse)
    }

    /// A request as a well-behaved client sends it, as the owner of `token`
    /// (none: no `Authorization`): JSON when there is a body, `key` as the
    /// `Idempotency-Key`, and `extra` headers.
    pub fn call_with(
        &self,
        token: Option<&str>,
        method: &str,
        path: &str,
        key: Option<&str>,
        body: Option<&str>,
        extra: &[(&str, &str)],
    ) -> Result<TestResponse, ureq::Error> {
        let auth = token.map(|t| format!("Bearer {t}"));
        let mut headers: Vec<(&str, &str)> = Vec::new();
        if let Some(auth) = &auth {
            headers.push(("Authorization", auth));
        }
        if let Some(key) = key {
            headers.push(("Idempotency-Key", key));
        }
        if body.is_some() {
            headers.push(("Content-Type", "application/json"));
        }
        headers.extend_from_slice(extra);
        self.request(method, path, &headers, body)
    }

    /// [`Client::call_with`] as the owner of `token`.
    pub fn call_as(
        &self,
        token: &str,
        method: &str,
        path: &str,
        key: Option<&str>,
        body: Option<&str>,
    ) -> Result<TestResponse, ureq::Error> {
        self.call_with(Some(token), method, path, key, body, &[])
    }

    /// [`Client::call_with`] as this client's own user.
    pub fn call(
        &self,
        method: &str,
        path: &str,
        key: Option<&str>,
        body: Option<&str>,
    ) -> Result<TestResponse, ureq::Error> {
        self.call_with(self.token.as_deref(), method, path, key, body, &[])
    }

    /// [`Client::call`] to a server that may stop under it: `None` when no
    /// answer began (refused, or cut before the status line); an answer that
    /// began must arrive whole, else this panics.
    pub fn call_whole_or_none(
        &self,
        method: &str,
        path: &str,
        key: Option<&str>,
        body: Option<&str>,
    ) -> Option<TestResponse> {
        let mut request = ureq::http::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base));
        if let Some(token) = &self.token {
            request = request.header("Authorization", format!("Bearer {token}"));
        }
        if let Some(key) = key {
            request = request.header("Idempotency-Key", key);
        }
        if body.is_some() {
            request = request.header("Content-Type", "application/json");
        }
        let request = request
            .body(body.unwrap_or_default().as_bytes().to_vec())
            .expect("a request");
        let mut response = self.agent.run(request).ok()?;
        let status = response.status().as_u16();
        let headers = response
            .headers()
            .iter()
            .map(|(n, v)| {
                let value = String::from_utf8_lossy(v.as_bytes()).into_owned();
                (n.as_str().to_owned(), value)
            })
            .collect();
        let body = response
            .body_mut()
            .read_to_string()
            .unwrap_or_else(|e| panic!("{method} {path}: the answer {status} was cut: {e}"));
        Some(TestResponse(orders_atk::wire::Response {
            status,
            headers,
            body,
        }))
    }

    pub fn post_order(&self, key: &str, body: &str) -> Result<TestResponse, ureq::Error> {
        self.call("POST", "/v1/orders", Some(key), Some(body))
    }

    /// `GET path` without a token (`/healthz`, `/readyz`, `/metrics`).
    pub fn get(&self, path: &str) -> Result<TestResponse, ureq::Error> {
        self.request("GET", path, &[], None)
    }
}

/// What a [`Front`] does with each connection: the connection, and how many
/// came before it.
type Handler = dyn Fn(TcpStream, usize) + Send + Sync;

/// A listener on a free port of 127.0.0.1 that hands each connection, on a
/// thread of its own, to its handler, until it is dropped.
pub struct Front {
    pub port: u16,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Front {
    pub fn start(handle: impl Fn(TcpStream, usize) + Send + Sync + 'static) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a test server");
        let port = listener.local_addr().expect("its address").port();
        let stop = Arc::new(AtomicBool::new(false));
        let handle: Arc<Handler> = Arc::new(handle);
        let thread = {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                for (n, client) in listener.incoming().enumerate() {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(client) = client else { continue };
                    let handle = Arc::clone(&handle);
                    std::thread::spawn(move || handle(client, n));
                }
            })
        };
        Self {
            port,
            stop,
            thread: Some(thread),
        }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn address(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for Front {
    /// Stops accepting: the loop wakes for one last connection of its own.
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
