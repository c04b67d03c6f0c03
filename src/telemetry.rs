//! Logs, request spans and Prometheus metrics.

use std::io::IsTerminal;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use actix_web::HttpMessage;
use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header::{HeaderName, HeaderValue};
use actix_web::middleware::Next;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tracing::Instrument;
use tracing_subscriber::EnvFilter;

use crate::db::Pool;

pub const REQUEST_ID_HEADER: &str = "x-request-id";
const MAX_REQUEST_ID_LEN: usize = 128;

/// How log lines are written: `LOG_FORMAT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines (the default).
    Text,
    /// One JSON object per line.
    Json,
}

impl LogFormat {
    /// What `LOG_FORMAT` names: `text` or `json`, in any case; unset or
    /// empty is `text`. Anything else is refused with one line, before the
    /// command does anything.
    pub fn from_env() -> Result<Self, String> {
        Self::parse(std::env::var_os("LOG_FORMAT").as_deref())
    }

    pub fn parse(value: Option<&std::ffi::OsStr>) -> Result<Self, String> {
        let Some(value) = value else {
            return Ok(Self::Text);
        };
        let Some(text) = value.to_str() else {
            return Err("LOG_FORMAT is not valid UTF-8: it must be text or json".into());
        };
        if text.is_empty() || text.eq_ignore_ascii_case("text") {
            Ok(Self::Text)
        } else if text.eq_ignore_ascii_case("json") {
            Ok(Self::Json)
        } else {
            Err(format!("LOG_FORMAT is {text:?}: it must be text or json"))
        }
    }
}

/// Installs the log subscriber: `RUST_LOG` filters (default `info`),
/// `format` is `LOG_FORMAT`'s ([`LogFormat::from_env`]). Logs go to stderr.
pub fn init_logging(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
        LogFormat::Text => builder.try_init(),
    };
}

/// The process-wide Prometheus recorder, installed on first use.
pub fn metrics_handle() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let builder = PrometheusBuilder::new()
                .set_buckets_for_metric(
                    Matcher::Full(REQUEST_DURATION.into()),
                    &[
                        0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                        5.0,
                    ],
                )
                .unwrap_or_else(|_| PrometheusBuilder::new());
            let recorder = builder.build_recorder();
            let handle = recorder.handle();
            // Fails only if another recorder is installed; then ours just stays unused.
            if metrics::set_global_recorder(recorder).is_ok() {
                register_metrics();
            }
            handle
        })
        .clone()
}

/// Requests answered, by method, route pattern and status.
pub const REQUESTS: &str = "http_requests_total";
/// Request latency in seconds, by method, route pattern and status.
pub const REQUEST_DURATION: &str = "http_request_duration_seconds";
/// Idempotency outcomes, by `outcome` (one of [`IDEMPOTENCY_OUTCOMES`]).
pub const IDEMPOTENCY: &str = "idempotency_outcomes_total";
/// Rows in the idempotency ledger at the last count (see [`count_ledger_rows`]).
pub const LEDGER_ROWS: &str = "idempotency_ledger_rows";
/// The longest time between two counts of the ledger's rows.
pub const LEDGER_COUNT_INTERVAL: Duration = Duration::from_secs(60);
/// Every `method` label of the request metrics: the methods of RFC 9110 and
/// `PATCH`; any other token a client invents is counted as `other`, so no
/// request can add a series.
pub const METHOD_LABELS: [&str; 10] = [
    "GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "CONNECT", "TRACE", "other",
];

/// Every `outcome` label of [`IDEMPOTENCY`]:
/// - `executed`: the mutation ran and its answer was recorded;
/// - `replayed`: an earlier answer was sent again (also from the order row
///   after a purge);
/// - `key_reused`: the key was used for a different request (`409`);
/// - `in_progress`: a request with the key was still running (`409`);
/// - `lease_expired`: a holder outlived its lease and was fenced (`503`,
///   nothing committed);
/// - `purged`: expired ledger entries deleted.
pub const IDEMPOTENCY_OUTCOMES: [&str; 6] = [
    "executed",
    "replayed",
    "key_reused",
    "in_progress",
    "lease_expired",
    "purged",
];

/// Logs (on the request span) and counts one answer of the idempotency ledger.
pub fn idempotency_outcome(outcome: &'static str) {
    tracing::Span::current().record("idempotency", outcome);
    metrics::counter!(IDEMPOTENCY, "outcome" => outcome).increment(1);
}

/// Counts ledger entries removed by the purge.
pub fn count_purged(n: usize) {
    metrics::counter!(IDEMPOTENCY, "outcome" => "purged").increment(n as u64);
}

