//! One HTTP exchange, read whole: the request/response layer that the
//! runner's checks and the server's test suite share. Every status is handed
//! back as an answer (a `409` is what an attack is judged by, not an error);
//! `Err` means that no whole answer arrived (refused, cut, timed out).

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
