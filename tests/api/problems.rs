//! Every problem document names its occurrence: `instance` is
//! `urn:request:<id>`, the id in the `X-Request-Id` answer header of the
//! request that produced it — the client's own id when it sent a sane one. A
//! replayed problem is the recorded one byte for byte: it keeps the first
//! request's `instance`, and the retry is named by its own header.

use std::collections::BTreeSet;

use crate::both_backends;
use crate::expect::*;
use crate::helpers::*;
use crate::operability::{remove_last_migration_record, restore_migration_record};

const MISSING_ORDER: &str = "/v1/orders/0193a8e4-8f3c-7cc2-9d6a-5b1f2e3d4c5b";

/// `response`'s `instance`, checked against its `X-Request-Id`.
fn instance(response: &TestResponse) -> String {
    assert_names_its_request(response);
    response.json()["instance"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

both_backends! {
    fn every_kind_of_problem_names_its_request_as_instance(backend) {
        let app = TestApp::spawn_with(backend, |settings| settings.max_body_bytes = 100);
        let auth = format!("Bearer {}", app.token);
        let json = ("Content-Type", "application/json");
        let created = app.post_order(Some("made"), &order_body("Widget", 1, "1.00"));
        let order = created.header("Location").expect("Location").to_owned();
        assert_eq!(app.call("DELETE", &order, Some("cancel"), None).status, 200);

        let answers = [
            (401, "UNAUTHORIZED", app.request("GET", "/v1/orders", &[], None)),
            (400, "VALIDATION_FAILED", app.post_order(None, &order_body("Widget", 1, "1.00"))),
            (400, "VALIDATION_FAILED", app.call("GET", "/v1/orders?limit=0", None, None)),
            (400, "MALFORMED_JSON", app.post_order(Some("broken"), "{\"item\":")),
            (404, "NOT_FOUND", app.call("GET", MISSING_ORDER, None, None)),
            (404, "NOT_FOUND", app.request("GET", "/nowhere", &[], None)),
            (405, "METHOD_NOT_ALLOWED", app.call("PUT", &order, Some("put"), Some("{}"))),
            (409, "IDEMPOTENCY_KEY_REUSED_WITH_DIFFERENT_PAYLOAD",
                app.post_order(Some("made"), &order_body("Widget", 99, "0.01"))),
            (409, "ORDER_NOT_PENDING", app.call("PATCH", &order, Some("late"), Some(r#"{"quantity":2}"#))),
            (413, "PAYLOAD_TOO_LARGE", app.post_order(Some("big"), &"x".repeat(101))),
            (415, "UNSUPPORTED_MEDIA_TYPE", app.request(
                "POST",
                "/v1/orders",
                &[("Authorization", &auth), ("Idempotency-Key", "form"), ("Content-Type", "application/x-www-form-urlencoded")],
                Some("item=Widget&quantity=1&price=1"),
            )),
            (422, "VALIDATION_FAILED", app.request(
                "POST",
                "/v1/orders",
                &[("Authorization", &auth), ("Idempotency-Key", "bad"), json],
                Some(r#"{"item":"Widget","quantity":0,"price":1}"#),
            )),
        ];

        let mut instances = BTreeSet::new();
        for (status, code, response) in &answers {
            assert_problem(response, *status, code);
            instances.insert(instance(response));
        }
        assert_eq!(instances.len(), answers.len(), "each occurrence is its own: {instances:?}");
    }

    fn a_503_names_its_request_as_instance(backend) {
        let app = TestApp::spawn(backend);
        let version = remove_last_migration_record(&app);

        let pending = app.request("GET", "/readyz", &[("X-Request-Id", "probe-1")], None);
        restore_migration_record(&app, &version);

        assert_problem(&pending, 503, "SERVICE_UNAVAILABLE");
        assert_eq!(instance(&pending), "urn:request:probe-1");
    }

    fn a_refusal_of_the_framework_names_its_request_as_instance(backend) {
        let app = TestApp::spawn_with(backend, |settings| {
            settings.cors_allowed_origins = vec!["https://shop.example".into()];
        });

        let refused = app.request(
            "OPTIONS",
            "/v1/orders",
            &[
                ("Origin", "https://shop.example"),
                ("Access-Control-Request-Method", "PUT"),
                ("X-Request-Id", "preflight-9"),
            ],
            None,
        );

        assert!(refused.status >= 400, "{} {}", refused.status, refused.body);
        assert_eq!(refused.header("Content-Type"), Some(PROBLEM_JSON), "{}", refused.body);
        assert_eq!(instance(&refused), "urn:request:preflight-9");
    }

    fn a_client_sent_x_request_id_is_the_problems_instance(backend) {
        let app = TestApp::spawn(backend);
        let auth = format!("Bearer {}", app.token);

        let missing = app.request("GET", MISSING_ORDER, &[("Authorization", &auth), ("X-Request-Id", "client-7.a:b_c")], None);
        let unauthorized = app.request("GET", "/v1/orders", &[("X-Request-Id", "client-8")], None);
        let unsafe_id = app.request("GET", "/v1/orders", &[("X-Request-Id", "not safe")], None);

        assert_problem(&missing, 404, "NOT_FOUND");
        assert_eq!(instance(&missing), "urn:request:client-7.a:b_c");
        assert_problem(&unauthorized, 401, "UNAUTHORIZED");
        assert_eq!(instance(&unauthorized), "urn:request:client-8");
        assert_problem(&unsafe_id, 401, "UNAUTHORIZED");
        let generated = unsafe_id.header("X-Request-Id").expect("a generated id");
        assert!(uuid::Uuid::try_parse(generated).is_ok(), "{generated}");
        assert_eq!(instance(&unsafe_id), format!("urn:request:{generated}"));
    }

    fn a_replayed_problem_is_the_recorded_one_byte_for_byte_instance_included(backend) {
        let app = TestApp::spawn(backend);
        let auth = format!("Bearer {}", app.token);
        let created = app.post_order(Some("made"), &order_body("Widget", 1, "1.00"));
        let order = created.header("Location").expect("Location").to_owned();
        assert_eq!(app.call("DELETE", &order, Some("cancel"), None).status, 200);
        let patch = |request_id: &str| {
            app.request(
                "PATCH",
                &order,
                &[
                    ("Authorization", &auth),
                    ("Idempotency-Key", "patch-cancelled"),
                    ("Content-Type", "application/json"),
                    ("X-Request-Id", request_id),
                ],
                Some(r#"{"quantity":3}"#),
            )
        };

        let first = patch("first-try");
        let retry = patch("second-try");

        assert_problem(&first, 409, "ORDER_NOT_PENDING");
        assert_eq!(instance(&first), "urn:request:first-try");
        assert_eq!(retry.status, 409, "{}", retry.body);
        assert_eq!(retry.header("Idempotent-Replayed"), Some("true"));
        assert_eq!(retry.header("X-Request-Id"), Some("second-try"));
        assert_eq!(retry.json()["instance"], "urn:request:first-try");
        assert_eq!(retry.body, first.body, "the recorded problem, byte for byte");
        assert_replay_of(&first, &retry);
    }

    fn a_replayed_404_keeps_the_instance_of_the_request_that_produced_it(backend) {
        let app = TestApp::spawn(backend);
        let auth = format!("Bearer {}", app.token);
        let patch = |request_id: &str| {
            app.request(
                "PATCH",
                MISSING_ORDER,
                &[
                    ("Authorization", &auth),
                    ("Idempotency-Key", "patch-missing"),
                    ("Content-Type", "application/json"),
                    ("X-Request-Id", request_id),
                ],
                Some(r#"{"quantity":3}"#),
            )
        };

        let first = patch("first-try");
        let retry = patch("second-try");

        assert_problem(&first, 404, "NOT_FOUND");
        assert_problem(&retry, 404, "NOT_FOUND");
        assert_eq!(retry.header("Idempotent-Replayed"), Some("true"));
        assert_eq!(instance(&first), "urn:request:first-try");
        assert_eq!(retry.json()["instance"], "urn:request:first-try");
        assert_eq!(retry.header("X-Request-Id"), Some("second-try"));
        assert_replay_of(&first, &retry);
    }
}
