//! Sending queued operations: one attempt, or a drain until the outbox is
//! empty, each operation with its stored key.

use std::time::{Duration, Instant};

use super::outbox::{Claimed, Drainer, Outbox, OutboxError, Outcome, now_millis};

/// Where and as whom operations are sent, and how retries are spaced.
#[derive(Debug, Clone)]
pub struct Server {
    /// e.g. `http://127.0.0.1:8080`.
    pub base_url: String,
    /// A bearer token (`orders-api keys create USER_ID`).
    pub token: String,
    /// How long one request may take before it counts as a lost answer.
    /// Far below the outbox's lease, so a lease never ends mid-request.
    pub timeout: Duration,
    /// How long opening a connection may take. A drain's last send may
    /// start just before its deadline and is still given this long, so a
    /// drain ends at most this much after its `max_wait`.
    pub connect_timeout: Duration,
    /// The backoff ceiling of the first retry, doubled for each one after.
    pub base_delay: Duration,
    /// No backoff is longer. A `Retry-After` is honoured beyond it, up to
    /// [`MAX_RETRY_AFTER`].
    pub max_delay: Duration,
}

/// The longest `Retry-After` honoured (as the browser client does): a
/// longer one is waited for this long, so that an operation is never put
/// off for good by one answer. A `sync` waits for it only within its
/// `--max-wait`.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(300);

impl Server {
    pub fn new(base_url: &str, token: &str) -> Self {
        Self {
            base_url: base_url.trim_end_matches('/').to_owned(),
            token: token.to_owned(),
            timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(3),
            base_delay: Duration::from_millis(200),
            max_delay: Duration::from_secs(10),
        }
    }
}

/// Why sending stopped short.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    #[error(transparent)]
    Outbox(#[from] OutboxError),
    /// `401`: the token, not the operation, is wrong; nothing was recorded
    /// on the server and the operation stays pending.
    #[error("the server refused the token (401): fix --token / ORDERS_API_TOKEN, then sync again")]
    Unauthorized,
}

/// Where a test may ask the client to die (`ORDERS_CLIENT_CRASH_AT`): the
/// points between the outbox's durable steps. Read once per process; a
/// crash is `std::process::abort`, as abrupt as `kill -9`. Compiled in only
/// with the `crash-points` feature, which the test suite enables: a release
/// binary never reads the variable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(feature = "crash-points"), allow(dead_code))]
enum CrashPoint {
    /// Leased, not sent.
    AfterClaim,
    /// Answered, not recorded.
    AfterSend,
}

#[cfg(feature = "crash-points")]
const CRASH_AT_ENV: &str = "ORDERS_CLIENT_CRASH_AT";

#[cfg(feature = "crash-points")]
fn crash_point() -> Option<CrashPoint> {
    match std::env::var(CRASH_AT_ENV).ok()?.as_str() {
        "after_claim" => Some(CrashPoint::AfterClaim),
        "after_send" => Some(CrashPoint::AfterSend),
        _ => None,
    }
}

#[cfg(not(feature = "crash-points"))]
fn crash_point() -> Option<CrashPoint> {
    None
}

fn crash_if(at: CrashPoint, wanted: Option<CrashPoint>) {
    #[cfg(feature = "crash-points")]
    if wanted == Some(at) {
        eprintln!("{CRASH_AT_ENV}: aborting at {at:?}");
        std::process::abort();
    }
    #[cfg(not(feature = "crash-points"))]
    let _ = (at, wanted);
}

/// What a drain came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Drained {
    /// Operations still pending when it stopped (0: the outbox is empty).
    pub pending: i64,
    /// The last reason an operation was put back, if any.
    pub last_error: Option<String>,
    /// How long until the next pending operation is due (a backoff or a
    /// `Retry-After` running past the drain's end), when it is not due yet.
    pub next_due_in: Option<Duration>,
}

/// Sends operations from one outbox to one server.
pub struct Sender<'a> {
    outbox: &'a mut Outbox,
    drainer: Drainer,
    server: Server,
    agent: ureq::Agent,
    crash_at: Option<CrashPoint>,
}

