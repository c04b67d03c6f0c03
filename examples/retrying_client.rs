//! A client that creates one order safely over an unreliable network.
//!
//! It makes one fresh `Idempotency-Key` for the order and sends the very same
//! request again, with the *same* key, whenever it cannot know the outcome or
//! the server asks it to come back:
//!
//! - a connection error or a timeout (the order may or may not exist: the
//!   same key makes the retry safe, the server replays instead of creating a
//!   second one);
//! - a `5xx` answer (nothing was recorded; the key is still free);
//! - `409 IDEMPOTENCY_IN_PROGRESS` (the first attempt is still running) and
//!   `429`, waiting at least their `Retry-After`.
//!
//! Between attempts it waits with exponential backoff and full jitter
//! (a random delay in `0 ..= min(max_delay, base_delay × 2^attempt)`), for at
//! most `max_attempts` attempts. Any other answer is final: a `2xx` is the
//! order (`Idempotent-Replayed: true` says an earlier attempt created it), a
//! `4xx` is a problem to fix, not to retry. Only a new order gets a new key.
//!
//! Run it against a local server (`cargo run` prints a token for user `demo`
//! on its first start, or create one with `orders-api keys create USER_ID`):
//!
//! ```text
//! ORDERS_API_TOKEN=oa_… cargo run --example retrying_client -- Widget 2 9.99
//! cargo run --example retrying_client -- --url http://127.0.0.1:8080 --token oa_… Widget 2 9.99
//! ```
//!
//! `ORDERS_API_URL` (default `http://127.0.0.1:8080`) and `ORDERS_API_TOKEN`
//! may be given in the environment; flags win. It prints the order as JSON
//! and exits 0, or explains on stderr and exits 1.

use std::process::ExitCode;
use std::time::Duration;

use serde_json::Value;

/// How the client retries.
#[derive(Debug, Clone)]
pub struct Config {
    /// The server, e.g. `http://127.0.0.1:8080`.
    pub base_url: String,
    /// A bearer token (`orders-api keys create USER_ID`).
    pub token: String,
    /// Attempts in all, the first one included.
    pub max_attempts: u32,
    /// The backoff of the first retry, doubled for each one after.
    pub base_delay: Duration,
    /// No wait is longer, `Retry-After` included.
    pub max_delay: Duration,
    /// How long one attempt may take before it counts as a connection error.
    pub timeout: Duration,
}

impl Config {
    pub fn new(base_url: &str, token: &str) -> Self {
        Self {
            base_url: base_url.trim_end_matches('/').to_owned(),
            token: token.to_owned(),
            max_attempts: 8,
            base_delay: Duration::from_millis(200),
            max_delay: Duration::from_secs(20),
            timeout: Duration::from_secs(10),
        }
    }
}

/// An order the server created, now or on an earlier attempt.
#[derive(Debug, Clone)]
pub struct Created {
    pub order: Value,
    /// The `Idempotency-Key` every attempt carried.
    pub key: String,
    /// `true` when this answer replays an earlier attempt's.
    pub replayed: bool,
    pub attempts: u32,
}

/// Why no order came back.
#[derive(Debug, Clone)]
pub enum Failure {
    /// A final answer: fix the request, do not retry it.
    Rejected { status: u16, problem: String },
    /// Every attempt failed with a retryable error.
    GaveUp { attempts: u32, last: String },
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Rejected { status, problem } => {
                write!(f, "the server refused the order ({status}): {problem}")
            }
            Failure::GaveUp { attempts, last } => {
                write!(f, "gave up after {attempts} attempts; last: {last}")
            }
        }
    }
}

/// What one attempt says about the next.
enum Next {
    Done(Created),
    Stop(Failure),
    /// Retry after the backoff, or after `at_least` if that is longer.
    Retry {
        reason: String,
        at_least: Duration,
    },
}

/// Creates one order (a JSON body such as
/// `{"item":"Widget","quantity":2,"price":9.99}`), retrying as described
/// above. The key is made here: one call, one order.
pub fn create_order(config: &Config, body: &str) -> Result<Created, Failure> {
    let key = uuid::Uuid::new_v4().to_string();
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(config.timeout))
        .build()
        .into();
    let mut last = String::from("no attempt made");
    for attempt in 1..=config.max_attempts.max(1) {
        match attempt_once(&agent, config, &key, body, attempt) {
            Next::Done(created) => return Ok(created),
            Next::Stop(failure) => return Err(failure),
            Next::Retry { reason, at_least } => {
                if attempt == config.max_attempts {
                    last = reason;
                    break;
                }
                let wait = backoff(config, attempt).max(at_least).min(config.max_delay);
                eprintln!("attempt {attempt}: {reason}; retrying in {wait:?} with the same key");
                last = reason;
                std::thread::sleep(wait);
            }
        }
    }
    Err(Failure::GaveUp {
        attempts: config.max_attempts,
        last,
    })
}

