//! The problems this layer writes (RFC 9457, `application/problem+json`):
//! the extractor's refusals ([`Rejected`]) and the document every refusal
//! and error is written as.

use std::time::Duration;

use actix_web::http::StatusCode;
use actix_web::http::header::{self, HeaderValue};
use actix_web::{HttpResponse, ResponseError};
use serde::Serialize;

use super::PROBLEM_JSON;
use crate::KeyError;

/// Why [`Idempotent`](super::Idempotent) refused a request, answered as a
/// problem.
#[derive(Debug, thiserror::Error)]
pub enum Rejected {
    /// `400 VALIDATION_FAILED`: the key is missing or breaks a rule.
    #[error("{0}")]
    Key(#[from] KeyError),
    /// `415 UNSUPPORTED_MEDIA_TYPE`.
    #[error("request bodies must be application/json")]
    UnsupportedMediaType,
    /// `415 UNSUPPORTED_MEDIA_TYPE`: a body sent with a content coding
    /// (`Content-Encoding`) other than `identity`, which is not decoded.
    #[error(
        "request bodies must not be content-coded: Content-Encoding {0:?} is not decoded here (identity only)"
    )]
    UnsupportedContentCoding(String),
    /// `413 PAYLOAD_TOO_LARGE`: more bytes than the limit.
    #[error("the request body is larger than {0} bytes")]
    PayloadTooLarge(usize),
    /// `400 MALFORMED_JSON`: not one JSON value, or a member named twice.
    #[error("{0}")]
    MalformedJson(String),
    /// `408 REQUEST_TIMEOUT`: the body had not arrived within this long.
    #[error("the request body did not arrive within {} s", .0.as_secs())]
    BodyTimeout(Duration),
}

impl Rejected {
    fn code(&self) -> &'static str {
        match self {
            Rejected::Key(_) => "VALIDATION_FAILED",
            Rejected::UnsupportedMediaType | Rejected::UnsupportedContentCoding(_) => {
                "UNSUPPORTED_MEDIA_TYPE"
            }
            Rejected::PayloadTooLarge(_) => "PAYLOAD_TOO_LARGE",
            Rejected::MalformedJson(_) => "MALFORMED_JSON",
            Rejected::BodyTimeout(_) => "REQUEST_TIMEOUT",
        }
    }

    fn title(&self) -> &'static str {
        match self {
            Rejected::Key(_) => "Invalid Idempotency-Key",
            Rejected::UnsupportedMediaType | Rejected::UnsupportedContentCoding(_) => {
                "Unsupported media type"
            }
            Rejected::PayloadTooLarge(_) => "Payload too large",
            Rejected::MalformedJson(_) => "Malformed JSON",
            Rejected::BodyTimeout(_) => "Request timeout",
        }
    }
}

impl ResponseError for Rejected {
    fn status_code(&self) -> StatusCode {
        match self {
            Rejected::Key(_) | Rejected::MalformedJson(_) => StatusCode::BAD_REQUEST,
            Rejected::UnsupportedMediaType | Rejected::UnsupportedContentCoding(_) => {
                StatusCode::UNSUPPORTED_MEDIA_TYPE
            }
            Rejected::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Rejected::BodyTimeout(_) => StatusCode::REQUEST_TIMEOUT,
        }
    }

    fn error_response(&self) -> HttpResponse {
        let mut builder = HttpResponse::build(self.status_code());
        // The rest of a late body may still be on its way: the connection
        // cannot carry another request.
        if matches!(self, Rejected::BodyTimeout(_)) {
            builder.force_close();
        }
        render(
            builder,
            self.status_code(),
            self.code(),
            self.title(),
            &self.to_string(),
        )
    }
}

/// The problem document (RFC 9457) this layer answers with.
#[derive(Serialize)]
struct Problem<'a> {
    #[serde(rename = "type")]
    kind: String,
    title: &'a str,
    status: u16,
    detail: &'a str,
    error: &'a str,
}

/// A problem response: `type` is `/problems/` and the code in kebab case.
pub(super) fn problem(status: StatusCode, code: &str, title: &str, detail: &str) -> HttpResponse {
    render(HttpResponse::build(status), status, code, title, detail)
}

fn render(
    mut builder: actix_web::HttpResponseBuilder,
    status: StatusCode,
    code: &str,
    title: &str,
    detail: &str,
) -> HttpResponse {
    let body = Problem {
        kind: format!("/problems/{}", code.to_ascii_lowercase().replace('_', "-")),
        title,
        status: status.as_u16(),
        detail,
        error: code,
    };
    builder
        .insert_header((header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON)))
        .body(serde_json::to_vec(&body).unwrap_or_default())
}