impl<'a> Sender<'a> {
    pub fn new(outbox: &'a mut Outbox, server: Server) -> Result<Self, OutboxError> {
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(server.timeout))
            .timeout_connect(Some(server.connect_timeout))
            .build()
            .into();
        Ok(Self {
            drainer: outbox.drainer()?,
            outbox,
            server,
            agent,
            crash_at: crash_point(),
        })
    }

    /// One attempt at operation `id`, if it may be sent now (its resource has
    /// nothing pending before it and no other drainer holds it). `None`: it
    /// was not sent.
    pub fn try_once(&mut self, id: i64) -> Result<Option<Outcome>, SendError> {
        let Some(claimed) = self.outbox.claim(&self.drainer, Some(id))? else {
            return Ok(None);
        };
        self.send_and_record(&claimed, self.server.timeout)
            .map(Some)
    }

    /// Sends until nothing is pending, or until `max_wait` has passed while
    /// something still is; `progress` hears after each step.
    ///
    /// Returns within `max_wait` plus one connect timeout, whatever the
    /// server does: the deadline is checked before every send (once it has
    /// passed nothing more is sent; the first send of a drain always goes),
    /// and each request may take only what is left of it, and at least the
    /// connect timeout.
    pub fn drain(
        &mut self,
        max_wait: Duration,
        mut progress: impl FnMut(&mut Outbox),
    ) -> Result<Drained, SendError> {
        let deadline = Instant::now() + max_wait;
        let mut last_error = None;
        let mut sent = false;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if sent && left.is_zero() {
                let (pending, due) = self.outbox.pending()?;
                return Ok(Drained {
                    pending,
                    last_error,
                    next_due_in: due_in(due),
                });
            }
            if let Some(claimed) = self.outbox.claim(&self.drainer, None)? {
                let budget = left
                    .max(self.server.connect_timeout)
                    .min(self.server.timeout);
                sent = true;
                if let Outcome::Retry { reason, .. } = self.send_and_record(&claimed, budget)? {
                    last_error = Some(reason);
                }
                progress(self.outbox);
                continue;
            }
            let (pending, due) = self.outbox.pending()?;
            progress(self.outbox);
            let now = Instant::now();
            if pending == 0 || now >= deadline {
                return Ok(Drained {
                    pending,
                    last_error,
                    next_due_in: due_in(due).filter(|_| pending > 0),
                });
            }
            // Wait for the next operation to be due (or for another
            // drainer to finish one), in short steps.
            let until_due = due
                .map(|due| due.saturating_sub(now_millis()).max(0))
                .and_then(|ms| u64::try_from(ms).ok())
                .map(Duration::from_millis)
                .unwrap_or_default();
            let nap = until_due
                .clamp(Duration::from_millis(10), Duration::from_millis(200))
                .min(deadline - now);
            std::thread::sleep(nap);
        }
    }

    /// Sends `claimed` (the request may take at most `timeout`) and
    /// records its outcome.
    fn send_and_record(
        &mut self,
        claimed: &Claimed,
        timeout: Duration,
    ) -> Result<Outcome, SendError> {
        crash_if(CrashPoint::AfterClaim, self.crash_at);
        let outcome = self.send(claimed, timeout);
        crash_if(CrashPoint::AfterSend, self.crash_at);
        let outcome = match outcome {
            Ok(outcome) => outcome,
            Err(SendError::Unauthorized) => {
                let put_back = Outcome::Retry {
                    reason: "401 UNAUTHORIZED: the token was refused".into(),
                    after: Duration::ZERO,
                };
                self.outbox.record(claimed, &self.drainer, &put_back)?;
                return Err(SendError::Unauthorized);
            }
            Err(e) => return Err(e),
        };
        self.outbox.record(claimed, &self.drainer, &outcome)?;
        Ok(outcome)
    }

    /// One request. Connection errors, timeouts, `5xx`, `429` and
    /// `409 IDEMPOTENCY_IN_PROGRESS` come back as a retry after a full-jitter
    /// backoff, and at least the answer's `Retry-After` (up to
    /// [`MAX_RETRY_AFTER`]).
    fn send(&self, claimed: &Claimed, timeout: Duration) -> Result<Outcome, SendError> {
        let retry = |reason: String, at_least: Duration| Outcome::Retry {
            reason,
            after: backoff(&self.server, claimed.attempts).max(at_least),
        };
        let url = format!("{}{}", self.server.base_url, claimed.path);
        let mut request = ureq::http::Request::builder()
            .method(claimed.method.as_str())
            .uri(&url)
            .header("Authorization", format!("Bearer {}", self.server.token))
            .header("Idempotency-Key", &claimed.key);
        if claimed.body.is_some() {
            request = request.header("Content-Type", "application/json");
        }
        let request = match request.body(claimed.body.clone().unwrap_or_default().into_bytes()) {
            Ok(request) => request,
            Err(e) => {
                return Ok(retry(
                    format!("cannot build the request: {e}"),
                    Duration::ZERO,
                ));
            }
        };
        let request = self
            .agent
            .configure_request(request)
            .timeout_global(Some(timeout))
            .build();
        let mut response = match self.agent.run(request) {
            Ok(response) => response,
            // Refused, reset, timed out: it may have run; the key makes the retry safe.
            Err(e) => return Ok(retry(format!("no answer ({e})"), Duration::ZERO)),
        };
        let status = response.status().as_u16();
        let retry_after = response
            .headers()
            .get("Retry-After")
            .and_then(|v| v.to_str().ok())
            .map(retry_after)
            .unwrap_or_default();
        let body = match response.body_mut().read_to_string() {
            Ok(body) => body,
            Err(e) => return Ok(retry(format!("the answer was cut ({e})"), Duration::ZERO)),
        };
        let code = serde_json::from_str::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v.get("error")?.as_str().map(str::to_owned))
            .unwrap_or_default();
        Ok(match status {
            401 => return Err(SendError::Unauthorized),
            409 if code == "IDEMPOTENCY_IN_PROGRESS" => {
                retry("409 IDEMPOTENCY_IN_PROGRESS".into(), retry_after)
            }
            408 | 429 | 500..=599 => retry(
                format!("{status} {code}").trim_end().to_owned(),
                retry_after,
            ),
            _ => Outcome::Answered { status, body },
        })
    }
}

