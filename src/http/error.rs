//! One error type for the whole HTTP surface, rendered as RFC 9457 problem
//! details with a stable machine code in `error`. 5xx bodies never carry the
//! cause: it goes to the log only.
//!
//! Every problem answered also names its occurrence in `instance`:
//! `urn:request:<id>`, the id of the request that produced it, as in that
//! request's `X-Request-Id` answer header. [`crate::telemetry::observe`],
//! which gives each request its id, adds it with [`name_occurrence`] to every
//! problem on its way out that does not name one yet — the ones rendered
//! here and the ones the framework refused. A problem the idempotency ledger
//! records names its request already, and its replay is the recorded answer
//! byte for byte: it keeps the `instance` of the request that produced it
//! (the retry is named by its own `X-Request-Id` header).

use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::ServiceResponse;
use actix_web::http::StatusCode;
use actix_web::http::header::{self, HeaderName, HeaderValue};
use actix_web::middleware::{ErrorHandlerResponse, ErrorHandlers};
use actix_web::{HttpResponse, ResponseError};
use serde::Serialize;

use crate::orders::OrdersError;
use crate::orders::input::FieldError;
use idempotency_ledger::{KeyError, LedgerError, RecordedResponse};

pub const PROBLEM_JSON: &str = "application/problem+json";

/// Seconds a client should wait before retrying a `409 IDEMPOTENCY_IN_PROGRESS`.
pub const IN_PROGRESS_RETRY_AFTER: u32 = 1;
/// Seconds a client should wait before retrying a `503`.
pub const UNAVAILABLE_RETRY_AFTER: u32 = 2;
/// Sent (`true`) on every `503` and on `409 IDEMPOTENCY_IN_PROGRESS`: the
/// hint the retry engines of generated API SDKs read (several retry `5xx`
/// and `429` by their status, but not a bare `409`).
pub const SHOULD_RETRY_HEADER: &str = "x-should-retry";

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("a valid bearer token is required")]
    Unauthorized,
    #[error("{0}")]
    BadIdempotencyKey(#[from] KeyError),
    #[error("request bodies must be application/json")]
    UnsupportedMediaType,
    /// A body sent with a content coding (`Content-Encoding`) other than
    /// `identity`: the service decodes none.
    #[error(
        "request bodies must not be content-coded: Content-Encoding {0:?} is not decoded here (identity only)"
    )]
    UnsupportedContentCoding(String),
    #[error("the request body is larger than {0} bytes")]
    PayloadTooLarge(usize),
    #[error("{0}")]
    MalformedJson(String),
    /// The body had not fully arrived within this long after the head.
    #[error("the request body did not arrive within {} s", .0.as_secs())]
    BodyTimeout(std::time::Duration),
    #[error("the request body failed validation")]
    Validation(Vec<FieldError>),
    #[error("{0}")]
    BadQuery(String),
    #[error("no such resource")]
    NotFound,
    #[error("this resource does not allow that method")]
    MethodNotAllowed(String),
    #[error("only a pending order can be changed")]
    OrderNotPending,
    #[error("this Idempotency-Key was already used for a different request")]
    KeyReused,
    #[error("a request with this Idempotency-Key is still being processed")]
    InProgress,
    /// An error answered by the framework or a middleware before any of
    /// our handlers ran (e.g. a CORS preflight from an origin not allowed).
    #[error("{1}")]
    Refused(StatusCode, &'static str),
    /// The cause is logged, never sent.
    #[error("the service is temporarily unavailable")]
    Unavailable(String),
    /// Refused at the door: this process already admits as many writes as
    /// it may (`WRITE_ADMISSION`). Counted, not logged: under overload it is
    /// the common answer.
    #[error("the service is handling as many writes as it admits at once; retry shortly")]
    Overloaded,
    /// Refused at the door: this process looked up as many tokens it never
    /// saw live as it may at once (a quarter of the pool) for as long as the
    /// request could wait its turn. Counted, not logged: under a flood of
    /// unknown tokens it is the common answer.
    #[error("the service is checking as many unfamiliar tokens as it may at once; retry shortly")]
    TooManyTokenLookups,
    /// The cause is logged, never sent.
    #[error("an internal error occurred")]
    Internal(String),
}

