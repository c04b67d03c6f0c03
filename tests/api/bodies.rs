//! CONTRACT §3 and §4 steps 1–4: the order of the checks, media type, size,
//! JSON syntax, strict field types, and exact money.

use crate::both_backends;
use crate::expect::*;
use crate::helpers::*;

fn post_as(app: &TestApp, headers: &[(&str, &str)], body: &str) -> TestResponse {
    app.request("POST", "/v1/orders", headers, Some(body))
}

/// A POST body with `quantity` and `price` written as given.
fn body_with(quantity: &str, price: &str) -> String {
    format!(r#"{{"item":"Widget","quantity":{quantity},"price":{price}}}"#)
}

both_backends! {
    /// RFC 9110 §8.3.1: a media type's type and subtype are read in any
    /// case, and whitespace around a parameter's `;` is allowed, so
    /// `Application/JSON ; charset=utf-8` is JSON (before, a space before
    /// the `;` was `415`).
    fn a_json_media_type_in_any_case_with_whitespace_around_its_parameters_is_json(backend) {
        let app = TestApp::spawn(backend);
        let auth = format!("Bearer {}", app.token);
        let body = order_body("Widget", 1, "1.00");
        for (i, content_type) in [
            "Application/JSON ; charset=utf-8",
            "application/json ;charset=UTF-8",
            "APPLICATION/json\t;\tcharset=\"utf-8\"",
        ]
        .into_iter()
        .enumerate()
        {
            let key = format!("typed-{i}");
            let created = post_as(
                &app,
                &[
                    ("Authorization", auth.as_str()),
                    ("Idempotency-Key", key.as_str()),
                    ("Content-Type", content_type),
                ],
                &body,
            );
            assert_eq!(created.status, 201, "{content_type:?}: {}", created.body);
        }
        assert_eq!(app.order_count(), 3);
    }

    /// A body with a content coding other than `identity` is refused `415
    /// UNSUPPORTED_MEDIA_TYPE` (the service decodes none), before it is
    /// read: nothing is recorded and the key stays free. `identity` is
    /// taken. Before, the coding was ignored and the bytes read as they came
    /// (a gzip body was `400 MALFORMED_JSON`, a JSON one labelled gzip `201`).
    fn a_content_coded_body_is_refused_415_and_its_key_stays_free(backend) {
        let app = TestApp::spawn(backend);
        let auth = format!("Bearer {}", app.token);
        let body = order_body("Widget", 1, "1.00");
        let post = |coding: &str| {
            post_as(
                &app,
                &[
                    ("Authorization", auth.as_str()),
                    ("Idempotency-Key", "coded"),
                    ("Content-Type", "application/json"),
                    ("Content-Encoding", coding),
                ],
                &body,
            )
        };

        for coding in ["gzip", "br", "identity, deflate"] {
            let refused = post(coding);
            assert_problem(&refused, 415, "UNSUPPORTED_MEDIA_TYPE");
            let detail = refused.json()["detail"].as_str().unwrap_or_default().to_owned();
            assert!(detail.contains("Content-Encoding"), "{detail}");
        }
        assert_eq!((app.order_count(), app.ledger_count()), (0, 0), "nothing recorded");
        let identity = post("identity");
        assert_eq!(identity.status, 201, "the key is free: {}", identity.body);
    }

    fn authentication_is_checked_before_the_key_the_media_type_and_the_body(backend) {
        let app = TestApp::spawn(backend);

        let nothing_right = post_as(&app, &[("Content-Type", "text/plain")], "quantity=-1");
        let bad_token = post_as(
            &app,
            &[("Authorization", "Bearer oa_nope"), ("Idempotency-Key", "")],
            "{",
        );
        let unknown_token = post_as(
            &app,
            &[
                (
                    "Authorization",
                    format!("Bearer oa_{}", "0".repeat(64)).as_str(),
                ),
                ("Content-Type", "application/json"),
            ],
            &body_with("-1", "1"),
        );

        for response in [&nothing_right, &bad_token, &unknown_token] {
            assert_problem(response, 401, "UNAUTHORIZED");
            assert_eq!(response.header("WWW-Authenticate"), Some("Bearer"));
        }
        assert_eq!(app.order_count(), 0);
    }

    fn the_key_is_checked_before_the_media_type(backend) {
        let app = TestApp::spawn(backend);
        let auth = format!("Bearer {}", app.token);

        let response = post_as(
            &app,
            &[
                ("Authorization", auth.as_str()),
                ("Content-Type", "application/x-www-form-urlencoded"),
            ],
            "item=Widget",
        );

        assert_key_refused(&response, MISSING_KEY_DETAIL);
    }

    fn the_media_type_is_checked_before_body_validation(backend) {
        let app = TestApp::spawn(backend);
        let auth = format!("Bearer {}", app.token);
        let invalid = body_with("-1", "-1");

        let plain = post_as(
            &app,
            &[
                ("Authorization", auth.as_str()),
                ("Idempotency-Key", "k"),
                ("Content-Type", "text/plain"),
            ],
            &invalid,
        );
        let missing = post_as(
            &app,
            &[("Authorization", auth.as_str()), ("Idempotency-Key", "k")],
            &invalid,
        );
        let suffixed = post_as(
            &app,
            &[
                ("Authorization", auth.as_str()),
                ("Idempotency-Key", "k"),
                ("Content-Type", "application/merge-patch+json"),
            ],
            &invalid,
        );

        for response in [&plain, &missing, &suffixed] {
            assert_problem(response, 415, "UNSUPPORTED_MEDIA_TYPE");
        }
        let with_charset = post_as(
            &app,
            &[
                ("Authorization", auth.as_str()),
                ("Idempotency-Key", "k"),
                ("Content-Type", "application/json; charset=utf-8"),
            ],
            &order_body("Widget", 1, "1"),
        );
        assert_eq!(
            with_charset.status, 201,
            "a charset parameter is still JSON: {}",
            with_charset.body
        );
    }

    fn a_body_over_max_body_bytes_is_refused_before_it_is_parsed(backend) {
        let app = TestApp::spawn_with(backend, |settings| settings.max_body_bytes = 100);
        let just_fits = format!(
            r#"{{"item":"{}","quantity":1,"price":1}}"#,
            "x".repeat(100 - 34)
        );
        assert_eq!(just_fits.len(), 100);
        let one_too_many = format!(
            r#"{{"item":"{}","quantity":1,"price":1}}"#,
            "x".repeat(101 - 34)
        );

        let refused = app.post_order(Some("big"), &one_too_many);
        let malformed_and_big = app.post_order(Some("big"), &"{".repeat(10_000));
        let invalid_and_big = app.post_order(
            Some("big"),
            &format!(r#"{{"item":"{}","quantity":-1}}"#, " ".repeat(200)),
        );

        assert_problem(&refused, 413, "PAYLOAD_TOO_LARGE");
        assert_problem(&malformed_and_big, 413, "PAYLOAD_TOO_LARGE");
        assert_problem(&invalid_and_big, 413, "PAYLOAD_TOO_LARGE");
        assert_eq!(app.order_count(), 0);
        let accepted = app.post_order(Some("big"), &just_fits);
        assert_eq!(accepted.status, 201, "{}", accepted.body);
    }

    fn malformed_json_is_a_400_malformed_json(backend) {
        let app = TestApp::spawn(backend);

        for (i, bad) in [
            "",
            "{",
            "{\"item\":}",
            "nope",
            "{} {}",
            "{'item':'Widget'}",
            "{\"item\":\"Widget\",}",
            "[1,2",
        ]
        .iter()
        .enumerate()
        {
            let response = app.post_order(Some(&format!("bad-{i}")), bad);
            assert_problem(&response, 400, "MALFORMED_JSON");
        }
        assert_eq!(app.order_count(), 0);
        assert_eq!(app.ledger_count(), 0);
    }

    fn duplicate_member_names_are_a_400_malformed_json(backend) {
        let app = TestApp::spawn(backend);

        let top = app.post_order(
            Some("dup"),
            r#"{"item":"Widget","quantity":1,"quantity":1000,"price":1}"#,
        );
        let same_value = app.post_order(
            Some("dup"),
            r#"{"item":"Widget","item":"Widget","quantity":1,"price":1}"#,
        );
        let nested = app.post_order(
            Some("dup"),
            r#"{"item":"Widget","quantity":1,"price":1,"x":{"a":1,"a":2}}"#,
        );

        assert_problem(&top, 400, "MALFORMED_JSON");
        assert_problem(&same_value, 400, "MALFORMED_JSON");
        assert_problem(&nested, 400, "MALFORMED_JSON");
        assert_eq!(app.order_count(), 0);
    }

    fn every_failing_field_is_reported_once(backend) {
        let app = TestApp::spawn(backend);

        let response = app.post_order(
            Some("all-bad"),
            r#"{"item":"","quantity":"x","price":9.999,"total_price":1,"colour":"red"}"#,
        );

        assert_invalid_fields(
            &response,
            &["item", "quantity", "price", "total_price", "colour"],
        );
        assert_eq!(app.order_count(), 0);
    }

    fn unknown_members_and_a_client_total_price_are_refused(backend) {
        let app = TestApp::spawn(backend);

        let total = app.post_order(
            Some("k"),
            r#"{"item":"Widget","quantity":2,"price":9.99,"total_price":0.01}"#,
        );
        let status = app.post_order(
            Some("k"),
            r#"{"item":"Widget","quantity":2,"price":9.99,"status":"cancelled"}"#,
        );
        let id = app.post_order(
            Some("k"),
            r#"{"item":"Widget","quantity":2,"price":9.99,"id":"x"}"#,
        );

        assert_invalid_fields(&total, &["total_price"]);
        assert_invalid_fields(&status, &["status"]);
        assert_invalid_fields(&id, &["id"]);
        assert_eq!(app.order_count(), 0);
    }

    fn a_body_that_is_not_a_json_object_is_a_422(backend) {
        let app = TestApp::spawn(backend);

        for body in ["[]", "[1,2]", "\"Widget\"", "42", "null", "true"] {
            let response = app.post_order(Some("not-object"), body);
            assert_problem(&response, 422, "VALIDATION_FAILED");
            assert!(!failing_fields(&response).is_empty(), "{}", response.body);
        }
        assert_eq!(app.order_count(), 0);
    }

    fn a_quantity_must_be_a_json_integer_literal(backend) {
        let app = TestApp::spawn(backend);

        for quantity in [
            "\"1\"",
            "1.5",
            "1.0",
            "1e2",
            "1E2",
            "true",
            "null",
            "[1]",
            "{}",
            "-0.0",
            "1000001",
            "99999999999999999999999",
        ] {
            let response = app.post_order(Some("strict"), &body_with(quantity, "9.99"));
            assert_invalid_fields(&response, &["quantity"]);
        }
        assert_eq!(app.order_count(), 0);

        let smallest = app.post_order(Some("q-min"), &body_with("1", "1"));
        let largest = app.post_order(Some("q-max"), &body_with("1000000", "1"));
        assert_eq!(smallest.status, 201, "{}", smallest.body);
        assert_eq!(largest.status, 201, "{}", largest.body);
        assert_eq!(raw_member(&largest.body, "quantity"), "1000000");
    }

    fn a_price_must_be_a_whole_number_of_cents_in_range(backend) {
        let app = TestApp::spawn(backend);

        for price in [
            "9.999",
            "0.001",
            "1e-3",
            "\"9.99\"",
            "null",
            "true",
            "1000000000.01",
            "1e10",
            "-0.01",
        ] {
            let response = app.post_order(Some("price"), &body_with("1", price));
            assert_invalid_fields(&response, &["price"]);
        }
        assert_eq!(app.order_count(), 0);

        for (key, price, shown) in [
            ("p1", "9.990", "9.99"),
            ("p2", "1e2", "100.00"),
            ("p3", "0", "0.00"),
            ("p4", "1000000000", "1000000000.00"),
            ("p5", "0.1E1", "1.00"),
        ] {
            let response = app.post_order(Some(key), &body_with("1", price));
            assert_eq!(response.status, 201, "price {price}: {}", response.body);
            assert_eq!(raw_member(&response.body, "price"), shown, "price {price}");
        }
        assert_eq!(app.order_count(), 5);
    }

    fn a_price_of_any_exponent_or_length_is_its_exact_value_or_a_422(backend) {
        let app = TestApp::spawn(backend);
        let zeros = |n: usize| "0".repeat(n);

        // The free order: these read as 0.00 before money was read exactly.
        let refused = [
            "1e99999999999999999999".to_owned(),
            "1E+99999999999999999999".to_owned(),
            "1e-99999999999999999999".to_owned(),
            "-1e99999999999999999999".to_owned(),
            format!("1e{}", "9".repeat(60)),
            format!("0.{}1", zeros(399)),
            format!("1{}", zeros(400)),
            format!("1{}e-389", zeros(399)),
            "1e-29".to_owned(),
            "1e29".to_owned(),
        ];
        for price in &refused {
            let response = app.post_order(Some("exp"), &body_with("1", price));
            assert_invalid_fields(&response, &["price"]);
        }
        assert_eq!(app.order_count(), 0);

        for (key, price, shown) in [
            ("z", "0e99999999999999999999".to_owned(), "0.00"),
            ("b", format!("1{}e-390", zeros(399)), "1000000000.00"),
            ("c", "-0.0e-00000000000000000000000005".to_owned(), "0.00"),
            ("d", format!("999999999.99{}", zeros(380)), "999999999.99"),
        ] {
            let response = app.post_order(Some(key), &body_with("2", &price));
            assert_eq!(response.status, 201, "price {price}: {}", response.body);
            assert_eq!(raw_member(&response.body, "price"), shown, "price {price}");
        }

        let created = app.post_order(Some("patched"), &body_with("1", "5"));
        let path = format!("/v1/orders/{}", id_of(&created));
        for (n, price) in refused.iter().enumerate() {
            let patch = app.call(
                "PATCH",
                &path,
                Some(&format!("patch-{n}")),
                Some(&format!(r#"{{"price":{price}}}"#)),
            );
            assert_invalid_fields(&patch, &["price"]);
        }
        let read = app.call("GET", &path, None, None);
        assert_eq!(raw_member(&read.body, "price"), "5.00");
    }

    fn an_item_is_trimmed_bounded_and_free_of_control_characters(backend) {
        let app = TestApp::spawn(backend);

        let too_long = "x".repeat(201);
        for item in [
            "",
            "   ",
            too_long.as_str(),
            "a\\u0000b",
            "a\\nb",
            "a\\u007fb",
        ] {
            let response = app.post_order(
                Some("item"),
                &format!(r#"{{"item":"{item}","quantity":1,"price":1}}"#),
            );
            assert_invalid_fields(&response, &["item"]);
        }
        let not_a_string = app.post_order(Some("item"), r#"{"item":42,"quantity":1,"price":1}"#);
        assert_invalid_fields(&not_a_string, &["item"]);
        assert_eq!(app.order_count(), 0);

        let trimmed = app.post_order(
            Some("trim"),
            r#"{"item":"  Widget \t","quantity":1,"price":1}"#,
        );
        assert_eq!(trimmed.status, 201, "{}", trimmed.body);
        assert_eq!(trimmed.json()["item"], "Widget");
        let longest = "\u{e9}".repeat(200);
        let unicode = app.post_order(Some("long"), &order_body(&longest, 1, "1"));
        assert_eq!(
            unicode.status, 201,
            "200 characters, not bytes: {}",
            unicode.body
        );
        assert_eq!(unicode.json()["item"], longest.as_str());
    }

    fn money_is_written_as_its_exact_decimal_text(backend) {
        let app = TestApp::spawn(backend);

        let small = app.post_order(Some("dimes"), &order_body("Dime", 3, "0.10"));
        let huge = app.post_order(Some("huge"), &order_body("Yacht", 999_999, "999999999.99"));
        let usual = app.post_order(Some("usual"), &order_body("Widget", 2, "9.99"));

        assert_eq!(small.status, 201, "{}", small.body);
        let total = raw_member(&small.body, "total_price");
        assert!(
            total == "0.30" || total == "0.3",
            "3 x 0.10 is written {total}"
        );
        assert_eq!(huge.status, 201, "{}", huge.body);
        assert_eq!(raw_member(&huge.body, "total_price"), "999998999990000.01");
        assert_eq!(raw_member(&huge.body, "price"), "999999999.99");
        assert_eq!(raw_member(&usual.body, "total_price"), "19.98");

        // Read back from storage, the amounts are still exact.
        let read = app.call(
            "GET",
            huge.header("Location").expect("Location"),
            None,
            None,
        );
        assert_eq!(raw_member(&read.body, "total_price"), "999998999990000.01");
        let list = app.call("GET", "/v1/orders", None, None);
        assert!(
            list.body.contains("\"total_price\":999998999990000.01"),
            "{}",
            list.body
        );
    }
}
