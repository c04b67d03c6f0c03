//! `GET /openapi.json` against the routes the server really registers
//! (`orders_api::http::ENDPOINTS`, which `routes()` is built from), and the
//! proof that no mutating route can bypass the idempotency ledger.

use orders_api::http::ENDPOINTS;
use serde_json::Value;

use crate::both_backends;
use crate::helpers::*;

const MUTATING: [&str; 4] = ["post", "put", "patch", "delete"];

/// Every problem code of CONTRACT §3–4.
const ERROR_CODES: [&str; 12] = [
    "UNAUTHORIZED",
    "VALIDATION_FAILED",
    "MALFORMED_JSON",
    "REQUEST_TIMEOUT",
    "PAYLOAD_TOO_LARGE",
    "UNSUPPORTED_MEDIA_TYPE",
    "NOT_FOUND",
    "ORDER_NOT_PENDING",
    "IDEMPOTENCY_KEY_REUSED_WITH_DIFFERENT_PAYLOAD",
    "IDEMPOTENCY_IN_PROGRESS",
    "SERVICE_UNAVAILABLE",
    "INTERNAL_ERROR",
];

fn document(app: &TestApp) -> Value {
    let res = app.request("GET", "/openapi.json", &[], None);
    assert_eq!(res.status, 200, "{}", res.body);
    res.json()
}

/// `(method, path, operation)` for every operation in the document.
fn operations(doc: &Value) -> Vec<(String, String, Value)> {
    let mut ops = Vec::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for (method, op) in item.as_object().expect("path item") {
            if [
                "get", "put", "post", "delete", "options", "head", "patch", "trace",
            ]
            .contains(&method.as_str())
            {
                ops.push((method.clone(), path.clone(), op.clone()));
            }
        }
    }
    ops
}

fn header_param<'a>(op: &'a Value, name: &str) -> Option<&'a Value> {
    op["parameters"].as_array()?.iter().find(|p| {
        p["in"] == "header"
            && p["name"]
                .as_str()
                .is_some_and(|n| n.eq_ignore_ascii_case(name))
    })
}

fn response_header<'a>(response: &'a Value, name: &str) -> Option<&'a Value> {
    response["headers"]
        .as_object()?
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, h)| h)
}

/// `path` with its `{id}` replaced by `id`.
fn concrete(path: &str, id: &str) -> String {
    path.replace("{id}", id)
}