/// The problem document.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Problem {
    /// A URI reference naming the problem type.
    #[serde(rename = "type")]
    #[schema(example = "/problems/validation-failed")]
    pub kind: String,
    #[schema(example = "Validation failed")]
    pub title: &'static str,
    #[schema(example = 422)]
    pub status: u16,
    pub detail: String,
    /// This occurrence: `urn:request:` and the id of the request that
    /// produced the problem, the value of its `X-Request-Id` header. A
    /// replayed problem keeps the recorded one's (the retry is named by its
    /// own `X-Request-Id` header). Quote it to find the request's log lines.
    // Set when the ledger records the problem; otherwise added on the way
    // out by `name_occurrence`, which knows the request's id.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = String, required = true,
             example = "urn:request:0b5f7c1e-3f7a-4c55-9d61-8f0a4bb0c2de")]
    pub instance: Option<String>,
    /// A stable machine-readable code.
    #[schema(example = "VALIDATION_FAILED")]
    pub error: &'static str,
    /// One entry per failing field (validation failures only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub errors: Option<Vec<FieldError>>,
}

impl ApiError {
    /// The stable `error` code.
    pub fn code(&self) -> &'static str {
        match self {
            ApiError::Unauthorized => "UNAUTHORIZED",
            ApiError::BadIdempotencyKey(_) | ApiError::Validation(_) | ApiError::BadQuery(_) => {
                "VALIDATION_FAILED"
            }
            ApiError::UnsupportedMediaType | ApiError::UnsupportedContentCoding(_) => {
                "UNSUPPORTED_MEDIA_TYPE"
            }
            ApiError::PayloadTooLarge(_) => "PAYLOAD_TOO_LARGE",
            ApiError::MalformedJson(_) => "MALFORMED_JSON",
            ApiError::BodyTimeout(_) => "REQUEST_TIMEOUT",
            ApiError::NotFound => "NOT_FOUND",
            ApiError::MethodNotAllowed(_) => "METHOD_NOT_ALLOWED",
            ApiError::OrderNotPending => "ORDER_NOT_PENDING",
            ApiError::KeyReused => "IDEMPOTENCY_KEY_REUSED_WITH_DIFFERENT_PAYLOAD",
            ApiError::InProgress => "IDEMPOTENCY_IN_PROGRESS",
            ApiError::Refused(status, _) => match status.as_u16() {
                404 => "NOT_FOUND",
                405 => "METHOD_NOT_ALLOWED",
                413 => "PAYLOAD_TOO_LARGE",
                415 => "UNSUPPORTED_MEDIA_TYPE",
                503 => "SERVICE_UNAVAILABLE",
                500..=599 => "INTERNAL_ERROR",
                _ => "BAD_REQUEST",
            },
            ApiError::Unavailable(_) | ApiError::Overloaded | ApiError::TooManyTokenLookups => {
                "SERVICE_UNAVAILABLE"
            }
            ApiError::Internal(_) => "INTERNAL_ERROR",
        }
    }

    fn title(&self) -> &'static str {
        match self {
            ApiError::Unauthorized => "Unauthorized",
            ApiError::BadIdempotencyKey(_) => "Invalid Idempotency-Key",
            ApiError::Validation(_) | ApiError::BadQuery(_) => "Validation failed",
            ApiError::UnsupportedMediaType | ApiError::UnsupportedContentCoding(_) => {
                "Unsupported media type"
            }
            ApiError::PayloadTooLarge(_) => "Payload too large",
            ApiError::MalformedJson(_) => "Malformed JSON",
            ApiError::BodyTimeout(_) => "Request timeout",
            ApiError::NotFound => "Not found",
            ApiError::MethodNotAllowed(_) => "Method not allowed",
            ApiError::OrderNotPending => "Order not pending",
            ApiError::KeyReused => "Idempotency-Key reused",
            ApiError::InProgress => "Request in progress",
            ApiError::Refused(..) => "Request refused",
            ApiError::Unavailable(_) | ApiError::Overloaded | ApiError::TooManyTokenLookups => {
                "Service unavailable"
            }
            ApiError::Internal(_) => "Internal server error",
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::BadIdempotencyKey(_) | ApiError::MalformedJson(_) | ApiError::BadQuery(_) => {
                StatusCode::BAD_REQUEST
            }
            ApiError::UnsupportedMediaType | ApiError::UnsupportedContentCoding(_) => {
                StatusCode::UNSUPPORTED_MEDIA_TYPE
            }
            ApiError::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::BodyTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            ApiError::Validation(_) => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::NotFound => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::OrderNotPending | ApiError::KeyReused | ApiError::InProgress => {
                StatusCode::CONFLICT
            }
            ApiError::Refused(status, _) => *status,
            ApiError::Unavailable(_) | ApiError::Overloaded | ApiError::TooManyTokenLookups => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn extra_headers(&self) -> Vec<(HeaderName, String)> {
        match self {
            ApiError::Unauthorized => vec![(header::WWW_AUTHENTICATE, "Bearer".to_owned())],
            ApiError::MethodNotAllowed(allow) => vec![(header::ALLOW, allow.clone())],
            ApiError::InProgress => vec![
                (header::RETRY_AFTER, IN_PROGRESS_RETRY_AFTER.to_string()),
                should_retry(),
            ],
            ApiError::Unavailable(_) | ApiError::Overloaded | ApiError::TooManyTokenLookups => {
                vec![
                    (header::RETRY_AFTER, UNAVAILABLE_RETRY_AFTER.to_string()),
                    should_retry(),
                ]
            }
            ApiError::Refused(status, _) if *status == StatusCode::SERVICE_UNAVAILABLE => {
                vec![should_retry()]
            }
            _ => Vec::new(),
        }
    }

    pub fn problem(&self) -> Problem {
        let code = self.code();
        Problem {
            kind: format!("/problems/{}", code.to_ascii_lowercase().replace('_', "-")),
            title: self.title(),
            status: self.status().as_u16(),
            detail: self.to_string(),
            instance: None,
            error: code,
            errors: match self {
                ApiError::Validation(errors) => Some(errors.clone()),
                _ => None,
            },
        }
    }

    fn log(&self) {
        match self {
            // libpq's causes span lines (a hint, the next host's error):
            // one event stays one line.
            ApiError::Internal(cause) => {
                tracing::error!(cause = %crate::db::one_line(cause), "request failed")
            }
            ApiError::Unavailable(cause) => {
                tracing::warn!(cause = %crate::db::one_line(cause), "database unavailable")
            }
            _ => {}
        }
    }

    /// The response as the ledger records it: status, allow-listed headers
    /// and body, the problem naming `instance` (the request that produced
    /// it) so that its replay is the same bytes. Only errors below 500 are
    /// ever recorded.
    pub fn to_recorded(&self, instance: Option<&str>) -> RecordedResponse {
        let mut problem = self.problem();
        problem.instance = instance.map(str::to_owned);
        RecordedResponse {
            status: self.status().as_u16(),
            headers: vec![(header::CONTENT_TYPE.to_string(), PROBLEM_JSON.to_owned())],
            body: serde_json::to_vec(&problem).unwrap_or_default(),
        }
    }
}

