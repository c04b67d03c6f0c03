//! The OpenAPI 3 document, generated from the code's own types: each
//! handler carries its `#[utoipa::path]`, each body type its schema. What
//! every operation shares because of the middleware (`X-Request-Id`, the
//! bearer token and its `401` under `/v1`, the `5xx` problems), and what every
//! mutation shares because it runs through [`super::mutation::Mutation`] (the
//! `Idempotency-Key` header, the `400`/`413`/`415` of its checks, the ledger's
//! `409` and `Idempotent-Replayed` on the answers a replay can give), is added
//! here once, by `Shared`.
//!
//! `GET /openapi.json` serves it; the integration suite checks that every
//! route in [`super::ENDPOINTS`] is in it, and CI runs schemathesis against it.

use std::sync::OnceLock;

use actix_web::HttpResponse;
use utoipa::openapi::header::Header;
use utoipa::openapi::path::{Operation, ParameterBuilder, ParameterIn, PathItem};
use utoipa::openapi::response::Response;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme};
use utoipa::openapi::{
    Content, ObjectBuilder, OpenApi as Document, Ref, RefOr, Required, Schema, Type,
};
use utoipa::{Modify, OpenApi, PartialSchema};

use super::error::{ApiError, PROBLEM_JSON, Problem};
use super::mutation::REPLAYED_HEADER;
use super::{AUTHENTICATED_PREFIX, health, orders};
use crate::orders::input::FieldError;
use crate::orders::model::{OrderStatus, OrderView};
use idempotency_ledger as idempotency;

/// The name of the bearer-token security scheme.
pub const BEARER: &str = "bearer";
/// The header [`crate::telemetry::observe`] reads and sets, as the document spells it.
const REQUEST_ID: &str = "X-Request-Id";
/// The methods whose handlers run through [`super::mutation::Mutation`].
const MUTATING: [&str; 4] = ["put", "post", "patch", "delete"];
/// The answers of a mutation that no replay gives: the checks before the
/// ledger (`400`, `401`, `408`, `413`, `415`, the route's `422`), and a `201`,
/// which replays as `200`. Nor does any `5xx`, which is never recorded.
const NEVER_REPLAYED: [&str; 7] = ["201", "400", "401", "408", "413", "415", "422"];
/// The ledger's conflicts, which any mutation can answer with `409`.
const LEDGER_CONFLICTS: &str = "`IDEMPOTENCY_KEY_REUSED_WITH_DIFFERENT_PAYLOAD`: this key was \
    used for a different request. `IDEMPOTENCY_IN_PROGRESS`: a request with this key was still \
    running after the server waited for it (`IDEMPOTENCY_WAIT_SECS`); retry after `Retry-After` \
    seconds (`X-Should-Retry: true`).";
/// The hint generated API SDKs read to retry an answer they would not retry by its status.
const SHOULD_RETRY: &str = "X-Should-Retry";

#[derive(OpenApi)]
#[openapi(
    info(
        title = "orders-api",
        description = "An orders REST API in which every state-changing request is safe to \
retry: send an `Idempotency-Key` header, and a retry with the same key and body replays the \
first answer (`Idempotent-Replayed: true`) instead of running again."
    ),
    paths(
        orders::create,
        orders::list,
        orders::get,
        orders::update,
        orders::cancel,
        health::healthz,
        health::readyz,
        health::metrics,
        serve,
    ),
    components(schemas(
        orders::CreateOrder,
        orders::UpdateOrder,
        OrderView,
        OrderStatus,
        orders::OrderPage,
        Problem,
        FieldError,
        health::Health
    )),
    modifiers(&Shared),
    tags(
        (name = "orders", description = "The caller's orders; every mutation takes an `Idempotency-Key`."),
        (name = "operations", description = "Health, metrics and this document; no authentication.")
    )
)]
pub struct ApiDoc;

/// The document as JSON, built once.
pub fn document_json() -> Option<&'static str> {
    static JSON: OnceLock<Option<String>> = OnceLock::new();
    JSON.get_or_init(|| ApiDoc::openapi().to_json().ok())
        .as_deref()
}

