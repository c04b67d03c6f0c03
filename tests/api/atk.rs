//! One test per attack scenario of SPEC §5 (ATK-05, the concurrent one,
//! lives with the concurrency tests).

use crate::both_backends;
use crate::expect::*;
use crate::helpers::*;

const FOREIGN_ORIGIN: &str = "https://evil.example";
const SHOP_ORIGIN: &str = "https://shop.example";

/// A POST whose body is fine but refused: 422 on `field`, and nothing stored.
fn assert_refused_without_trace(app: &TestApp, key: &str, body: &str, fields: &[&str]) {
    let response = app.post_order(Some(key), body);
    assert_invalid_fields(&response, fields);
    assert_eq!(app.order_count(), 0, "a refused order is not stored");
    assert_eq!(
        app.ledger_count(),
        0,
        "a refused request leaves its key unused"
    );
}

both_backends! {
    fn atk_01_a_post_without_an_idempotency_key_is_refused_and_creates_nothing(backend) {
        let app = TestApp::spawn(backend);

        let response = app.post_order(None, &order_body("Widget", 2, "9.99"));

        assert_key_refused(&response, MISSING_KEY_DETAIL);
        assert_eq!(response.json()["detail"], MISSING_KEY_DETAIL);
        assert_eq!(app.order_count(), 0);
        assert_eq!(app.ledger_count(), 0);
    }

    fn atk_02_an_empty_or_whitespace_only_key_is_refused_and_creates_nothing(backend) {
        let app = TestApp::spawn(backend);

        for key in ["", " ", "   ", "\t", " \t "] {
            let response = app.post_order(Some(key), &order_body("Widget", 2, "9.99"));

            assert_key_refused(&response, MISSING_KEY_DETAIL);
            assert_eq!(response.json()["detail"], MISSING_KEY_DETAIL, "key {key:?}");
        }
        assert_eq!(app.order_count(), 0);
        assert_eq!(app.ledger_count(), 0);
    }

    fn atk_03_replaying_a_key_with_a_changed_body_is_a_conflict_and_the_original_order_is_unchanged(backend) {
        let app = TestApp::spawn(backend);
        let created = app.post_order(Some("atk-03"), &order_body("Widget", 2, "9.99"));
        assert_eq!(created.status, 201, "{}", created.body);
        let id = id_of(&created);

        let tampered = app.post_order(Some("atk-03"), &order_body("Widget", 99, "0.01"));

        assert_problem(
            &tampered,
            409,
            "IDEMPOTENCY_KEY_REUSED_WITH_DIFFERENT_PAYLOAD",
        );
        assert_eq!(app.order_count(), 1, "no new order");
        assert_eq!(
            stored_order(&app, "alice", &id),
            Some(created.json()),
            "the original order is unchanged"
        );
        let read = app.call("GET", &format!("/v1/orders/{id}"), None, None);
        assert_eq!(read.json()["quantity"], 2);
        assert_eq!(raw_member(&read.body, "price"), "9.99");
        assert_eq!(raw_member(&read.body, "total_price"), "19.98");
    }

    fn atk_04_two_different_keys_create_two_orders_by_design(backend) {
        let app = TestApp::spawn(backend);
        let body = order_body("Widget", 2, "9.99");

        let first = app.post_order(Some("atk-04-a"), &body);
        let second = app.post_order(Some("atk-04-b"), &body);

        assert_eq!(first.status, 201, "{}", first.body);
        assert_eq!(second.status, 201, "{}", second.body);
        assert_not_replayed(&second);
        assert_ne!(id_of(&first), id_of(&second));
        assert_ne!(first.header("Location"), second.header("Location"));
        assert_eq!(app.order_count(), 2);
    }

    fn atk_06_a_negative_quantity_is_refused_and_creates_nothing(backend) {
        let app = TestApp::spawn(backend);
        assert_refused_without_trace(
            &app,
            "atk-06",
            &order_body("Widget", -1, "9.99"),
            &["quantity"],
        );
        assert_refused_without_trace(
            &app,
            "atk-06",
            &order_body("Widget", -1_000_000, "9.99"),
            &["quantity"],
        );
    }

    fn atk_07_a_zero_quantity_is_refused_and_creates_nothing(backend) {
        let app = TestApp::spawn(backend);
        assert_refused_without_trace(
            &app,
            "atk-07",
            &order_body("Widget", 0, "9.99"),
            &["quantity"],
        );
    }

    fn atk_08_a_missing_item_or_other_required_field_is_refused_and_creates_nothing(backend) {
        let app = TestApp::spawn(backend);
        assert_refused_without_trace(&app, "atk-08", r#"{"quantity":2,"price":9.99}"#, &["item"]);
        assert_refused_without_trace(
            &app,
            "atk-08",
            r#"{"item":"Widget","price":9.99}"#,
            &["quantity"],
        );
        assert_refused_without_trace(
            &app,
            "atk-08",
            r#"{"item":"Widget","quantity":2}"#,
            &["price"],
        );
        assert_refused_without_trace(&app, "atk-08", "{}", &["item", "quantity", "price"]);
    }

    fn atk_09_a_cross_origin_form_post_is_refused_and_foreign_origins_get_no_cors_grant(backend) {
        let app = TestApp::spawn(backend);
        let auth = format!("Bearer {}", app.token);

        for content_type in [
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
            "text/plain",
        ] {
            let form = app.request(
                "POST",
                "/v1/orders",
                &[
                    ("Authorization", auth.as_str()),
                    ("Idempotency-Key", "atk-09"),
                    ("Origin", FOREIGN_ORIGIN),
                    ("Content-Type", content_type),
                ],
                Some("item=Widget&quantity=2&price=9.99"),
            );
            assert_problem(&form, 415, "UNSUPPORTED_MEDIA_TYPE");
            assert_eq!(
                form.header("Access-Control-Allow-Origin"),
                None,
                "{content_type}"
            );
        }

        let preflight = app.request(
            "OPTIONS",
            "/v1/orders",
            &[
                ("Origin", FOREIGN_ORIGIN),
                ("Access-Control-Request-Method", "POST"),
                (
                    "Access-Control-Request-Headers",
                    "authorization, content-type, idempotency-key",
                ),
            ],
            None,
        );
        assert!(preflight.status < 500, "{}", preflight.status);
        if preflight.status >= 400 {
            assert_eq!(
                preflight.header("Content-Type"),
                Some("application/problem+json"),
                "a refused preflight is a problem like every other error: {}",
                preflight.body
            );
        }
        assert_eq!(preflight.header("Access-Control-Allow-Origin"), None);
        assert_eq!(preflight.header("Access-Control-Allow-Methods"), None);

        let json_post = app.request(
            "POST",
            "/v1/orders",
            &[
                ("Authorization", auth.as_str()),
                ("Idempotency-Key", "atk-09-json"),
                ("Origin", FOREIGN_ORIGIN),
                ("Content-Type", "application/json"),
            ],
            Some(&order_body("Widget", 2, "9.99")),
        );
        assert_eq!(
            json_post.header("Access-Control-Allow-Origin"),
            None,
            "a browser may not read it"
        );
        assert_eq!(
            app.order_count(),
            1,
            "only the JSON request created an order"
        );
    }

    fn atk_09_an_allowed_origin_does_get_the_cors_grant(backend) {
        let app = TestApp::spawn_with(backend, |settings| {
            settings.cors_allowed_origins = vec![SHOP_ORIGIN.into()];
        });

        let preflight = app.request(
            "OPTIONS",
            "/v1/orders",
            &[
                ("Origin", SHOP_ORIGIN),
                ("Access-Control-Request-Method", "POST"),
                (
                    "Access-Control-Request-Headers",
                    "authorization, content-type, idempotency-key",
                ),
            ],
            None,
        );
        assert!(
            (200..300).contains(&preflight.status),
            "{} {}",
            preflight.status,
            preflight.body
        );
        assert_eq!(
            preflight.header("Access-Control-Allow-Origin"),
            Some(SHOP_ORIGIN)
        );
        let allowed = preflight
            .header("Access-Control-Allow-Methods")
            .unwrap_or_default()
            .to_ascii_uppercase();
        assert!(allowed.contains("POST"), "{allowed}");
        let headers = preflight
            .header("Access-Control-Allow-Headers")
            .unwrap_or_default()
            .to_ascii_lowercase();
        assert!(headers.contains("idempotency-key"), "{headers}");

        let foreign = app.request(
            "OPTIONS",
            "/v1/orders",
            &[
                ("Origin", FOREIGN_ORIGIN),
                ("Access-Control-Request-Method", "POST"),
            ],
            None,
        );
        assert!(foreign.status < 500, "{}", foreign.status);
        assert_eq!(foreign.header("Access-Control-Allow-Origin"), None);

        let auth = format!("Bearer {}", app.token);
        let created = app.request(
            "POST",
            "/v1/orders",
            &[
                ("Authorization", auth.as_str()),
                ("Idempotency-Key", "atk-09-shop"),
                ("Origin", SHOP_ORIGIN),
                ("Content-Type", "application/json"),
            ],
            Some(&order_body("Widget", 2, "9.99")),
        );
        assert_eq!(created.status, 201, "{}", created.body);
        assert_eq!(
            created.header("Access-Control-Allow-Origin"),
            Some(SHOP_ORIGIN)
        );
        let exposed = created
            .header("Access-Control-Expose-Headers")
            .unwrap_or_default()
            .to_ascii_lowercase();
        assert!(
            exposed.contains("location") && exposed.contains("idempotent-replayed"),
            "{exposed}"
        );
    }

    fn atk_10_a_negative_price_is_refused_and_creates_nothing(backend) {
        let app = TestApp::spawn(backend);
        assert_refused_without_trace(
            &app,
            "atk-10",
            &order_body("Widget", 2, "-0.01"),
            &["price"],
        );
        assert_refused_without_trace(
            &app,
            "atk-10",
            &order_body("Widget", 2, "-9.99"),
            &["price"],
        );
    }

    fn atk_11_a_quantity_given_as_a_string_or_a_float_is_refused_and_creates_nothing(backend) {
        let app = TestApp::spawn(backend);
        for quantity in [r#""2""#, "2.5", "2.0"] {
            let body = format!(r#"{{"item":"Widget","quantity":{quantity},"price":9.99}}"#);
            assert_refused_without_trace(&app, "atk-11", &body, &["quantity"]);
        }
    }

    fn atk_12_sql_in_the_key_is_an_opaque_key_and_the_tables_are_intact(backend) {
        let app = TestApp::spawn(backend);
        let body = order_body("Widget", 2, "9.99");
        let mut keys = vec!["'; DROP TABLE orders; --".to_owned()];
        keys.push(r#"x' OR '1'='1"#.to_owned());
        keys.push(r#"\"); DELETE FROM idempotency_ledger; --"#.to_owned());

        for key in &keys {
            let created = app.post_order(Some(key), &body);
            assert_eq!(created.status, 201, "key {key:?}: {}", created.body);
            let replay = app.post_order(Some(key), &body);
            assert_replay_of(&created, &replay);
        }

        assert_eq!(
            app.order_count(),
            keys.len() as i64,
            "one order per key, tables intact"
        );
        assert_eq!(app.ledger_count(), keys.len() as i64);
        let list = app.call("GET", "/v1/orders", None, None);
        assert_eq!(list.status, 200);
        assert_eq!(
            list.json()["data"].as_array().map(Vec::len),
            Some(keys.len())
        );
    }
}