fn should_retry() -> (HeaderName, String) {
    (
        HeaderName::from_static(SHOULD_RETRY_HEADER),
        "true".to_owned(),
    )
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        self.status()
    }

    fn error_response(&self) -> HttpResponse {
        self.log();
        let mut response = HttpResponse::build(self.status());
        response.insert_header((header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON)));
        for (name, value) in self.extra_headers() {
            if let Ok(value) = HeaderValue::from_str(&value) {
                response.insert_header((name, value));
            }
        }
        // The rest of a late body may still be on its way: the connection
        // cannot carry another request.
        if matches!(self, ApiError::BodyTimeout(_)) {
            response.force_close();
        }
        response.body(serde_json::to_vec(&self.problem()).unwrap_or_default())
    }
}

impl From<OrdersError> for ApiError {
    fn from(e: OrdersError) -> Self {
        match e {
            OrdersError::NotFound => ApiError::NotFound,
            OrdersError::NotPending => ApiError::OrderNotPending,
            OrdersError::UnknownCursor => {
                ApiError::BadQuery("cursor was not issued by this server".into())
            }
            OrdersError::Corrupt(e) => ApiError::Internal(e.to_string()),
            OrdersError::Database(e) => ApiError::from_database(e),
        }
    }
}

impl From<crate::db::Unavailable> for ApiError {
    fn from(e: crate::db::Unavailable) -> Self {
        ApiError::Unavailable(e.to_string())
    }
}

