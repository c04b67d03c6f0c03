//! CONTRACT §3: reading, listing, changing and cancelling orders, and `PUT`.

use std::collections::HashSet;

use diesel::connection::SimpleConnection;
use serde_json::Value;

use crate::both_backends;
use crate::expect::*;
use crate::helpers::*;

/// Creates `n` orders for the token's user and returns their ids, oldest first.
fn create_orders(app: &TestApp, token: &str, n: usize, prefix: &str) -> Vec<String> {
    (0..n)
        .map(|i| {
            let body = order_body(&format!("{prefix} {i}"), i as i64 + 1, "1.25");
            let created = app.call_as(
                token,
                "POST",
                "/v1/orders",
                Some(&format!("{prefix}-{i}")),
                Some(&body),
            );
            assert_eq!(created.status, 201, "{}", created.body);
            id_of(&created)
        })
        .collect()
}

fn page(app: &TestApp, query: &str) -> (Vec<String>, Value) {
    page_as(app, &app.token, query)
}

fn page_as(app: &TestApp, token: &str, query: &str) -> (Vec<String>, Value) {
    let response = app.call_as(token, "GET", &format!("/v1/orders{query}"), None, None);
    assert_eq!(response.status, 200, "{query}: {}", response.body);
    assert_eq!(response.header("Content-Type"), Some("application/json"));
    let json = response.json();
    let ids = json["data"]
        .as_array()
        .unwrap_or_else(|| panic!("no data in {}", response.body))
        .iter()
        .map(|o| o["id"].as_str().expect("id").to_owned())
        .collect();
    (ids, json["next_cursor"].clone())
}

/// Walks every page with `limit` and returns the ids in order.
fn walk(app: &TestApp, limit: u32) -> (Vec<String>, usize) {
    let mut ids = Vec::new();
    let mut pages = 0;
    let mut query = format!("?limit={limit}");
    loop {
        let (page_ids, next) = page(app, &query);
        pages += 1;
        assert!(page_ids.len() <= limit as usize);
        ids.extend(page_ids);
        match next.as_str() {
            Some(cursor) => query = format!("?limit={limit}&cursor={cursor}"),
            None => {
                assert!(next.is_null(), "next_cursor is a string or null: {next}");
                break;
            }
        }
        assert!(pages < 100, "pagination does not end");
    }
    (ids, pages)
}

/// Runs `sql` against the app's database with the table's `CHECK`
/// constraints out of the way, as a tampered database would be.
fn bypass_checks(app: &TestApp, sql: &str) {
    let mut pooled = app.pool.get().expect("connection");
    match pooled.conn() {
        orders_api::db::Conn::Sqlite(c) => c.batch_execute(&format!(
            "PRAGMA ignore_check_constraints = ON; {sql}; PRAGMA ignore_check_constraints = OFF;"
        )),
        orders_api::db::Conn::Postgres(c) => c.batch_execute(&format!(
            "DO $$ DECLARE c text; BEGIN FOR c IN SELECT conname FROM pg_constraint \
             WHERE conrelid = 'orders'::regclass AND contype = 'c' LOOP \
             EXECUTE format('ALTER TABLE orders DROP CONSTRAINT %I', c); END LOOP; END $$; {sql}"
        )),
    }
    .expect("tamper with the order");
}