/// Returns the OpenAPI 3 document of this API.
#[utoipa::path(
    get,
    path = "/openapi.json",
    operation_id = "getOpenApi",
    tag = "operations",
    responses((status = 200, description = "This document.", body = Object, content_type = "application/json"))
)]
pub async fn serve() -> Result<HttpResponse, ApiError> {
    let json = document_json()
        .ok_or_else(|| ApiError::Internal("the OpenAPI document did not serialize".into()))?;
    Ok(HttpResponse::Ok()
        .content_type(mime::APPLICATION_JSON)
        .body(json))
}

/// What the middleware adds to every operation.
struct Shared;

impl Modify for Shared {
    fn modify(&self, doc: &mut Document) {
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            BEARER,
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "An API key, created with `orders-api keys create USER_ID`.",
                    ))
                    .build(),
            ),
        );
        for (path, item) in doc.paths.paths.iter_mut() {
            let authenticated = path
                .strip_prefix(AUTHENTICATED_PREFIX)
                .is_some_and(|rest| rest.starts_with('/'));
            for (method, operation) in operations(item) {
                let mutation = authenticated && MUTATING.contains(&method);
                if mutation {
                    add_idempotency_key(operation);
                }
                add_request_id(operation);
                if authenticated {
                    operation
                        .security
                        .get_or_insert_with(Vec::new)
                        .push(SecurityRequirement::new(BEARER, Vec::<String>::new()));
                    add_problem(
                        operation,
                        "401",
                        "`UNAUTHORIZED`: the bearer token is missing, malformed, unknown or \
                         revoked. Checked before anything else.",
                        [("WWW-Authenticate", string_header("`Bearer`."))],
                    );
                    add_problem(
                        operation,
                        "503",
                        "`SERVICE_UNAVAILABLE`: the database is unreachable or busy, or this \
                         process already admits as many writes as it may (`WRITE_ADMISSION`). \
                         Nothing was recorded: retry with the same `Idempotency-Key`.",
                        [
                            (
                                "Retry-After",
                                header(
                                    ObjectBuilder::new().schema_type(Type::Integer),
                                    "Seconds to wait before retrying.",
                                ),
                            ),
                            (SHOULD_RETRY, string_header("`true`: safe to retry.")),
                        ],
                    );
                    add_problem(
                        operation,
                        "500",
                        "`INTERNAL_ERROR`: an unexpected failure; nothing was recorded. The body \
                         carries no internals.",
                        [],
                    );
                }
                if mutation {
                    add_mutation_responses(operation);
                }
                for response in operation.responses.responses.values_mut() {
                    if let RefOr::T(response) = response {
                        response
                            .headers
                            .entry(REQUEST_ID.to_owned())
                            .or_insert_with(|| {
                                RefOr::T(string_header(
                                    "The request id: the client's `X-Request-Id` when it is \
                                     1 to 128 characters of `A-Za-z0-9-_.:`, else one generated \
                                     by the server. It is on every log line of the request.",
                                ))
                            });
                    }
                }
            }
        }
        // Last: a `HEAD` has every answer of its `GET`, the shared ones too.
        for item in doc.paths.paths.values_mut() {
            if item.head.is_none() {
                item.head = item.get.as_ref().map(head_of);
            }
        }
    }
}

/// The `HEAD` operation of a `GET` (RFC 9110 §9.3.2): the same answers and
/// headers, without a body.
fn head_of(get: &Operation) -> Operation {
    let mut head = get.clone();
    head.operation_id = get.operation_id.as_ref().map(|id| format!("{id}Head"));
    head.summary = Some(format!(
        "{} (headers only)",
        get.summary
            .as_deref()
            .unwrap_or("As GET")
            .trim_end_matches('.')
    ));
    head.description = Some("As `GET`, answered without a body.".to_owned());
    for response in head.responses.responses.values_mut() {
        if let RefOr::T(response) = response {
            response.content.clear();
        }
    }
    head
}

/// Each operation of `item`, with its method in lower case.
fn operations(item: &mut PathItem) -> impl Iterator<Item = (&'static str, &mut Operation)> {
    [
        ("get", item.get.as_mut()),
        ("put", item.put.as_mut()),
        ("post", item.post.as_mut()),
        ("delete", item.delete.as_mut()),
        ("options", item.options.as_mut()),
        ("head", item.head.as_mut()),
        ("patch", item.patch.as_mut()),
        ("trace", item.trace.as_mut()),
    ]
    .into_iter()
    .filter_map(|(method, operation)| Some((method, operation?)))
}

