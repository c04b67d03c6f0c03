//! Logs, request spans and Prometheus metrics.

use std::sync::OnceLock;
use std::time::Instant;

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header::{HeaderName, HeaderValue};
use actix_web::middleware::Next;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tracing::Instrument;
use tracing_subscriber::EnvFilter;

pub const REQUEST_ID_HEADER: &str = "x-request-id";
const MAX_REQUEST_ID_LEN: usize = 128;

/// Installs the log subscriber: `RUST_LOG` filters (default `info`),
/// `LOG_FORMAT=json` switches to one JSON object per line. Logs go to stderr.
pub fn init_logging() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let json = std::env::var("LOG_FORMAT").is_ok_and(|v| v.eq_ignore_ascii_case("json"));
    let _ = if json {
        builder.json().flatten_event(true).try_init()
    } else {
        builder.try_init()
    };
}

/// The process-wide Prometheus recorder, installed on first use.
pub fn metrics_handle() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let builder = PrometheusBuilder::new()
                .set_buckets_for_metric(
                    Matcher::Full("http_request_duration_seconds".into()),
                    &[
                        0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                        5.0,
                    ],
                )
                .unwrap_or_else(|_| PrometheusBuilder::new());
            let recorder = builder.build_recorder();
            let handle = recorder.handle();
            // Fails only if another recorder is installed; then ours just stays unused.
            let _ = metrics::set_global_recorder(recorder);
            handle
        })
        .clone()
}

/// Counts one answer of the idempotency ledger.
pub fn count_idempotency_outcome(outcome: &'static str) {
    metrics::counter!("idempotency_outcomes_total", "outcome" => outcome).increment(1);
}

/// Counts ledger entries removed by the purge.
pub fn count_purged(n: usize) {
    metrics::counter!("idempotency_outcomes_total", "outcome" => "purged").increment(n as u64);
}

pub fn set_ledger_rows(rows: i64) {
    metrics::gauge!("idempotency_ledger_rows").set(rows as f64);
}

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

/// The outermost middleware: one span per request with its id, user and
/// idempotency outcome; one log line when it ends; request metrics; the
/// request id echoed in `X-Request-Id`. Never logs a token or a body.
pub async fn observe(
    req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let started = Instant::now();
    let request_id = client_request_id(&req).unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
    let route = req
        .match_pattern()
        .unwrap_or_else(|| "unmatched".to_owned());
    let method = req.method().to_string();
    let span = tracing::info_span!(
        "request",
        request_id = %request_id,
        method = %method,
        route = %route,
        user_id = tracing::field::Empty,
        idempotency = tracing::field::Empty,
    );
    let result = next.call(req).instrument(span.clone()).await;
    let status = match &result {
        Ok(res) => res.status(),
        Err(e) => e.as_response_error().status_code(),
    };
    let elapsed = started.elapsed();
    metrics::counter!("http_requests_total", "method" => method.clone(), "route" => route.clone(), "status" => status.as_u16().to_string())
        .increment(1);
    metrics::histogram!("http_request_duration_seconds", "method" => method, "route" => route, "status" => status.as_u16().to_string())
        .record(elapsed.as_secs_f64());
    span.in_scope(|| {
        tracing::info!(
            status = status.as_u16(),
            latency_ms = elapsed.as_secs_f64() * 1000.0,
            "request"
        )
    });
    let mut res = result?;
    if let Ok(value) = HeaderValue::from_str(&request_id) {
        res.headers_mut()
            .insert(HeaderName::from_static(REQUEST_ID_HEADER), value);
    }
    Ok(res)
}