/// How long until `due` (milliseconds since the epoch), when it is ahead.
fn due_in(due: Option<i64>) -> Option<Duration> {
    let ahead = due?.checked_sub(now_millis()).filter(|ms| *ms > 0)?;
    Some(Duration::from_millis(u64::try_from(ahead).ok()?))
}

/// A `Retry-After` (RFC 9110): delta-seconds (what the server sends) or an
/// HTTP date, as a wait from now, up to [`MAX_RETRY_AFTER`]; zero when it is
/// neither, or a date already past.
pub fn retry_after(value: &str) -> Duration {
    retry_after_at(value, std::time::SystemTime::now())
}

/// [`retry_after`] as read at `now`.
pub fn retry_after_at(value: &str, now: std::time::SystemTime) -> Duration {
    let value = value.trim();
    let wait = if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        // All digits: only too many of them can fail, and that is past the cap.
        value
            .parse::<u64>()
            .map_or(MAX_RETRY_AFTER, Duration::from_secs)
    } else {
        httpdate::parse_http_date(value)
            .ok()
            .and_then(|at| at.duration_since(now).ok())
            .unwrap_or_default()
    };
    wait.min(MAX_RETRY_AFTER)
}

/// Full jitter: a random wait in `0 ..= min(max_delay, base_delay × 2^(attempt-1))`.
fn backoff(server: &Server, attempt: u32) -> Duration {
    let ceiling = server
        .base_delay
        .saturating_mul(2u32.saturating_pow(attempt.saturating_sub(1).min(30)))
        .min(server.max_delay);
    let millis = u64::try_from(ceiling.as_millis()).unwrap_or(u64::MAX);
    // Without an OS random source, wait the whole ceiling: still bounded.
    let random = getrandom::u64().unwrap_or(u64::MAX);
    Duration::from_millis(random % millis.saturating_add(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backoff_stays_under_its_doubling_ceiling() {
        let server = Server::new("http://x", "t");
        for attempt in 1..40 {
            let ceiling = server
                .base_delay
                .saturating_mul(2u32.saturating_pow(attempt - 1))
                .min(server.max_delay);
            assert!(backoff(&server, attempt) <= ceiling);
        }
    }

    #[test]
    fn a_retry_after_is_honoured_up_to_five_minutes() {
        for (value, wait) in [
            ("0", 0),
            ("20", 20),
            (" 120 ", 120),
            ("300", 300),
            ("301", 300),
            ("99999999999999999999999", 300),
            ("", 0),
            ("-5", 0),
            ("+5", 0),
            ("1.5", 0),
            ("Wed, 21 Oct 2015 07:28:00 GMT", 0),
        ] {
            assert_eq!(retry_after(value), Duration::from_secs(wait), "{value:?}");
        }
        let now = httpdate::parse_http_date("Wed, 21 Oct 2015 07:28:00 GMT").unwrap();
        for (date, wait) in [
            ("Wed, 21 Oct 2015 07:28:20 GMT", 20),
            ("Wed, 21 Oct 2015 08:28:00 GMT", 300),
            ("Wed, 21 Oct 2015 07:27:00 GMT", 0),
            ("Wednesday, 21-Oct-15 07:28:30 GMT", 30),
        ] {
            assert_eq!(
                retry_after_at(date, now),
                Duration::from_secs(wait),
                "{date}"
            );
        }
    }
}