/// Keeps the [`LEDGER_ROWS`] gauge current by counting the ledger once
/// every `every`, at once first: a scrape only reads the last count, so
/// however often `/metrics` is scraped the table is counted no more often.
pub async fn count_ledger_rows(pool: Pool, every: Duration) {
    let mut ticker = actix_web::rt::time::interval(every);
    loop {
        ticker.tick().await;
        let pool = pool.clone();
        let rows = actix_web::web::block(move || -> Option<i64> {
            let mut pooled = pool.get().ok()?;
            idempotency_ledger::db::count(&mut pooled.conn()).ok()
        })
        .await;
        match rows {
            Ok(Some(rows)) => metrics::gauge!(LEDGER_ROWS).set(rows as f64),
            _ => tracing::debug!("cannot count the ledger's rows now; will retry"),
        }
    }
}

/// The `method` label of a request: one of [`METHOD_LABELS`].
fn method_label(method: &actix_web::http::Method) -> &'static str {
    METHOD_LABELS
        .into_iter()
        .find(|known| *known == method.as_str())
        .unwrap_or("other")
}

/// Describes every metric and registers each idempotency outcome at zero, so
/// a scrape shows them before they first happen.
fn register_metrics() {
    metrics::describe_counter!(
        REQUESTS,
        "HTTP requests answered, by method, route and status."
    );
    metrics::describe_histogram!(
        REQUEST_DURATION,
        metrics::Unit::Seconds,
        "HTTP request latency, by method, route and status."
    );
    metrics::describe_counter!(
        IDEMPOTENCY,
        "Answers of the idempotency ledger, and entries purged, by outcome."
    );
    metrics::describe_gauge!(
        LEDGER_ROWS,
        "Rows in the idempotency ledger, as last counted (at most a minute ago)."
    );
    for outcome in IDEMPOTENCY_OUTCOMES {
        metrics::counter!(IDEMPOTENCY, "outcome" => outcome).increment(0);
    }
}

/// The id of the request being answered, in its extensions: a problem the
/// idempotency ledger records names it as its `instance` from the start.
#[derive(Debug, Clone)]
pub struct RequestId(pub String);

/// A request id from the client, if it is a sane one.
fn client_request_id(req: &ServiceRequest) -> Option<String> {
    let value = req.headers().get(REQUEST_ID_HEADER)?.to_str().ok()?;
    let ok = !value.is_empty()
        && value.len() <= MAX_REQUEST_ID_LEN
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b));
    ok.then(|| value.to_owned())
}

/// A duration in milliseconds, to the microsecond: `0.791`, never
/// `0.7907670000000001`.
fn rounded_millis(elapsed: std::time::Duration) -> f64 {
    elapsed.as_micros() as f64 / 1000.0
}

/// The outermost middleware: one span per request with its id, user and
/// idempotency outcome; one log line when it ends; request metrics; the
/// request id echoed in `X-Request-Id`, and named as the `instance` of
/// every problem answered ([`crate::http::error::name_occurrence`]). Never
/// logs a token or a body.
///
/// Every metric label comes from a fixed set, whatever a client sends: the
/// method from [`METHOD_LABELS`], the route from the registered patterns (or
/// `unmatched`), the status from the codes a response can have.
pub async fn observe(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let started = Instant::now();
    let request_id = client_request_id(&req).unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
    req.extensions_mut().insert(RequestId(request_id.clone()));
    let method_label = method_label(req.method());
    // The route is recorded once routing has found it: after the call, the
    // answered request knows its resource, and naming its pattern is a walk
    // down the resource map by index (before routing, it would take
    // matching the path against every pattern, regular expressions
    // included). An error no route turned into an answer has no route.
    let span = tracing::info_span!(
        "request",
        request_id = %request_id,
        method = req.method().as_str(),
        route = tracing::field::Empty,
        user_id = tracing::field::Empty,
        idempotency = tracing::field::Empty,
    );
    let result = next.call(req).instrument(span.clone()).await;
    let (status, route) = match &result {
        Ok(res) => (res.status(), res.request().match_pattern()),
        Err(e) => (e.as_response_error().status_code(), None),
    };
    let route = route.unwrap_or_else(|| "unmatched".to_owned());
    span.record("route", route.as_str());
    let elapsed = started.elapsed();
    let status_label = status.as_u16().to_string();
    metrics::counter!(REQUESTS, "method" => method_label, "route" => route.clone(), "status" => status_label.clone())
        .increment(1);
    metrics::histogram!(REQUEST_DURATION, "method" => method_label, "route" => route, "status" => status_label)
        .record(elapsed.as_secs_f64());
    span.in_scope(|| {
        tracing::info!(
            status = status.as_u16(),
            latency_ms = rounded_millis(elapsed),
            "request"
        )
    });
    let mut res = crate::http::error::name_occurrence(result?, &request_id).await;
    if let Ok(value) = HeaderValue::from_str(&request_id) {
        res.headers_mut()
            .insert(HeaderName::from_static(REQUEST_ID_HEADER), value);
    }
    Ok(res)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn latencies_are_logged_to_the_microsecond() {
        assert_eq!(
            rounded_millis(Duration::from_nanos(790_767)).to_string(),
            "0.79"
        );
        assert_eq!(
            rounded_millis(Duration::from_nanos(12_345_678)).to_string(),
            "12.345"
        );
        assert_eq!(rounded_millis(Duration::ZERO).to_string(), "0");
    }
}
