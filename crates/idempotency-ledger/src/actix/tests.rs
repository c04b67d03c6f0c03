//! The layer's own unit tests: the media type and coding checks, and the
//! rule's answers.

use actix_web::body::MessageBody;
use actix_web::http::StatusCode;
use actix_web::http::header;
use actix_web::{HttpResponse, ResponseError};

use super::answer::{Ran, recorded};
use super::extract::{content_coding, is_json};
use super::{PROBLEM_JSON, Rejected, SHOULD_RETRY_HEADER};
use crate::{Completion, IdempotencyKey, LedgerError, Outcome, RecordedResponse, Unreplayable};

fn json(content_type: &str) -> bool {
    let req = actix_web::test::TestRequest::default()
        .insert_header((header::CONTENT_TYPE, content_type))
        .to_http_request();
    is_json(&req)
}

#[test]
fn a_media_type_is_read_as_rfc_9110_reads_it() {
    for yes in [
        "application/json",
        "Application/JSON",
        "application/json;charset=utf-8",
        "application/json; charset=utf-8",
        "application/json ; charset=utf-8",
        "Application/JSON ;\tcharset=UTF-8",
        "application/json;charset=\"utf-8\"",
        " application/json ",
    ] {
        assert!(json(yes), "{yes:?} is JSON");
    }
    for no in [
        "text/json",
        "application/problem+json",
        "application/jsonx",
        "application/json; charset",
        "application/json;;",
        "application",
        "",
    ] {
        assert!(!json(no), "{no:?} is not JSON");
    }
}

fn coding(values: &[&str]) -> Option<String> {
    let mut req = actix_web::test::TestRequest::default();
    for value in values {
        req = req.append_header((header::CONTENT_ENCODING, *value));
    }
    content_coding(&req.to_http_request())
}

#[test]
fn only_the_identity_coding_is_taken() {
    assert_eq!(coding(&[]), None);
    assert_eq!(coding(&["identity"]), None);
    assert_eq!(coding(&["Identity, identity"]), None);
    assert_eq!(coding(&["gzip"]).as_deref(), Some("gzip"));
    assert_eq!(coding(&["identity", "br"]).as_deref(), Some("identity, br"));
    assert_eq!(
        coding(&["GZIP, identity"]).as_deref(),
        Some("GZIP, identity")
    );
}

fn answered(outcome: Result<Outcome, LedgerError<Rejected>>) -> HttpResponse {
    let ran = Ran {
        outcome,
        key: IdempotencyKey::parse(b"k").ok(),
    };
    ran.respond().unwrap_or_else(|e| e.error_response())
}

fn header<'r>(response: &'r HttpResponse, name: &str) -> Option<&'r str> {
    response.headers().get(name).and_then(|v| v.to_str().ok())
}

fn code(response: HttpResponse) -> String {
    let body = response.into_body().try_into_bytes().unwrap_or_default();
    let problem: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    problem["error"].as_str().unwrap_or_default().to_owned()
}

/// What the rule answers: the status, `Retry-After`, the problem's code.
type Expected = (u16, Option<&'static str>, &'static str);
const REUSED: Expected = (409, None, "IDEMPOTENCY_KEY_REUSED_WITH_DIFFERENT_PAYLOAD");
const IN_PROGRESS: Expected = (409, Some("1"), "IDEMPOTENCY_IN_PROGRESS");
const UNAVAILABLE: Expected = (503, Some("2"), "SERVICE_UNAVAILABLE");
const INTERNAL: Expected = (500, None, "INTERNAL_ERROR");
const UNSUPPORTED: Expected = (415, None, "UNSUPPORTED_MEDIA_TYPE");

#[test]
fn every_refusal_and_error_is_answered_by_the_one_rule() {
    let unreplayable = LedgerError::Unreplayable {
        key: "k".into(),
        cause: Unreplayable("status 0".into()),
    };
    for (outcome, (status, retry_after, code_expected)) in [
        (Ok(Outcome::KeyReused), REUSED),
        (Ok(Outcome::InProgress), IN_PROGRESS),
        (Err(LedgerError::Overloaded), UNAVAILABLE),
        (Err(LedgerError::Unavailable("gone".into())), UNAVAILABLE),
        (Err(LedgerError::LeaseExpired), UNAVAILABLE),
        (
            Err(LedgerError::Database(diesel::result::Error::NotFound)),
            INTERNAL,
        ),
        (Err(LedgerError::Internal("lost".into())), INTERNAL),
        (Err(unreplayable), INTERNAL),
        (
            Err(LedgerError::Operation(Rejected::UnsupportedMediaType)),
            UNSUPPORTED,
        ),
    ] {
        let response = answered(outcome);
        assert_eq!(response.status().as_u16(), status, "{code_expected}");
        assert_eq!(
            header(&response, "retry-after"),
            retry_after,
            "{code_expected}"
        );
        let should_retry = retry_after.map(|_| "true");
        assert_eq!(
            header(&response, SHOULD_RETRY_HEADER),
            should_retry,
            "{code_expected}"
        );
        assert_eq!(header(&response, "content-type"), Some(PROBLEM_JSON));
        assert_eq!(code(response), code_expected);
    }
}

#[test]
fn a_recorded_201_replays_as_200_with_its_headers_and_body() {
    let recorded = RecordedResponse {
        status: 201,
        headers: vec![
            ("Location".into(), "/x/1".into()),
            ("Content-Type".into(), "application/json".into()),
        ],
        body: b"{}".to_vec(),
    };
    let first = answered(Ok(Outcome::Executed(recorded.clone())));
    assert_eq!(first.status(), StatusCode::CREATED);
    assert_eq!(header(&first, "idempotent-replayed"), None);
    let replay = answered(Ok(Outcome::Replayed(recorded)));
    assert_eq!(replay.status(), StatusCode::OK);
    assert_eq!(header(&replay, "idempotent-replayed"), Some("true"));
    assert_eq!(header(&replay, "location"), Some("/x/1"));
    assert_eq!(header(&replay, "content-type"), Some("application/json"));
    assert_eq!(
        replay.into_body().try_into_bytes().ok().as_deref(),
        Some(&b"{}"[..])
    );
}

#[test]
fn a_mutations_answer_below_500_is_recorded_and_a_5xx_is_not() {
    let small = recorded::<Rejected>(Err(Rejected::PayloadTooLarge(1)));
    match small {
        Ok(Completion::Record(r)) => {
            assert_eq!(r.status, 413);
            assert_eq!(
                r.headers,
                [("content-type".to_owned(), PROBLEM_JSON.to_owned())]
            );
        }
        other => panic!("{other:?}"),
    }
    let failed = recorded::<LedgerError<Rejected>>(Err(LedgerError::Internal("x".into())));
    assert!(failed.is_err());
}