impl From<diesel::result::Error> for ApiError {
    fn from(e: diesel::result::Error) -> Self {
        ApiError::from_database(e)
    }
}

impl From<actix_web::error::BlockingError> for ApiError {
    fn from(e: actix_web::error::BlockingError) -> Self {
        ApiError::Internal(format!("blocking task failed: {e}"))
    }
}

impl From<LedgerError<ApiError>> for ApiError {
    fn from(e: LedgerError<ApiError>) -> Self {
        match e {
            LedgerError::Unavailable(cause) => ApiError::Unavailable(cause),
            LedgerError::Overloaded => ApiError::Overloaded,
            LedgerError::LeaseExpired => ApiError::Unavailable("the lease ran out".into()),
            LedgerError::Unreplayable { key, cause } => {
                ApiError::Internal(format!("the entry of key {key:?}: {cause}"))
            }
            LedgerError::Database(e) => ApiError::Internal(e.to_string()),
            LedgerError::Internal(cause) => ApiError::Internal(cause),
            LedgerError::Operation(e) => e,
        }
    }
}

impl ApiError {
    /// Called where the failed query ran, its connection still held: one
    /// that lost its server is dropped, not pooled again.
    fn from_database(e: diesel::result::Error) -> Self {
        crate::db::drop_if_lost(&e);
        match crate::db::classify(&e) {
            crate::db::Failure::Unavailable | crate::db::Failure::LockTimeout => {
                ApiError::Unavailable(e.to_string())
            }
            crate::db::Failure::Internal => ApiError::Internal(e.to_string()),
        }
    }
}

/// The `instance` of a problem answering the request `request_id`.
pub fn instance_of(request_id: &str) -> String {
    format!("urn:request:{request_id}")
}

/// `response` with `instance` naming the request `request_id` when it is a
/// problem document that names no instance yet; any other response as it
/// is (a replayed problem names the request that produced it). The
/// problem's other members keep their bytes: `instance` is appended to the
/// object.
pub async fn name_occurrence<B: MessageBody>(
    response: ServiceResponse<B>,
    request_id: &str,
) -> ServiceResponse<EitherBody<B, Vec<u8>>> {
    if !is_problem(response.headers()) {
        return response.map_into_left_body();
    }
    let (req, response) = response.into_parts();
    let (mut head, body) = response.into_parts();
    let instance = instance_of(request_id);
    let named = match actix_web::body::to_bytes(body).await {
        Ok(bytes) => with_instance(&bytes, &instance).unwrap_or_else(|| bytes.to_vec()),
        // Our problems are bytes in memory: reading one cannot fail.
        Err(_) => {
            let mut problem = ApiError::Internal("unreadable problem body".into()).problem();
            problem.instance = Some(instance);
            serde_json::to_vec(&problem).unwrap_or_default()
        }
    };
    head.headers_mut().remove(header::CONTENT_LENGTH);
    ServiceResponse::new(req, head.set_body(named)).map_into_right_body()
}