fn header(schema: impl Into<RefOr<Schema>>, description: &str) -> Header {
    let mut header = Header::new(schema);
    header.description = Some(description.to_owned());
    header
}

fn string_header(description: &str) -> Header {
    header(ObjectBuilder::new().schema_type(Type::String), description)
}

/// The optional `X-Request-Id` request header.
fn add_request_id(operation: &mut Operation) {
    add_header_parameter(
        operation,
        REQUEST_ID,
        Required::False,
        "A request id to log and echo back. A value of 1 to 128 characters of \
         `A-Za-z0-9-_.:` is used as it is; any other is replaced by one the server \
         generates (never refused).",
        ObjectBuilder::new().schema_type(Type::String),
    );
}

/// The required `Idempotency-Key` request header of a mutation, with the
/// bounds [`idempotency::IdempotencyKey`] checks.
fn add_idempotency_key(operation: &mut Operation) {
    let max = idempotency::MAX_LEN;
    add_header_parameter(
        operation,
        idempotency::HEADER,
        Required::True,
        &format!(
            "Makes the request safe to retry: 1 to {max} printable ASCII characters, not all \
             spaces; an RFC 8941 string (`\"abc\"`) means `abc`. A retry with the same key and \
             body replays the first answer; the same key with another request is a `409`. Keys \
             are per user."
        ),
        ObjectBuilder::new()
            .schema_type(Type::String)
            .min_length(Some(1))
            .max_length(Some(max))
            .pattern(Some("^[ -~]+$")),
    );
}

fn add_header_parameter(
    operation: &mut Operation,
    name: &str,
    required: Required,
    description: &str,
    schema: ObjectBuilder,
) {
    let parameter = ParameterBuilder::new()
        .name(name)
        .parameter_in(ParameterIn::Header)
        .required(required)
        .description(Some(description))
        .schema(Some(schema))
        .build();
    operation
        .parameters
        .get_or_insert_with(Vec::new)
        .push(RefOr::T(parameter));
}

/// What every mutation can answer besides its handler's own responses: the
/// problems of [`super::mutation::Mutation`]'s checks, the ledger's `409`
/// (after the handler's own `409` codes, if it has any), and
/// `Idempotent-Replayed` on each answer a replay can give.
fn add_mutation_responses(operation: &mut Operation) {
    add_problem(
        operation,
        "400",
        "`VALIDATION_FAILED`: the `Idempotency-Key` header is missing, empty, too long, not \
         printable ASCII or sent twice (the `detail` says which). `MALFORMED_JSON`: the body is \
         not JSON or repeats a member.",
        [],
    );
    add_problem(
        operation,
        "408",
        "`REQUEST_TIMEOUT`: the body had not fully arrived 10 s after the request's head; the \
         connection is closed. Nothing was recorded.",
        [],
    );
    add_problem(
        operation,
        "413",
        "`PAYLOAD_TOO_LARGE`: the body is larger than `MAX_BODY_BYTES`.",
        [],
    );
    add_problem(
        operation,
        "415",
        "`UNSUPPORTED_MEDIA_TYPE`: the body is not `application/json`, or is content-coded \
         (a `Content-Encoding` other than `identity`: the service decodes none).",
        [],
    );
    // Described below: the ledger's conflicts, after the handler's own ones.
    add_problem(operation, "409", "", []);
    for (status, response) in operation.responses.responses.iter_mut() {
        let RefOr::T(response) = response else {
            continue;
        };
        if status == "409" {
            response.description = match response.description.as_str() {
                "" => LEDGER_CONFLICTS.to_owned(),
                own => format!("{own} {LEDGER_CONFLICTS}"),
            };
            response.headers.insert(
                "Retry-After".to_owned(),
                RefOr::T(header(
                    u32::schema(),
                    "Seconds to wait before retrying with the same key \
                     (`IDEMPOTENCY_IN_PROGRESS` only).",
                )),
            );
            response.headers.insert(
                SHOULD_RETRY.to_owned(),
                RefOr::T(string_header(
                    "`true` on `IDEMPOTENCY_IN_PROGRESS`: retry with the same key.",
                )),
            );
        }
        if !NEVER_REPLAYED.contains(&status.as_str()) && !status.starts_with('5') {
            response.headers.insert(
                REPLAYED_HEADER.to_owned(),
                RefOr::T(string_header(
                    "`true` when this answer was recorded by an earlier request with the same key.",
                )),
            );
        }
    }
}

