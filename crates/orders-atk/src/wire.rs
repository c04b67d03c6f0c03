//! One HTTP exchange, read whole: the request/response layer that the
//! runner's checks and the server's test suite share. Every status is handed
//! back as an answer (a `409` is what an attack is judged by, not an error);
//! `Err` means that no whole answer arrived (refused, cut, timed out).
//! [`Message`] is the other side: one message as a test double in the path
//! (a proxy, a fake server) reads and relays it.

use std::time::Duration;

use serde_json::Value;

/// An answer, read whole.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Response {
    /// The first value of header `name` (any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// How many times header `name` (any case) came back.
    pub fn header_count(&self, name: &str) -> usize {
        self.headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .count()
    }

    /// The body as JSON, when it is JSON.
    pub fn json(&self) -> Option<Value> {
        serde_json::from_str(&self.body).ok()
    }
}

/// An HTTP client whose every request gives up after `timeout`, that follows
/// no redirect and hands every status back.
pub fn agent(timeout: Duration, user_agent: &str) -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .max_redirects(0)
        .timeout_global(Some(timeout))
        .user_agent(user_agent)
        .build()
        .into()
}

/// Sends one request with `agent` and reads the whole answer. Header values
/// that are not UTF-8 are kept lossily, so that evidence shows them.
pub fn exchange<N: AsRef<str>, V: AsRef<str>>(
    agent: &ureq::Agent,
    method: &str,
    url: &str,
    headers: &[(N, V)],
    body: Option<&str>,
) -> Result<Response, ureq::Error> {
    let mut builder = ureq::http::Request::builder().method(method).uri(url);
    for (name, value) in headers {
        builder = builder.header(name.as_ref(), value.as_ref());
    }
    let request = builder.body(body.unwrap_or("").as_bytes().to_vec())?;
    let mut response = agent.run(request)?;
    let status = response.status().as_u16();
    let headers = response
        .headers()
        .iter()
        .map(|(n, v)| {
            (
                n.as_str().to_owned(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    let body = response.body_mut().read_to_string()?;
    Ok(Response {
        status,
        headers,
        body,
    })
}

/// One HTTP/1.1 message as it crosses a socket, for the test doubles that
/// stand in the path (a proxy that breaks what it relays, a fake server):
/// its first line, its headers as sent, and its `Content-Length` body. The
/// head is parsed by `httparse`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// `POST /v1/orders HTTP/1.1`, or `HTTP/1.1 201 Created`.
    pub start: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

/// Header fields a [`Message`] may have.
const MAX_HEADERS: usize = 128;

impl Message {
    /// Reads one message: `None` when the peer went away before a whole
    /// one arrived, or sent something other than an HTTP/1.1 message with
    /// (at most) a `Content-Length` body.
    pub fn read(stream: &mut impl std::io::BufRead) -> Option<Self> {
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            let before = head.len();
            stream.read_until(b'\n', &mut head).ok()?;
            if head.len() == before {
                return None;
            }
        }
        let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let (start, parsed) = if head.starts_with(b"HTTP/") {
            let mut response = httparse::Response::new(&mut fields);
            let httparse::Status::Complete(_) = response.parse(&head).ok()? else {
                return None;
            };
            let start = format!(
                "HTTP/1.{} {} {}",
                response.version?,
                response.code?,
                response.reason.unwrap_or_default()
            );
            (start, response.headers)
        } else {
            let mut request = httparse::Request::new(&mut fields);
            let httparse::Status::Complete(_) = request.parse(&head).ok()? else {
                return None;
            };
            let start = format!(
                "{} {} HTTP/1.{}",
                request.method?, request.path?, request.version?
            );
            (start, request.headers)
        };
        let headers = parsed
            .iter()
            .map(|h| {
                Some((
                    h.name.to_owned(),
                    std::str::from_utf8(h.value).ok()?.to_owned(),
                ))
            })
            .collect::<Option<Vec<_>>>()?;
        let mut message = Self {
            start,
            headers,
            body: Vec::new(),
        };
        if message.header("transfer-encoding").is_some() {
            return None;
        }
        let length = match message.header("content-length") {
            Some(length) => length.parse().ok()?,
            None => 0,
        };
        message.body = vec![0; length];
        stream.read_exact(&mut message.body).ok()?;
        Some(message)
    }

    /// The first value of header `name` (any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Replaces every value of header `name` with `value`.
    pub fn set_header(&mut self, name: &str, value: &str) {
        self.remove_header(name);
        self.headers.push((name.to_owned(), value.to_owned()));
    }

    /// Removes header `name`.
    pub fn remove_header(&mut self, name: &str) {
        self.headers.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
    }

    /// Rewrites a response's status line to `status`.
    pub fn set_status(&mut self, status: u16) {
        self.start = format!("HTTP/1.1 {status} Rewritten");
    }

    /// A request's method.
    pub fn method(&self) -> &str {
        self.start.split(' ').next().unwrap_or_default()
    }

    /// A request's path, without its query.
    pub fn path(&self) -> &str {
        let target = self.start.split(' ').nth(1).unwrap_or_default();
        target.split('?').next().unwrap_or_default()
    }

    /// A response's status (0 for a request).
    pub fn status(&self) -> u16 {
        if !self.start.starts_with("HTTP/") {
            return 0;
        }
        self.start
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0)
    }

    /// The message as it goes on the wire, its `Content-Length` that of
    /// its body.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = format!("{}\r\n", self.start);
        for (name, value) in &self.headers {
            if !name.eq_ignore_ascii_case("content-length") {
                out.push_str(&format!("{name}: {value}\r\n"));
            }
        }
        if !self.body.is_empty() || self.header("content-length").is_some() {
            out.push_str(&format!("Content-Length: {}\r\n", self.body.len()));
        }
        out.push_str("\r\n");
        let mut bytes = out.into_bytes();
        bytes.extend_from_slice(&self.body);
        bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(raw: &str) -> Option<Message> {
        Message::read(&mut raw.as_bytes())
    }

    #[test]
    fn a_request_and_a_response_read_whole_and_write_back_as_they_came() {
        let raw =
            "POST /v1/orders?x=1 HTTP/1.1\r\nIdempotency-Key: k\r\nContent-Length: 2\r\n\r\n{}";
        let request = read(raw).unwrap();
        assert_eq!(
            (request.method(), request.path(), request.status()),
            ("POST", "/v1/orders", 0)
        );
        assert_eq!(request.header("idempotency-key"), Some("k"));
        assert_eq!(request.body, b"{}");
        assert_eq!(String::from_utf8(request.to_bytes()).unwrap(), raw);

        let response = read("HTTP/1.1 201 Created\r\ncontent-length: 0\r\n\r\n").unwrap();
        assert_eq!((response.status(), response.body.len()), (201, 0));
    }

    #[test]
    fn a_cut_head_or_body_a_chunked_body_or_not_http_reads_as_nothing() {
        for raw in [
            "",
            "POST /v1/orders HTTP/1.1\r\nContent-Length: 5\r\n",
            "POST /v1/orders HTTP/1.1\r\nContent-Length: 5\r\n\r\n{}",
            "POST /v1/orders HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            "POST /v1/orders HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
            "hello\r\n\r\n",
        ] {
            assert_eq!(read(raw), None, "{raw:?}");
        }
    }
}