fn attempt_once(agent: &ureq::Agent, config: &Config, key: &str, body: &str, attempt: u32) -> Next {
    let response = agent
        .post(format!("{}/v1/orders", config.base_url))
        .header("Authorization", format!("Bearer {}", config.token))
        .header("Idempotency-Key", key)
        .header("Content-Type", "application/json")
        .send(body);
    let mut response = match response {
        Ok(response) => response,
        // Refused, reset, timed out: the order may exist; the key makes the retry safe.
        Err(e) => {
            return Next::Retry {
                reason: format!("no answer ({e})"),
                at_least: Duration::ZERO,
            };
        }
    };
    let status = response.status().as_u16();
    let replayed = response
        .headers()
        .get("Idempotent-Replayed")
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"true"));
    let retry_after = response
        .headers()
        .get("Retry-After")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs)
        .unwrap_or(Duration::ZERO);
    let text = match response.body_mut().read_to_string() {
        Ok(text) => text,
        Err(e) => {
            return Next::Retry {
                reason: format!("the answer was cut ({e})"),
                at_least: Duration::ZERO,
            };
        }
    };
    let json: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    let code = json["error"].as_str().unwrap_or_default();
    match status {
        200..=299 => Next::Done(Created {
            order: json,
            key: key.to_owned(),
            replayed,
            attempts: attempt,
        }),
        409 if code == "IDEMPOTENCY_IN_PROGRESS" => Next::Retry {
            reason: "the first attempt is still running".to_owned(),
            at_least: retry_after,
        },
        429 | 500..=599 => Next::Retry {
            reason: format!("{status} {code}"),
            at_least: retry_after,
        },
        _ => Next::Stop(Failure::Rejected {
            status,
            problem: text,
        }),
    }
}

/// Full jitter: a random wait in `0 ..= min(max_delay, base_delay × 2^(attempt-1))`.
fn backoff(config: &Config, attempt: u32) -> Duration {
    let ceiling = config
        .base_delay
        .saturating_mul(2u32.saturating_pow(attempt.saturating_sub(1)))
        .min(config.max_delay);
    let millis = u64::try_from(ceiling.as_millis()).unwrap_or(u64::MAX);
    // Without an OS random source, wait the whole ceiling: still bounded.
    let random = getrandom::u64().unwrap_or(u64::MAX);
    Duration::from_millis(random % millis.saturating_add(1))
}

/// `[--url URL] [--token TOKEN] ITEM QUANTITY PRICE`
fn parse_args(args: &[String]) -> Result<(Config, String), String> {
    let mut url =
        std::env::var("ORDERS_API_URL").unwrap_or_else(|_| "http://127.0.0.1:8080".into());
    let mut token = std::env::var("ORDERS_API_TOKEN").ok();
    let mut positional = Vec::new();
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        match arg.as_str() {
            "--url" => url = rest.next().ok_or("--url needs a value")?.clone(),
            "--token" => token = Some(rest.next().ok_or("--token needs a value")?.clone()),
            _ => positional.push(arg.clone()),
        }
    }
    let token = token.ok_or("no token: pass --token or set ORDERS_API_TOKEN")?;
    let [item, quantity, price] = positional.as_slice() else {
        return Err(
            "usage: retrying_client [--url URL] [--token TOKEN] ITEM QUANTITY PRICE".into(),
        );
    };
    let number = |name: &str, text: &str| -> Result<serde_json::Number, String> {
        text.parse()
            .map_err(|_| format!("{name} must be a number, not {text:?}"))
    };
    let body = serde_json::json!({
        "item": item,
        "quantity": number("QUANTITY", quantity)?,
        "price": number("PRICE", price)?,
    });
    Ok((Config::new(&url, &token), body.to_string()))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (config, body) = match parse_args(&args) {
        Ok(parsed) => parsed,
        Err(e) => {
            eprintln!("retrying_client: {e}");
            return ExitCode::from(2);
        }
    };
    match create_order(&config, &body) {
        Ok(created) => {
            let how = if created.replayed {
                "an earlier attempt created it"
            } else {
                "created"
            };
            eprintln!(
                "order {} ({how}; key {}, {} attempt(s))",
                created.order["id"], created.key, created.attempts
            );
            println!("{}", created.order);
            ExitCode::SUCCESS
        }
        Err(failure) => {
            eprintln!("retrying_client: {failure}");
            ExitCode::FAILURE
        }
    }
}