/// A problem response, unless the operation already describes `status`.
fn add_problem<'a>(
    operation: &mut Operation,
    status: &str,
    description: &str,
    headers: impl IntoIterator<Item = (&'a str, Header)>,
) {
    let mut response = Response::new(description);
    response.content.insert(
        PROBLEM_JSON.to_owned(),
        RefOr::T(Content::new(Some(Ref::from_schema_name("Problem")))),
    );
    for (name, header) in headers {
        response.headers.insert(name.to_owned(), RefOr::T(header));
    }
    operation
        .responses
        .responses
        .entry(status.to_owned())
        .or_insert(RefOr::T(response));
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;
    use crate::orders::input::{parse_new_order, parse_order_patch};
    use crate::orders::model::{Item, Money, Quantity};
    use idempotency_ledger::MAX_LEN;

    fn doc() -> Value {
        serde_json::from_str(document_json().expect("the document serializes")).expect("JSON")
    }

    #[test]
    fn the_request_schemas_have_the_bounds_of_the_domain_types() {
        let doc = doc();
        for name in ["CreateOrder", "UpdateOrder"] {
            let schema = &doc["components"]["schemas"][name];
            assert_eq!(schema["additionalProperties"], false, "{name}");
            let props = &schema["properties"];
            assert_eq!(props["item"]["maxLength"], Item::MAX_CHARS, "{name}");
            assert_eq!(props["item"]["minLength"], 1, "{name}");
            assert_eq!(props["quantity"]["minimum"], Quantity::MIN, "{name}");
            assert_eq!(props["quantity"]["maximum"], Quantity::MAX, "{name}");
            assert_eq!(props["price"]["minimum"], 0, "{name}");
            assert_eq!(
                props["price"]["maximum"].as_f64(),
                Some(Money::MAX_CENTS as f64 / 100.0),
                "{name}"
            );
            assert_eq!(props["price"]["multipleOf"], 0.01, "{name}");
            for field in ["item", "quantity", "price"] {
                assert!(
                    !props[field]["type"].to_string().contains("null"),
                    "{name}.{field} must not be nullable: {}",
                    props[field]
                );
            }
        }
        let required = &doc["components"]["schemas"]["CreateOrder"]["required"];
        assert_eq!(required, &serde_json::json!(["item", "quantity", "price"]));
    }

    #[test]
    fn the_schema_examples_are_accepted_by_the_parsers() {
        let doc = doc();
        let create = &doc["components"]["schemas"]["CreateOrder"]["example"];
        assert!(parse_new_order(create).is_ok(), "{create}");
        let patch = &doc["components"]["schemas"]["UpdateOrder"]["example"];
        assert!(parse_order_patch(patch).is_ok(), "{patch}");
    }

    #[test]
    fn the_problem_schema_requires_an_instance_naming_the_request_id() {
        let doc = doc();
        let problem = &doc["components"]["schemas"]["Problem"];
        let required = problem["required"].as_array().expect("required members");
        for member in ["type", "title", "status", "detail", "instance", "error"] {
            assert!(required.iter().any(|r| r == member), "{member}: {problem}");
        }
        let instance = &problem["properties"]["instance"];
        let described = instance["description"].as_str().unwrap_or_default();
        assert!(
            described.contains("urn:request:") && described.contains("X-Request-Id"),
            "{instance}"
        );
        assert!(
            !instance["type"].to_string().contains("null"),
            "every problem carries one: {instance}"
        );
    }

    #[test]
    fn the_idempotency_key_parameter_has_the_parsers_length_bound() {
        let doc = doc();
        let operation = &doc["paths"]["/v1/orders"]["post"];
        let key = operation["parameters"]
            .as_array()
            .expect("parameters")
            .iter()
            .find(|p| p["name"] == idempotency_ledger::HEADER)
            .expect("an Idempotency-Key parameter");
        assert_eq!(key["required"], true);
        assert_eq!(key["schema"]["maxLength"], MAX_LEN);
    }
}