both_backends! {
    fn an_order_is_read_back_as_created_with_its_server_computed_total(backend) {
        let app = TestApp::spawn(backend);
        let created = app.post_order(Some("read"), &order_body("Widget", 2, "9.99"));
        assert_eq!(created.status, 201, "{}", created.body);

        let read = app.call(
            "GET",
            created.header("Location").expect("Location"),
            None,
            None,
        );

        assert_eq!(read.status, 200);
        assert_eq!(read.header("Content-Type"), Some("application/json"));
        assert_eq!(read.json(), created.json());
        let order = read.json();
        assert_eq!(order["item"], "Widget");
        assert_eq!(order["quantity"], 2);
        assert_eq!(order["status"], "pending");
        assert_eq!(raw_member(&read.body, "price"), "9.99");
        assert_eq!(raw_member(&read.body, "total_price"), "19.98");
        assert!(uuid::Uuid::parse_str(order["id"].as_str().expect("id")).is_ok());
        let created_at = order["created_at"].as_str().expect("created_at");
        assert!(
            chrono::DateTime::parse_from_rfc3339(created_at).is_ok(),
            "{created_at}"
        );
    }

    fn a_stored_order_that_breaks_a_rule_is_answered_500_without_internals(backend) {
        let app = TestApp::spawn(backend);
        let created = app.post_order(Some("kept"), &order_body("Widget", 2, "9.99"));
        assert_eq!(created.status, 201, "{}", created.body);
        let path = created.header("Location").expect("Location").to_owned();
        let id = id_of(&created);
        let fine = "item = 'Widget', quantity = 2, price_cents = 999, status = 'pending'";
        for tampering in [
            "quantity = 0",
            "quantity = 1000001",
            "price_cents = -1",
            "price_cents = 100000000001",
            "status = 'shipped'",
            "item = ''",
            "item = ' Widget'",
            "item = 'Wid\nget'",
        ] {
            bypass_checks(&app, &format!("UPDATE orders SET {fine}; UPDATE orders SET {tampering}"));
            for read in [
                app.call("GET", &path, None, None),
                app.call("GET", "/v1/orders", None, None),
            ] {
                assert_problem(&read, 500, "INTERNAL_ERROR");
                for internal in [id.as_str(), "quantity", "price_cents", "item", "shipped", "invalid"] {
                    assert!(!read.body.contains(internal), "{tampering}: {}", read.body);
                }
            }
        }
        bypass_checks(&app, &format!("UPDATE orders SET {fine}"));
        let read = app.call("GET", &path, None, None);
        assert_eq!(read.status, 200, "{}", read.body);
        assert_eq!(read.json(), created.json(), "read back exactly as created");
    }

    fn an_unknown_or_malformed_order_id_is_a_404(backend) {
        let app = TestApp::spawn(backend);

        for path in [
            "/v1/orders/0193a8e4-8f3c-7cc2-9d6a-5b1f2e3d4c5b",
            "/v1/orders/not-a-uuid",
            "/v1/orders/1%27%20OR%201=1",
        ] {
            assert_problem(&app.call("GET", path, None, None), 404, "NOT_FOUND");
        }
        assert_problem(
            &app.call("GET", "/v1/nothing-here", None, None),
            404,
            "NOT_FOUND",
        );
    }

    fn a_patch_changes_the_given_fields_and_recomputes_the_total(backend) {
        let app = TestApp::spawn(backend);
        let created = app.post_order(Some("create"), &order_body("Widget", 2, "9.99"));
        let path = created.header("Location").expect("Location").to_owned();

        let quantity = app.call("PATCH", &path, Some("p1"), Some(r#"{"quantity":3}"#));
        assert_eq!(quantity.status, 200, "{}", quantity.body);
        assert_eq!(quantity.header("Content-Type"), Some("application/json"));
        assert_eq!(quantity.json()["quantity"], 3);
        assert_eq!(quantity.json()["item"], "Widget");
        assert_eq!(raw_member(&quantity.body, "total_price"), "29.97");

        let all = app.call(
            "PATCH",
            &path,
            Some("p2"),
            Some(r#"{"item":" Gadget ","price":0.10,"quantity":3}"#),
        );
        assert_eq!(all.status, 200, "{}", all.body);
        assert_eq!(all.json()["item"], "Gadget");
        assert_eq!(raw_member(&all.body, "price"), "0.10");
        let total = raw_member(&all.body, "total_price");
        assert!(total == "0.30" || total == "0.3", "{total}");

        let stored = stored_order(&app, "alice", &id_of(&created)).expect("order");
        assert_eq!(stored, all.json());
        assert_eq!(stored["id"], created.json()["id"]);
        assert_eq!(stored["created_at"], created.json()["created_at"]);
        assert_eq!(app.order_count(), 1);
    }

    fn a_patch_needs_at_least_one_valid_field(backend) {
        let app = TestApp::spawn(backend);
        let created = app.post_order(Some("create"), &order_body("Widget", 2, "9.99"));
        let path = created.header("Location").expect("Location").to_owned();

        let empty = app.call("PATCH", &path, Some("empty"), Some("{}"));
        assert_problem(&empty, 422, "VALIDATION_FAILED");
        assert_invalid_fields(
            &app.call("PATCH", &path, Some("bad"), Some(r#"{"quantity":1.0}"#)),
            &["quantity"],
        );
        assert_invalid_fields(
            &app.call(
                "PATCH",
                &path,
                Some("bad"),
                Some(r#"{"status":"cancelled"}"#),
            ),
            &["status"],
        );
        assert_invalid_fields(
            &app.call("PATCH", &path, Some("bad"), Some(r#"{"total_price":1}"#)),
            &["total_price"],
        );
        assert_invalid_fields(
            &app.call(
                "PATCH",
                &path,
                Some("bad"),
                Some(r#"{"price":-1,"item":""}"#),
            ),
            &["price", "item"],
        );
        assert_key_refused(
            &app.call("PATCH", &path, None, Some(r#"{"quantity":3}"#)),
            MISSING_KEY_DETAIL,
        );

        assert_eq!(
            stored_order(&app, "alice", &id_of(&created)),
            Some(created.json())
        );
        assert_eq!(app.ledger_count(), 1, "only the POST was recorded");
    }

    fn a_patch_of_a_cancelled_order_is_an_order_not_pending_conflict(backend) {
        let app = TestApp::spawn(backend);
        let created = app.post_order(Some("create"), &order_body("Widget", 2, "9.99"));
        let path = created.header("Location").expect("Location").to_owned();
        let cancelled = app.call("DELETE", &path, Some("cancel"), None);
        assert_eq!(cancelled.status, 200, "{}", cancelled.body);

        let patch = app.call("PATCH", &path, Some("too-late"), Some(r#"{"quantity":5}"#));

        assert_problem(&patch, 409, "ORDER_NOT_PENDING");
        let stored = stored_order(&app, "alice", &id_of(&created)).expect("order");
        assert_eq!(stored["quantity"], 2);
        assert_eq!(stored["status"], "cancelled");
    }

    fn a_retried_patch_replays_its_first_answer_and_does_not_undo_a_later_change(backend) {
        let app = TestApp::spawn(backend);
        let created = app.post_order(Some("create"), &order_body("Widget", 2, "9.99"));
        let path = created.header("Location").expect("Location").to_owned();

        let first = app.call("PATCH", &path, Some("patch-a"), Some(r#"{"quantity":3}"#));
        assert_eq!(first.status, 200, "{}", first.body);
        let later = app.call("PATCH", &path, Some("patch-b"), Some(r#"{"quantity":4}"#));
        assert_eq!(later.status, 200, "{}", later.body);
        let retry = app.call("PATCH", &path, Some("patch-a"), Some(r#"{"quantity":3}"#));

        assert_replay_of(&first, &retry);
        assert_eq!(
            retry.json()["quantity"],
            3,
            "the replay shows the first answer"
        );
        assert_eq!(
            stored_order(&app, "alice", &id_of(&created)).expect("order")["quantity"],
            4,
            "nothing ran again"
        );
        let reused = app.call("PATCH", &path, Some("patch-a"), Some(r#"{"quantity":9}"#));
        assert_problem(
            &reused,
            409,
            "IDEMPOTENCY_KEY_REUSED_WITH_DIFFERENT_PAYLOAD",
        );
        assert_eq!(
            stored_order(&app, "alice", &id_of(&created)).expect("order")["quantity"],
            4
        );
    }

    fn a_delete_cancels_an_order_without_a_body_and_cancelling_twice_is_a_no_op(backend) {
        let app = TestApp::spawn(backend);
        let created = app.post_order(Some("create"), &order_body("Widget", 2, "9.99"));
        let path = created.header("Location").expect("Location").to_owned();

        let auth = format!("Bearer {}", app.token);
        let cancelled = app.request(
            "DELETE",
            &path,
            &[
                ("Authorization", auth.as_str()),
                ("Idempotency-Key", "cancel-1"),
            ],
            None,
        );
        assert_eq!(cancelled.status, 200, "{}", cancelled.body);
        assert_eq!(cancelled.header("Content-Type"), Some("application/json"));
        assert_eq!(cancelled.json()["status"], "cancelled");
        assert_eq!(cancelled.json()["id"], created.json()["id"]);
        assert_eq!(cancelled.json()["quantity"], 2);

        let again = app.call("DELETE", &path, Some("cancel-2"), None);
        assert_eq!(again.status, 200, "{}", again.body);
        assert_not_replayed(&again);
        assert_eq!(again.json()["status"], "cancelled");

        let read = app.call("GET", &path, None, None);
        assert_eq!(read.json()["status"], "cancelled");
        assert_eq!(app.order_count(), 1, "a cancelled order is kept");
    }

    fn a_retried_delete_replays_its_answer(backend) {
        let app = TestApp::spawn(backend);
        let created = app.post_order(Some("create"), &order_body("Widget", 2, "9.99"));
        let path = created.header("Location").expect("Location").to_owned();

        let first = app.call("DELETE", &path, Some("cancel"), None);
        let retry = app.call("DELETE", &path, Some("cancel"), None);

        assert_eq!(first.status, 200, "{}", first.body);
        assert_replay_of(&first, &retry);
        assert_eq!(app.ledger_count(), 2);
    }

    fn a_delete_needs_a_key_and_a_body_it_is_sent_must_be_json(backend) {
        let app = TestApp::spawn(backend);
        let created = app.post_order(Some("create"), &order_body("Widget", 2, "9.99"));
        let path = created.header("Location").expect("Location").to_owned();
        let auth = format!("Bearer {}", app.token);

        assert_key_refused(&app.call("DELETE", &path, None, None), MISSING_KEY_DETAIL);
        let form = app.request(
            "DELETE",
            &path,
            &[
                ("Authorization", auth.as_str()),
                ("Idempotency-Key", "d"),
                ("Content-Type", "application/x-www-form-urlencoded"),
            ],
            Some("confirm=yes"),
        );
        assert_problem(&form, 415, "UNSUPPORTED_MEDIA_TYPE");
        assert_problem(
            &app.call("DELETE", &path, Some("d"), Some("{")),
            400,
            "MALFORMED_JSON",
        );

        assert_eq!(
            stored_order(&app, "alice", &id_of(&created)).expect("order")["status"],
            "pending"
        );
        assert_eq!(app.ledger_count(), 1);
    }

    fn a_put_is_a_405_with_allow_after_authentication_and_changes_nothing(backend) {
        let app = TestApp::spawn(backend);
        let created = app.post_order(Some("create"), &order_body("Widget", 2, "9.99"));
        let path = created.header("Location").expect("Location").to_owned();
        let replacement = order_body("Gadget", 9, "1.00");

        let on_order = app.call("PUT", &path, Some("put-1"), Some(&replacement));
        let on_collection = app.call("PUT", "/v1/orders", Some("put-2"), Some(&replacement));
        let without_key = app.call("PUT", &path, None, Some(&replacement));
        let unauthenticated = app.request(
            "PUT",
            &path,
            &[
                ("Idempotency-Key", "put-3"),
                ("Content-Type", "application/json"),
            ],
            Some(&replacement),
        );

        assert_problem(&on_order, 405, "METHOD_NOT_ALLOWED");
        let allow = on_order.header("Allow").expect("Allow").to_owned();
        for method in ["GET", "PATCH", "DELETE"] {
            assert!(allow.contains(method), "{allow}");
        }
        assert!(!allow.contains("PUT"), "{allow}");
        assert_problem(&on_collection, 405, "METHOD_NOT_ALLOWED");
        let allow = on_collection.header("Allow").expect("Allow").to_owned();
        assert!(
            allow.contains("GET") && allow.contains("POST") && !allow.contains("PUT"),
            "{allow}"
        );
        assert_problem(&without_key, 405, "METHOD_NOT_ALLOWED");
        assert_problem(&unauthenticated, 401, "UNAUTHORIZED");
        assert_eq!(unauthenticated.header("Allow"), None);

        assert_eq!(
            stored_order(&app, "alice", &id_of(&created)),
            Some(created.json())
        );
        assert_eq!(app.order_count(), 1);
        assert_eq!(app.ledger_count(), 1);
    }

    fn the_list_shows_the_callers_orders_newest_first(backend) {
        let app = TestApp::spawn(backend);
        let bob = app.create_token("bob");
        let mine = create_orders(&app, &app.token, 5, "mine");
        create_orders(&app, &bob, 3, "bobs");

        let (ids, next) = page(&app, "");

        let newest_first: Vec<String> = mine.iter().rev().cloned().collect();
        assert_eq!(ids, newest_first);
        assert!(next.is_null(), "{next}");
    }

    fn the_list_pages_through_every_order_once_without_gaps(backend) {
        let app = TestApp::spawn(backend);
        let created = create_orders(&app, &app.token, 7, "o");
        let newest_first: Vec<String> = created.iter().rev().cloned().collect();

        for limit in [1, 2, 3, 7, 100] {
            let (ids, pages) = walk(&app, limit);
            assert_eq!(ids, newest_first, "limit {limit}");
            assert_eq!(
                pages,
                7_usize.div_ceil(limit as usize).max(1),
                "limit {limit}"
            );
        }
        let (first, next) = page(&app, "?limit=3");
        assert_eq!(first.len(), 3);
        assert!(next.is_string());
        let (_, last) = page(&app, "?limit=7");
        assert!(
            last.is_null(),
            "an exactly full last page has no next cursor: {last}"
        );
    }

    fn a_new_order_between_pages_causes_no_duplicates_or_gaps(backend) {
        let app = TestApp::spawn(backend);
        let created = create_orders(&app, &app.token, 5, "o");

        let (first, next) = page(&app, "?limit=2");
        let late = create_orders(&app, &app.token, 1, "late");
        let (second, next) = page(
            &app,
            &format!("?limit=2&cursor={}", next.as_str().expect("cursor")),
        );
        let (third, last) = page(
            &app,
            &format!("?limit=2&cursor={}", next.as_str().expect("cursor")),
        );

        let seen: Vec<String> = first.into_iter().chain(second).chain(third).collect();
        let expected: Vec<String> = created.iter().rev().cloned().collect();
        assert_eq!(seen, expected);
        assert!(last.is_null());
        let unique: HashSet<&String> = seen.iter().collect();
        assert_eq!(unique.len(), seen.len());
        let (fresh, _) = page(&app, "?limit=1");
        assert_eq!(fresh, late, "the newest order leads a fresh listing");
    }

    fn the_list_defaults_to_20_orders_a_page(backend) {
        let app = TestApp::spawn(backend);
        let created = create_orders(&app, &app.token, 21, "o");

        let (ids, next) = page(&app, "");
        assert_eq!(ids.len(), 20);
        assert_eq!(ids[0], created[20]);
        let (rest, last) = page(&app, &format!("?cursor={}", next.as_str().expect("cursor")));
        assert_eq!(rest, vec![created[0].clone()]);
        assert!(last.is_null());
    }

    fn bad_list_parameters_are_a_400(backend) {
        let app = TestApp::spawn(backend);
        create_orders(&app, &app.token, 2, "o");

        for query in [
            "?limit=0",
            "?limit=101",
            "?limit=abc",
            "?limit=-1",
            "?limit=1.5",
            "?limit=",
            "?limit=99999999999999999999",
            "?cursor=abc",
            "?cursor=not-a-cursor",
            "?cursor=%27%20OR%201%3D1%20--",
            "?cursor=",
            "?cursor=zzzzzzzzzzzzzzzz",
            "?limit=2&cursor=%FF%FE",
        ] {
            let response = app.call("GET", &format!("/v1/orders{query}"), None, None);
            assert_problem(&response, 400, "VALIDATION_FAILED");
        }
        let (ids, _) = page(&app, "?limit=100");
        assert_eq!(ids.len(), 2);
    }

    fn a_well_formed_cursor_the_server_never_issued_to_this_user_is_refused(backend) {
        let app = TestApp::spawn(backend);
        create_orders(&app, &app.token, 3, "mine");
        let bob = app.create_token("bob");
        create_orders(&app, &bob, 3, "bobs");
        let (_, bobs_cursor) = page_as(&app, &bob, "?limit=1");
        let bobs_cursor = bobs_cursor.as_str().expect("bob has more pages").to_owned();

        // Bob's cursor is real, but not alice's; a made-up one of the same shape is no one's.
        let forged = "0".repeat(31) + "1";
        for cursor in [bobs_cursor.as_str(), forged.as_str()] {
            let response = app.call("GET", &format!("/v1/orders?cursor={cursor}"), None, None);
            assert_problem(&response, 400, "VALIDATION_FAILED");
        }
        // Bob's own cursor still works for bob, exactly as issued: its
        // uppercase spelling names the same order but was never issued.
        let (rest, _) = page_as(&app, &bob, &format!("?cursor={bobs_cursor}"));
        assert_eq!(rest.len(), 2);
        let respelled = bobs_cursor.to_ascii_uppercase();
        if respelled != bobs_cursor {
            let path = format!("/v1/orders?cursor={respelled}");
            let response = app.call_as(&bob, "GET", &path, None, None);
            assert_problem(&response, 400, "VALIDATION_FAILED");
        }
    }
}
