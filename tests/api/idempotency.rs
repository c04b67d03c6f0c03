//! CONTRACT §4: the key's rules, what counts as the same request, what a replay
//! carries, and what becomes of a key after the purge.

use std::time::Duration;

use crate::both_backends;
use crate::expect::*;
use crate::helpers::*;

fn post_with_headers(app: &TestApp, extra: &[(&str, &str)], body: &str) -> TestResponse {
    let auth = format!("Bearer {}", app.token);
    let mut headers = vec![
        ("Authorization", auth.as_str()),
        ("Content-Type", "application/json"),
    ];
    headers.extend_from_slice(extra);
    app.request("POST", "/v1/orders", &headers, Some(body))
}

/// Runs `sql` on the test's database, outside the server.
fn outside(app: &TestApp, sqlite: &str, postgres: &str) {
    use diesel::connection::SimpleConnection;
    let mut pooled = app.pool.get().expect("a connection");
    match pooled.conn() {
        orders_api::db::Conn::Sqlite(c) => c.batch_execute(sqlite),
        orders_api::db::Conn::Postgres(c) => c.batch_execute(postgres),
    }
    .expect("the test's own SQL");
}

both_backends! {
    /// CONTRACT §4: a 5xx is never recorded. The change fails in the
    /// database (a trigger refuses an update to quantity 13): the answer is
    /// a 5xx without internals, nothing is recorded, and the same request
    /// sent again once the database accepts it runs — it is not a replay of
    /// the failure.
    fn a_change_that_fails_with_a_5xx_records_nothing_and_its_retry_runs(backend) {
        let app = TestApp::spawn(backend);
        let created = app.post_order(Some("made"), &order_body("Widget", 1, "1"));
        assert_eq!(created.status, 201, "{}", created.body);
        let path = format!("/v1/orders/{}", created.json()["id"].as_str().expect("an id"));
        outside(
            &app,
            "CREATE TRIGGER refuse_13 BEFORE UPDATE ON orders WHEN NEW.quantity = 13 \
             BEGIN SELECT RAISE(ABORT, 'refused by the test'); END;",
            "CREATE FUNCTION refuse_13() RETURNS trigger LANGUAGE plpgsql AS $$ \
             BEGIN RAISE EXCEPTION 'refused by the test'; END $$; \
             CREATE TRIGGER refuse_13 BEFORE UPDATE ON orders FOR EACH ROW \
             WHEN (NEW.quantity = 13) EXECUTE FUNCTION refuse_13();",
        );
        let patch = Some(r#"{"quantity":13}"#);

        let failed = app.call("PATCH", &path, Some("thirteen"), patch);
        assert!(failed.status >= 500, "{} {}", failed.status, failed.body);
        assert!(!failed.body.contains("refused by the test"), "{}", failed.body);
        assert_eq!(app.ledger_count(), 1, "only the create's entry");

        outside(&app, "DROP TRIGGER refuse_13;", "DROP TRIGGER refuse_13 ON orders;");
        let retried = app.call("PATCH", &path, Some("thirteen"), patch);
        assert_eq!(retried.status, 200, "{}", retried.body);
        assert_not_replayed(&retried);
        assert_eq!(retried.json()["quantity"], 13);
        assert_eq!(app.ledger_count(), 2);
    }

    fn a_key_sent_twice_is_refused_with_a_detail_that_says_so(backend) {
        let app = TestApp::spawn(backend);

        let same = post_with_headers(
            &app,
            &[("Idempotency-Key", "k1"), ("Idempotency-Key", "k1")],
            &order_body("Widget", 1, "1"),
        );
        let different = post_with_headers(
            &app,
            &[("Idempotency-Key", "k1"), ("Idempotency-Key", "k2")],
            &order_body("Widget", 1, "1"),
        );

        assert_key_refused(&same, "only once");
        assert_key_refused(&different, "only once");
        assert_eq!(app.order_count(), 0);
        assert_eq!(app.ledger_count(), 0);
    }

    fn a_key_with_characters_outside_printable_ascii_is_refused_with_a_detail_that_says_so(backend) {
        let app = TestApp::spawn(backend);

        let tab = app.post_order(Some("a\tb"), &order_body("Widget", 1, "1"));
        assert_key_refused(&tab, "printable ASCII");

        let raw_post = |key: &[u8]| {
            let mut head = format!("POST /v1/orders HTTP/1.1\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nIdempotency-Key: ", app.token).into_bytes();
            head.extend_from_slice(key);
            raw_request(&app, &head, order_body("Widget", 1, "1").as_bytes())
        };
        for key in ["cl\u{e9}".as_bytes(), "\u{1F600}".as_bytes(), b"\xff\xfe"] {
            let response = raw_post(key);
            assert_eq!(response.status, 400, "key {key:?}: {}", response.body);
            assert!(
                response.head.contains(PROBLEM_JSON),
                "key {key:?}: {}",
                response.head
            );
            assert!(
                response.body.contains("VALIDATION_FAILED"),
                "{}",
                response.body
            );
            assert!(
                response.body.contains("printable ASCII"),
                "{}",
                response.body
            );
        }
        // DEL is not even a valid header byte: the HTTP parser refuses the request.
        assert_eq!(raw_post(b"a\x7fb").status, 400);
        assert_eq!(app.order_count(), 0);
        assert_eq!(app.ledger_count(), 0);
    }

    fn a_key_over_255_characters_is_refused_and_one_of_exactly_255_is_accepted(backend) {
        let app = TestApp::spawn(backend);
        let body = order_body("Widget", 1, "1");

        let too_long = app.post_order(Some(&"k".repeat(256)), &body);
        assert_key_refused(&too_long, "255");
        let far_too_long = app.post_order(Some(&"k".repeat(4000)), &body);
        assert_key_refused(&far_too_long, "255");
        assert_eq!(app.order_count(), 0);

        let longest = "k".repeat(255);
        let created = app.post_order(Some(&longest), &body);
        assert_eq!(created.status, 201, "{}", created.body);
        let replay = app.post_order(Some(&longest), &body);
        assert_replay_of(&created, &replay);
        assert_eq!(app.order_count(), 1);
    }

    fn a_key_written_as_an_rfc_8941_string_is_the_same_key_unquoted(backend) {
        let app = TestApp::spawn(backend);
        let body = order_body("Widget", 1, "1");

        let quoted = app.post_order(Some("\"abc\""), &body);
        assert_eq!(quoted.status, 201, "{}", quoted.body);
        let bare = app.post_order(Some("abc"), &body);
        assert_replay_of(&quoted, &bare);

        let bare_first = app.post_order(Some("xyz"), &body);
        assert_eq!(bare_first.status, 201, "{}", bare_first.body);
        let quoted_later = app.post_order(Some("\"xyz\""), &body);
        assert_replay_of(&bare_first, &quoted_later);

        assert_eq!(app.order_count(), 2);
    }

    fn an_empty_quoted_key_is_a_missing_key(backend) {
        let app = TestApp::spawn(backend);

        for key in ["\"\"", "\"   \""] {
            let response = app.post_order(Some(key), &order_body("Widget", 1, "1"));
            assert_key_refused(&response, MISSING_KEY_DETAIL);
            assert_eq!(response.json()["detail"], MISSING_KEY_DETAIL);
        }
        assert_eq!(app.order_count(), 0);
    }

    fn the_same_key_used_by_two_users_is_two_unrelated_keys(backend) {
        let app = TestApp::spawn(backend);
        let bob = app.create_token("bob");
        let body = order_body("Widget", 2, "9.99");

        let alices = app.post_order(Some("shared-key"), &body);
        let bobs = app.call_as(&bob, "POST", "/v1/orders", Some("shared-key"), Some(&body));

        assert_eq!(alices.status, 201, "{}", alices.body);
        assert_eq!(bobs.status, 201, "bob's key is not alice's: {}", bobs.body);
        assert_not_replayed(&bobs);
        assert_ne!(id_of(&alices), id_of(&bobs));
        assert_eq!(app.order_count(), 2);
        assert_eq!(app.ledger_count(), 2);

        // A different body under bob's copy of the key conflicts only with bob's request.
        let bob_again = app.call_as(
            &bob,
            "POST",
            "/v1/orders",
            Some("shared-key"),
            Some(&order_body("Gadget", 1, "1")),
        );
        assert_problem(
            &bob_again,
            409,
            "IDEMPOTENCY_KEY_REUSED_WITH_DIFFERENT_PAYLOAD",
        );
        let alice_again = app.post_order(Some("shared-key"), &body);
        assert_replay_of(&alices, &alice_again);
    }

    fn a_replay_preserves_location_content_type_and_body_and_answers_200_for_a_201(backend) {
        let app = TestApp::spawn(backend);
        let body = order_body("Widget", 2, "9.99");

        let created = app.post_order(Some("replay-1"), &body);
        assert_eq!(created.status, 201, "{}", created.body);
        assert_eq!(created.header("Content-Type"), Some("application/json"));
        let location = created.header("Location").expect("Location").to_owned();
        assert_eq!(location, format!("/v1/orders/{}", id_of(&created)));
        assert_not_replayed(&created);

        for _ in 0..2 {
            let replay = app.post_order(Some("replay-1"), &body);
            assert_replay_of(&created, &replay);
            assert_eq!(replay.header("Location"), Some(location.as_str()));
            assert_eq!(replay.header_count("Location"), 1);
            assert_eq!(replay.header_count("Content-Type"), 1);
            assert_eq!(replay.header_count("Idempotent-Replayed"), 1);
            // Only the allow-listed headers are replayed: this answer's request id is its own.
            assert_eq!(replay.header_count("x-request-id"), 1);
            assert_ne!(
                replay.header("x-request-id"),
                created.header("x-request-id")
            );
        }
        assert_eq!(app.order_count(), 1);
        assert_eq!(app.ledger_count(), 1);
    }

    fn a_recorded_404_replays_with_the_same_status_and_body(backend) {
        let app = TestApp::spawn(backend);
        let path = "/v1/orders/0193a8e4-8f3c-7cc2-9d6a-5b1f2e3d4c5b";

        let first = app.call(
            "PATCH",
            path,
            Some("patch-missing"),
            Some(r#"{"quantity":3}"#),
        );
        assert_problem(&first, 404, "NOT_FOUND");
        assert_eq!(app.ledger_count(), 1, "a 404 after the claim is recorded");

        let replay = app.call(
            "PATCH",
            path,
            Some("patch-missing"),
            Some(r#"{"quantity":3}"#),
        );
        assert_replay_of(&first, &replay);
        assert_problem(&replay, 404, "NOT_FOUND");

        let first_delete = app.call("DELETE", path, Some("delete-missing"), None);
        assert_problem(&first_delete, 404, "NOT_FOUND");
        let replayed_delete = app.call("DELETE", path, Some("delete-missing"), None);
        assert_replay_of(&first_delete, &replayed_delete);
    }

    fn a_recorded_order_not_pending_conflict_replays_with_the_same_status_and_body(backend) {
        let app = TestApp::spawn(backend);
        let created = app.post_order(Some("create"), &order_body("Widget", 2, "9.99"));
        let path = created.header("Location").expect("Location").to_owned();
        assert_eq!(app.call("DELETE", &path, Some("cancel"), None).status, 200);

        let refused = app.call(
            "PATCH",
            &path,
            Some("late-patch"),
            Some(r#"{"quantity":5}"#),
        );
        assert_problem(&refused, 409, "ORDER_NOT_PENDING");
        let replay = app.call(
            "PATCH",
            &path,
            Some("late-patch"),
            Some(r#"{"quantity":5}"#),
        );

        assert_replay_of(&refused, &replay);
        assert_problem(&replay, 409, "ORDER_NOT_PENDING");
        assert_eq!(
            stored_order(&app, "alice", &id_of(&created)).expect("order")["quantity"],
            2
        );
    }

    fn member_order_and_whitespace_do_not_make_a_different_request(backend) {
        let app = TestApp::spawn(backend);

        let created = app.post_order(
            Some("canonical"),
            r#"{"item":"Widget","quantity":2,"price":9.99}"#,
        );
        assert_eq!(created.status, 201, "{}", created.body);
        let reordered = app.post_order(
            Some("canonical"),
            "{ \"price\" : 9.99,\n  \"quantity\": 2, \"item\" : \"Widget\" }\n",
        );

        assert_replay_of(&created, &reordered);
        assert_eq!(app.order_count(), 1);
    }

    fn a_key_reused_on_another_route_or_method_is_a_different_request(backend) {
        let app = TestApp::spawn(backend);
        let created = app.post_order(Some("one-key"), &order_body("Widget", 2, "9.99"));
        let path = created.header("Location").expect("Location").to_owned();

        let patch = app.call(
            "PATCH",
            &path,
            Some("one-key"),
            Some(&order_body("Widget", 2, "9.99")),
        );
        assert_problem(&patch, 409, "IDEMPOTENCY_KEY_REUSED_WITH_DIFFERENT_PAYLOAD");
        let delete = app.call("DELETE", &path, Some("one-key"), None);
        assert_problem(
            &delete,
            409,
            "IDEMPOTENCY_KEY_REUSED_WITH_DIFFERENT_PAYLOAD",
        );

        let order = stored_order(&app, "alice", &id_of(&created)).expect("order");
        assert_eq!(
            order["status"], "pending",
            "the refused DELETE cancelled nothing"
        );
        assert_eq!(app.ledger_count(), 1);
    }

    fn a_request_refused_before_the_ledger_leaves_its_key_unused(backend) {
        let app = TestApp::spawn_with(backend, |settings| settings.max_body_bytes = 256);
        let auth = format!("Bearer {}", app.token);
        let key = "refused-first";
        let form = app.request(
            "POST",
            "/v1/orders",
            &[
                ("Authorization", auth.as_str()),
                ("Idempotency-Key", key),
                ("Content-Type", "text/plain"),
            ],
            Some(&order_body("Widget", 1, "1")),
        );
        assert_problem(&form, 415, "UNSUPPORTED_MEDIA_TYPE");
        let big = format!(r#"{{"item":"{}","quantity":1,"price":1}}"#, "x".repeat(300));
        assert_problem(&app.post_order(Some(key), &big), 413, "PAYLOAD_TOO_LARGE");
        assert_problem(
            &app.post_order(Some(key), "{\"item\":"),
            400,
            "MALFORMED_JSON",
        );
        assert_problem(
            &app.post_order(
                Some(key),
                r#"{"item":"A","item":"B","quantity":1,"price":1}"#,
            ),
            400,
            "MALFORMED_JSON",
        );
        assert_invalid_fields(
            &app.post_order(Some(key), &order_body("Widget", 0, "1")),
            &["quantity"],
        );
        let unauthenticated = app.request(
            "POST",
            "/v1/orders",
            &[
                ("Idempotency-Key", key),
                ("Content-Type", "application/json"),
            ],
            Some(&order_body("Widget", 2, "9.99")),
        );
        assert_problem(&unauthenticated, 401, "UNAUTHORIZED");
        assert_eq!(app.ledger_count(), 0);
        assert_eq!(app.order_count(), 0);

        let created = app.post_order(Some(key), &order_body("Widget", 2, "9.99"));

        assert_eq!(
            created.status, 201,
            "the key was still free: {}",
            created.body
        );
        assert_not_replayed(&created);
        assert_eq!(app.order_count(), 1);
    }

    fn after_the_purge_a_post_still_finds_its_order_and_a_patch_key_is_new_again(backend) {
        let app = TestApp::spawn_with(backend, |settings| settings.retention_secs = 1);
        let body = order_body("Widget", 2, "9.99");
        let created = app.post_order(Some("purged-post"), &body);
        assert_eq!(created.status, 201, "{}", created.body);
        let path = created.header("Location").expect("Location").to_owned();
        let first_patch = app.call(
            "PATCH",
            &path,
            Some("purged-patch"),
            Some(r#"{"quantity":5}"#),
        );
        assert_eq!(first_patch.status, 200, "{}", first_patch.body);
        let later_patch = app.call(
            "PATCH",
            &path,
            Some("later-patch"),
            Some(r#"{"quantity":7}"#),
        );
        assert_eq!(later_patch.status, 200, "{}", later_patch.body);
        // Before the purge a retry of the first patch only replays.
        let retried = app.call(
            "PATCH",
            &path,
            Some("purged-patch"),
            Some(r#"{"quantity":5}"#),
        );
        assert_replay_of(&first_patch, &retried);
        assert_eq!(
            stored_order(&app, "alice", &id_of(&created)).expect("order")["quantity"],
            7
        );
        assert_eq!(app.ledger_count(), 3);

        // Past the retention of the newest entry; the background purge (every
        // 300 s) has not run, so the entries are still there until we purge.
        std::thread::sleep(Duration::from_millis(1_500));
        let purged = orders_api::startup::purge_all(&app.pool).expect("purge");

        assert_eq!(purged, 3);
        assert_eq!(app.ledger_count(), 0);

        // The POST key is still guarded by the order row: a replay of the order as it is now.
        let replay = app.post_order(Some("purged-post"), &body);
        assert_eq!(replay.status, 200, "{}", replay.body);
        assert_eq!(replay.header("Idempotent-Replayed"), Some("true"));
        assert_eq!(replay.header("Location"), Some(path.as_str()));
        assert_eq!(replay.header("Content-Type"), Some("application/json"));
        assert_eq!(
            replay.json(),
            stored_order(&app, "alice", &id_of(&created)).expect("order")
        );
        assert_eq!(replay.json()["quantity"], 7);
        assert_eq!(raw_member(&replay.body, "total_price"), "69.93");

        let different = app.post_order(Some("purged-post"), &order_body("Widget", 3, "9.99"));
        assert_problem(
            &different,
            409,
            "IDEMPOTENCY_KEY_REUSED_WITH_DIFFERENT_PAYLOAD",
        );
        assert_eq!(app.order_count(), 1);

        // The PATCH key is new again: the same request runs once more.
        let rerun = app.call(
            "PATCH",
            &path,
            Some("purged-patch"),
            Some(r#"{"quantity":5}"#),
        );
        assert_eq!(rerun.status, 200, "{}", rerun.body);
        assert_not_replayed(&rerun);
        assert_eq!(rerun.json()["quantity"], 5);
        assert_eq!(
            stored_order(&app, "alice", &id_of(&created)).expect("order")["quantity"],
            5
        );
        assert_eq!(app.order_count(), 1);
    }
}