both_backends! {
    /// RFC 9110: every `GET` route answers `HEAD` as it answers `GET`, the
    /// same status and headers, without a body — with a token and without,
    /// for a missing order too — and the document lists each `HEAD`.
    /// Before, `HEAD` was `405` on every route.
    fn every_get_route_answers_head_like_get_without_a_body(backend) {
        let app = TestApp::spawn(backend);
        let created = app.post_order(Some("for-head"), &order_body("Widget", 1, "1.00"));
        let order = created.header("Location").expect("Location").to_owned();
        let id = order.rsplit('/').next().expect("an id").to_owned();
        let doc = document(&app);
        let auth = format!("Bearer {}", app.token);

        let gets: Vec<&str> = ENDPOINTS.iter().filter(|e| e.method == "GET").map(|e| e.path).collect();
        assert!(gets.len() >= 6, "{gets:?}");
        for path in gets {
            assert!(doc["paths"][path]["head"].is_object(), "HEAD {path} is not documented");
            let path = concrete(path, &id);
            let missing = concrete(path.as_str(), "0193a8e4-8f3c-7cc2-9d6a-5b1f2e3d4c5b");
            for (target, headers) in [
                (&path, vec![("Authorization", auth.as_str())]),
                (&path, vec![]),
                (&missing, vec![("Authorization", auth.as_str())]),
            ] {
                let get = app.request("GET", target, &headers, None);
                let head = app.request("HEAD", target, &headers, None);
                assert_eq!(head.status, get.status, "HEAD {target}: {}", get.body);
                assert_eq!(head.body, "", "HEAD {target} has no body");
                assert_eq!(head.header("Content-Type"), get.header("Content-Type"), "HEAD {target}");
                if target.as_str() != "/metrics" {
                    assert_eq!(
                        head.header("Content-Length"),
                        Some(get.body.len().to_string().as_str()),
                        "HEAD {target} says how long the GET's body is"
                    );
                }
            }
        }
        assert_eq!(app.order_count(), 1);
    }

    fn the_document_is_openapi_3_json_served_without_a_token(backend) {
        let app = TestApp::spawn(backend);

        let res = app.request("GET", "/openapi.json", &[], None);

        assert_eq!(res.status, 200);
        assert!(res.header("Content-Type").unwrap_or_default().starts_with("application/json"));
        let doc = res.json();
        assert!(doc["openapi"].as_str().unwrap_or_default().starts_with("3."), "{}", doc["openapi"]);
        for schema in ["OrderView", "CreateOrder", "UpdateOrder", "Problem", "OrderPage"] {
            assert!(doc["components"]["schemas"][schema].is_object(), "schema {schema} is missing");
        }
    }

    fn every_registered_route_is_in_the_document_and_nothing_else(backend) {
        let app = TestApp::spawn(backend);
        let doc = document(&app);

        let mut registered: Vec<(String, String)> = ENDPOINTS
            .iter()
            .map(|e| (e.method.as_str().to_ascii_lowercase(), e.path.to_owned()))
            .collect();
        let mut documented: Vec<(String, String)> =
            operations(&doc).into_iter().map(|(m, p, _)| (m, p)).collect();
        registered.sort();
        documented.sort();

        assert!(registered.len() >= 9, "every route of CONTRACT §3 is registered: {registered:?}");
        for route in &registered {
            assert!(documented.contains(route), "registered route {route:?} is not in /openapi.json");
        }
        assert_eq!(documented, registered, "the document lists an operation no route serves");
    }

    fn every_path_answers_an_undocumented_method_with_405_allowing_exactly_the_documented_ones(backend) {
        // The server itself says which methods each path takes (`Allow`);
        // that must be what the document says.
        let app = TestApp::spawn(backend);
        let doc = document(&app);
        let auth = format!("Bearer {}", app.token);

        for (path, item) in doc["paths"].as_object().expect("paths") {
            let mut documented: Vec<String> =
                item.as_object().expect("item").keys().map(|m| m.to_ascii_uppercase()).collect();
            documented.retain(|m| m != "PARAMETERS");
            let res = app.request(
                "PUT",
                &concrete(path, "0193a8e4-8f3c-7cc2-9d6a-5b1f2e3d4c5b"),
                &[("Authorization", &auth), ("Idempotency-Key", "put-probe")],
                None,
            );
            assert_eq!(res.status, 405, "PUT {path}: {}", res.body);
            let mut allowed: Vec<String> = res
                .header("Allow")
                .unwrap_or_default()
                .split(',')
                .map(|m| m.trim().to_owned())
                .collect();
            allowed.sort();
            documented.sort();
            assert_eq!(allowed, documented, "Allow of {path}");
        }
        assert_eq!(app.order_count(), 0);
    }

    fn every_mutating_operation_requires_an_idempotency_key_of_at_most_255_characters(backend) {
        let app = TestApp::spawn(backend);
        let doc = document(&app);

        let mutations: Vec<_> = operations(&doc)
            .into_iter()
            .filter(|(m, _, _)| MUTATING.contains(&m.as_str()))
            .collect();

        assert_eq!(mutations.len(), 3, "POST, PATCH and DELETE are documented: {mutations:?}");
        for (method, path, op) in &mutations {
            let key = header_param(op, "Idempotency-Key")
                .unwrap_or_else(|| panic!("{method} {path} has no Idempotency-Key parameter"));
            assert_eq!(key["required"], true, "{method} {path}");
            assert_eq!(key["schema"]["maxLength"], 255, "{method} {path}");
            assert_eq!(key["schema"]["type"], "string", "{method} {path}");
        }
        for (method, path, op) in operations(&doc) {
            if !MUTATING.contains(&method.as_str()) {
                assert!(header_param(&op, "Idempotency-Key").is_none(), "{method} {path} is not a mutation");
            }
        }
    }

    fn no_mutating_route_answers_without_an_idempotency_key(backend) {
        // The proof that no mutating route can bypass the ledger: every one
        // the server registers refuses a well-formed request without a key,
        // and nothing changes.
        let app = TestApp::spawn(backend);
        let created = app.post_order(Some("setup"), &order_body("Widget", 2, "9.99"));
        assert_eq!(created.status, 201, "{}", created.body);
        let order = created.json();
        let id = order["id"].as_str().unwrap().to_owned();
        let ledger_before = app.ledger_count();

        let mutating: Vec<_> = ENDPOINTS
            .iter()
            .filter(|e| MUTATING.contains(&e.method.as_str().to_ascii_lowercase().as_str()))
            .collect();
        assert_eq!(mutating.len(), 3, "POST, PATCH and DELETE are registered");
        for endpoint in mutating {
            let method = endpoint.method.as_str();
            let body = match method {
                "POST" => Some(order_body("Gadget", 1, "1.00")),
                "PATCH" => Some(r#"{"quantity": 5}"#.to_owned()),
                _ => None,
            };
            let path = concrete(endpoint.path, &id);

            let res = app.call(method, &path, None, body.as_deref());

            assert_eq!(res.status, 400, "{method} {path}: {}", res.body);
            assert_eq!(res.error_code(), "VALIDATION_FAILED", "{method} {path}");
            assert_eq!(res.json()["detail"], "Idempotency-Key header is required", "{method} {path}");
        }
        assert_eq!(app.order_count(), 1);
        assert_eq!(app.ledger_count(), ledger_before);
        let now = app.call("GET", &format!("/v1/orders/{id}"), None, None);
        assert_eq!(now.json(), order, "the order did not change");
    }

    fn the_document_describes_the_idempotency_and_request_id_headers(backend) {
        let app = TestApp::spawn(backend);
        let doc = document(&app);
        let create = &doc["paths"]["/v1/orders"]["post"]["responses"];

        assert!(response_header(&create["201"], "Location").is_some(), "201 has Location");
        assert!(response_header(&create["200"], "Location").is_some(), "a replay has Location");
        assert!(response_header(&create["200"], "Idempotent-Replayed").is_some(), "a replay says so");
        for (method, path) in [("post", "/v1/orders"), ("patch", "/v1/orders/{id}"), ("delete", "/v1/orders/{id}")] {
            let conflict = &doc["paths"][path][method]["responses"]["409"];
            assert!(response_header(conflict, "Retry-After").is_some(), "{method} {path} 409 has Retry-After");
            let description = conflict["description"].as_str().unwrap_or_default();
            assert!(description.contains("IDEMPOTENCY_IN_PROGRESS"), "{method} {path}: {description}");
            assert!(
                description.contains("IDEMPOTENCY_KEY_REUSED_WITH_DIFFERENT_PAYLOAD"),
                "{method} {path}: {description}"
            );
        }
        for (method, path, op) in operations(&doc) {
            for (status, response) in op["responses"].as_object().expect("responses") {
                assert!(
                    response_header(response, "X-Request-Id").is_some(),
                    "{method} {path} {status} documents X-Request-Id"
                );
            }
        }
    }

    fn every_v1_operation_needs_the_bearer_token_and_no_other_does(backend) {
        let app = TestApp::spawn(backend);
        let doc = document(&app);
        let scheme = &doc["components"]["securitySchemes"]["bearer"];
        assert_eq!(scheme["type"], "http");
        assert_eq!(scheme["scheme"], "bearer");

        for (method, path, op) in operations(&doc) {
            let secured = op["security"]
                .as_array()
                .is_some_and(|s| s.iter().any(|r| r.get("bearer").is_some()));
            if path.starts_with("/v1/") {
                assert!(secured, "{method} {path} needs the bearer token");
                assert!(op["responses"]["401"].is_object(), "{method} {path} documents 401");
            } else {
                assert!(!secured, "{method} {path} needs no token");
                let res = app.request(&method.to_ascii_uppercase(), &path, &[], None);
                assert_ne!(res.status, 401, "{method} {path} answers without a token");
            }
        }
    }

    fn every_problem_response_is_problem_json_and_names_its_error_codes(backend) {
        let app = TestApp::spawn(backend);
        let doc = document(&app);
        let mut described = String::new();

        for (method, path, op) in operations(&doc) {
            for (status, response) in op["responses"].as_object().expect("responses") {
                if status.starts_with('2') {
                    continue;
                }
                if method == "head" {
                    // The `GET`'s answers, without a body.
                    assert!(response["content"].is_null(), "{method} {path} {status} has a body");
                    continue;
                }
                let schema = &response["content"]["application/problem+json"]["schema"]["$ref"];
                assert_eq!(schema, "#/components/schemas/Problem", "{method} {path} {status}");
                let description = response["description"].as_str().unwrap_or_default();
                assert!(
                    ERROR_CODES.iter().any(|code| description.contains(&format!("`{code}`"))),
                    "{method} {path} {status} names its error codes: {description}"
                );
                described.push_str(description);
            }
        }
        for code in ERROR_CODES {
            assert!(described.contains(&format!("`{code}`")), "no response describes {code}");
        }
    }
}