fn is_problem(headers: &header::HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(PROBLEM_JSON.as_bytes()))
}

/// `problem` (a JSON object's text) with an `instance` member appended;
/// `None` when it is not an object, or already names an instance.
fn with_instance(problem: &[u8], instance: &str) -> Option<Vec<u8>> {
    let members: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(problem).ok()?;
    if members.contains_key("instance") {
        return None;
    }
    let text = std::str::from_utf8(problem).ok()?.trim_end();
    let open = text.strip_suffix('}')?;
    let separator = if members.is_empty() { "" } else { "," };
    let value = serde_json::to_string(instance).ok()?;
    Some(format!("{open}{separator}\"instance\":{value}}}").into_bytes())
}

/// Middleware that turns any error response not produced by [`ApiError`]
/// (actix-cors refusing a preflight, the framework refusing a request) into
/// problem+json, so that every error a client sees has the same shape.
pub fn problem_for_every_error<B: 'static>() -> ErrorHandlers<B> {
    ErrorHandlers::new().default_handler(|res: ServiceResponse<B>| {
        if is_problem(res.headers()) {
            return Ok(ErrorHandlerResponse::Response(res.map_into_left_body()));
        }
        let status = res.status();
        let preflight = res.request().method() == actix_web::http::Method::OPTIONS
            && res
                .request()
                .headers()
                .contains_key(header::ACCESS_CONTROL_REQUEST_METHOD);
        let detail = if preflight {
            "this origin, method or header is not allowed cross-origin access"
        } else {
            status
                .canonical_reason()
                .unwrap_or("the request was refused")
        };
        let (req, original) = res.into_parts();
        let mut replacement = ApiError::Refused(status, detail).error_response();
        for (name, value) in original.headers() {
            if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH {
                replacement
                    .headers_mut()
                    .insert(name.clone(), value.clone());
            }
        }
        Ok(ErrorHandlerResponse::Response(
            ServiceResponse::new(req, replacement).map_into_right_body(),
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(problem: &[u8]) -> Option<serde_json::Value> {
        let bytes = with_instance(problem, "urn:request:r-1")?;
        Some(serde_json::from_slice(&bytes).expect("still JSON"))
    }

    #[test]
    fn instance_is_appended_and_every_other_member_keeps_its_bytes() {
        let problem = serde_json::to_vec(&ApiError::NotFound.problem()).unwrap();
        let bytes = with_instance(&problem, "urn:request:r-1").unwrap();
        let text = String::from_utf8(bytes).unwrap();
        let original = String::from_utf8(problem).unwrap();
        assert_eq!(
            text,
            format!(
                "{},\"instance\":\"urn:request:r-1\"}}",
                original.strip_suffix('}').unwrap()
            )
        );
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(value["instance"], "urn:request:r-1");
        assert_eq!(value["error"], "NOT_FOUND");
    }

    #[test]
    fn a_validation_problem_keeps_its_errors_and_gains_an_instance() {
        let problem = ApiError::Validation(vec![FieldError {
            field: "quantity".into(),
            message: "must be at least 1".into(),
        }])
        .problem();
        let value = named(&serde_json::to_vec(&problem).unwrap()).unwrap();
        assert_eq!(value["errors"][0]["field"], "quantity");
        assert_eq!(value["instance"], "urn:request:r-1");
    }

    #[test]
    fn a_body_that_is_not_an_object_or_already_names_an_instance_is_left_alone() {
        assert_eq!(named(b"[1,2]"), None);
        assert_eq!(named(b"not json"), None);
        assert_eq!(named(br#"{"instance":"urn:request:first"}"#), None);
        assert_eq!(
            named(b"{} \n").unwrap(),
            serde_json::json!({"instance": "urn:request:r-1"})
        );
    }

    #[test]
    fn the_instance_is_the_request_id_as_a_urn() {
        assert_eq!(instance_of("abc-1.2:3_4"), "urn:request:abc-1.2:3_4");
    }
}
