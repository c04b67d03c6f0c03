//! CONTRACT §3 authentication and isolation, and a sweep of hostile requests
//! none of which may be answered with a 5xx.

use std::time::Duration;

use crate::both_backends;
use crate::expect::*;
use crate::helpers::*;

const NONEXISTENT: &str = "0193a8e4-8f3c-7cc2-9d6a-5b1f2e3d4c5b";

both_backends! {
    fn a_missing_malformed_or_unknown_token_is_a_401_on_every_route(backend) {
        let app = TestApp::spawn(backend);
        let unknown = format!("Bearer oa_{}", "a".repeat(64));
        let lowercase = format!("bearer {}", app.token);
        let basic = format!("Basic {}", app.token);
        let bare = app.token.clone();
        let truncated = format!("Bearer {}", &app.token[..app.token.len() - 1]);
        let authorizations: [Option<&str>; 7] = [
            None,
            Some(""),
            Some("Bearer"),
            Some(unknown.as_str()),
            Some(basic.as_str()),
            Some(bare.as_str()),
            Some(truncated.as_str()),
        ];
        let body = order_body("Widget", 1, "1");
        let routes = [
            ("GET", "/v1/orders".to_owned()),
            ("POST", "/v1/orders".to_owned()),
            ("GET", format!("/v1/orders/{NONEXISTENT}")),
            ("PATCH", format!("/v1/orders/{NONEXISTENT}")),
            ("DELETE", format!("/v1/orders/{NONEXISTENT}")),
            ("PUT", format!("/v1/orders/{NONEXISTENT}")),
            ("GET", "/v1/unknown".to_owned()),
        ];

        for authorization in authorizations {
            for (method, path) in &routes {
                let mut headers = vec![
                    ("Idempotency-Key", "k"),
                    ("Content-Type", "application/json"),
                ];
                if let Some(value) = authorization {
                    headers.push(("Authorization", value));
                }
                let response = app.request(method, path, &headers, Some(&body));
                assert_problem(&response, 401, "UNAUTHORIZED");
                assert_eq!(
                    response.header("WWW-Authenticate"),
                    Some("Bearer"),
                    "{method} {path}"
                );
            }
        }
        let lower = app.request(
            "GET",
            "/v1/orders",
            &[("Authorization", lowercase.as_str())],
            None,
        );
        assert_eq!(
            lower.status, 200,
            "the scheme is case-insensitive: {}",
            lower.body
        );
        assert_eq!(app.order_count(), 0);
        assert_eq!(app.ledger_count(), 0);
    }

    fn a_revoked_token_stops_working_once_the_token_caches_time_to_live_has_passed(backend) {
        let app = TestApp::spawn_with(backend, |s| s.auth_cache_secs = 1);
        let token = app.create_token("carol");
        // Accepted, and so remembered by the server for up to a second.
        assert_eq!(app.call_as(&token, "GET", "/v1/orders", None, None).status, 200);

        let key = orders_api::auth::KeyRef::parse(&token).unwrap();
        let revoked = orders_api::auth::revoke(&mut app.pool.get().unwrap().conn(), &key).unwrap();
        assert!(
            matches!(revoked, orders_api::auth::Revocation::Revoked { .. }),
            "{revoked:?}"
        );
        std::thread::sleep(Duration::from_millis(1_100));

        assert_problem(
            &app.call_as(&token, "GET", "/v1/orders", None, None),
            401,
            "UNAUTHORIZED",
        );
        let create = app.call_as(
            &token,
            "POST",
            "/v1/orders",
            Some("after-revocation"),
            Some(&order_body("Widget", 1, "1")),
        );
        assert_problem(&create, 401, "UNAUTHORIZED");
        assert_eq!(app.order_count(), 0);
    }

    fn a_revoked_tokens_retry_of_a_key_answered_from_memory_is_a_401_not_a_replay(backend) {
        // Two memories meet: the ledger answers the key's retries from what
        // a read found (for a minute here), the token is looked up every
        // time. Authentication comes first, so the revocation wins.
        let app = TestApp::spawn_with(backend, |s| {
            s.auth_cache_secs = 0;
            s.replay_cache_secs = 60;
        });
        let token = app.create_token("carol");
        let body = order_body("Widget", 1, "1");
        let send = || app.call_as(&token, "POST", "/v1/orders", Some("remembered"), Some(&body));
        assert_eq!(send().status, 201);
        let replay = send();
        assert_eq!(replay.status, 200, "{}", replay.body);
        assert_eq!(replay.header("Idempotent-Replayed"), Some("true"));

        let key = orders_api::auth::KeyRef::parse(&token).unwrap();
        orders_api::auth::revoke(&mut app.pool.get().unwrap().conn(), &key).unwrap();
        assert_problem(&send(), 401, "UNAUTHORIZED");
        assert_eq!((app.order_count(), app.ledger_count()), (1, 1));
    }

    fn a_revoked_token_is_a_401(backend) {
        // Without the token cache: revocation then takes effect at once.
        let app = TestApp::spawn_with(backend, |s| s.auth_cache_secs = 0);
        let token = app.create_token("carol");
        let created = app.call_as(
            &token,
            "POST",
            "/v1/orders",
            Some("before"),
            Some(&order_body("Widget", 1, "1")),
        );
        assert_eq!(created.status, 201, "{}", created.body);

        let key = orders_api::auth::KeyRef::parse(&token).unwrap();
        let revoked = orders_api::auth::revoke(&mut app.pool.get().unwrap().conn(), &key).unwrap();
        assert!(
            matches!(revoked, orders_api::auth::Revocation::Revoked { ref user_id, .. } if user_id == "carol"),
            "{revoked:?}"
        );

        assert_problem(
            &app.call_as(&token, "GET", "/v1/orders", None, None),
            401,
            "UNAUTHORIZED",
        );
        let retry = app.call_as(
            &token,
            "POST",
            "/v1/orders",
            Some("before"),
            Some(&order_body("Widget", 1, "1")),
        );
        assert_problem(&retry, 401, "UNAUTHORIZED");
        assert_problem(
            &app.call_as(
                &token,
                "POST",
                "/v1/orders",
                Some("after"),
                Some(&order_body("Widget", 1, "1")),
            ),
            401,
            "UNAUTHORIZED",
        );
        assert_eq!(app.order_count(), 1);
        let others = app.call("GET", "/v1/orders", None, None);
        assert_eq!(others.status, 200, "other keys still work");
    }

    fn another_users_order_answers_404_exactly_like_a_nonexistent_one_and_changes_nothing(backend) {
        let app = TestApp::spawn(backend);
        let bob = app.create_token("bob");
        let bobs = app.call_as(
            &bob,
            "POST",
            "/v1/orders",
            Some("bobs"),
            Some(&order_body("Bike", 1, "250.00")),
        );
        assert_eq!(bobs.status, 201, "{}", bobs.body);
        let bobs_path = bobs.header("Location").expect("Location").to_owned();
        let missing_path = format!("/v1/orders/{NONEXISTENT}");

        let requests: [(&str, Option<&str>); 3] = [
            ("GET", None),
            ("PATCH", Some(r#"{"quantity":99,"price":0.01}"#)),
            ("DELETE", None),
        ];
        for (i, (method, body)) in requests.into_iter().enumerate() {
            let key = (method != "GET").then(|| format!("alice-{i}"));
            let other_key = key.as_ref().map(|k| format!("{k}-missing"));
            let foreign = app.call(method, &bobs_path, key.as_deref(), body);
            let missing = app.call(method, &missing_path, other_key.as_deref(), body);

            assert_problem(&foreign, 404, "NOT_FOUND");
            assert_problem(&missing, 404, "NOT_FOUND");
            // Alike but for `instance`, which names each answer's own request.
            let (mut foreign_members, mut missing_members) = (foreign.json(), missing.json());
            foreign_members["instance"].take();
            missing_members["instance"].take();
            assert_eq!(foreign_members, missing_members, "{method}");
            assert_eq!(
                foreign.header("Content-Type"),
                missing.header("Content-Type")
            );
        }

        assert_eq!(
            stored_order(&app, "bob", &id_of(&bobs)),
            Some(bobs.json()),
            "bob's order is unchanged"
        );
        assert_eq!(stored_order(&app, "alice", &id_of(&bobs)), None);
        let list = app.call("GET", "/v1/orders", None, None);
        assert_eq!(
            list.json()["data"],
            serde_json::json!([]),
            "alice lists none of bob's orders"
        );
        let bob_reads = app.call_as(&bob, "GET", &bobs_path, None, None);
        assert_eq!(bob_reads.json()["status"], "pending");
        assert_eq!(app.order_count(), 1);
    }

    fn nothing_a_client_sends_is_answered_with_a_5xx(backend) {
        let app = TestApp::spawn(backend);
        let created = app.post_order(Some("seed"), &order_body("Widget", 2, "9.99"));
        let order_path = created.header("Location").expect("Location").to_owned();
        let deep = format!("{}{}", "[".repeat(5_000), "]".repeat(5_000));
        let deep_object = format!(
            r#"{{"item":"W","quantity":1,"price":1,"x":{}1{}}}"#,
            "{\"a\":".repeat(3_000),
            "}".repeat(3_000)
        );
        let long_item = format!(
            r#"{{"item":"{}","quantity":1,"price":1}}"#,
            "x".repeat(60_000)
        );
        let bodies: Vec<String> = vec![
            r#"{"item":"W","quantity":1,"price":1e999999}"#.into(),
            r#"{"item":"W","quantity":1,"price":-1e999999}"#.into(),
            r#"{"item":"W","quantity":1e999999,"price":1}"#.into(),
            r#"{"item":"W","quantity":99999999999999999999999999999999999999999,"price":1}"#.into(),
            r#"{"item":"W","quantity":1,"price":0.000000000000000000000000000000000000001}"#.into(),
            r#"{"item":"W","quantity":1,"price":100000000000000000000000000000000000000000.00}"#
                .into(),
            r#"{"item":"\ud800","quantity":1,"price":1}"#.into(),
            r#"{"item":"\u0000","quantity":1,"price":1}"#.into(),
            r#"{"item":"W","quantity":1,"price":1,"":null}"#.into(),
            "\u{feff}{\"item\":\"W\",\"quantity\":1,\"price\":1}".into(),
            deep,
            deep_object,
            long_item,
            "null".into(),
            "".into(),
        ];

        let mut answers = Vec::new();
        for (i, body) in bodies.iter().enumerate() {
            answers.push(app.post_order(Some(&format!("odd-{i}")), body));
            answers.push(app.call(
                "PATCH",
                &order_path,
                Some(&format!("odd-patch-{i}")),
                Some(body),
            ));
        }
        for path in [
            "/v1/orders/%00",
            "/v1/orders/..%2F..%2Fetc%2Fpasswd",
            "/v1/orders/0193a8e4-8f3c-7cc2-9d6a-5b1f2e3d4c5b/extra",
            "/v1/orders?limit=1&limit=2",
            "/v1/orders?cursor=ffffffffffffffff",
            "/v1/orders?cursor=7fffffffffffffff",
            "/v1/orders?%zz",
        ] {
            answers.push(app.call("GET", path, None, None));
        }
        let long_id = format!("/v1/orders/{}", "9".repeat(8_000));
        answers.push(app.call("GET", &long_id, None, None));
        answers.push(app.call("DELETE", &long_id, Some("odd-long"), None));
        for method in ["HEAD", "OPTIONS", "TRACE"] {
            answers.push(app.call(method, "/v1/orders", Some("odd-method"), None));
        }
        for method in ["PROPFIND", "PURGE", "BREW"] {
            let head = format!(
                "{method} {order_path} HTTP/1.1\r\nAuthorization: Bearer {}\r\nIdempotency-Key: odd",
                app.token
            );
            let answer = raw_request(&app, head.as_bytes(), b"");
            assert!(
                answer.status < 500,
                "{method}: {} {}",
                answer.status,
                answer.body
            );
        }

        for answer in &answers {
            assert!(answer.status < 500, "{} {}", answer.status, answer.body);
            if answer.status >= 400 && !answer.body.is_empty() {
                assert_eq!(
                    answer.header("Content-Type"),
                    Some(PROBLEM_JSON),
                    "{}",
                    answer.body
                );
            }
        }
        let not_utf8 = raw_request(
            &app,
            format!("POST /v1/orders HTTP/1.1\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nIdempotency-Key: bytes", app.token).as_bytes(),
            b"{\"item\":\"\xff\xfe\",\"quantity\":1,\"price\":1}",
        );
        assert_eq!(not_utf8.status, 400, "{}", not_utf8.body);
        assert!(
            not_utf8.body.contains("MALFORMED_JSON"),
            "{}",
            not_utf8.body
        );

        assert_eq!(
            stored_order(&app, "alice", &id_of(&created)),
            Some(created.json()),
            "no odd request changed the order"
        );
        assert_eq!(app.order_count(), 1);
    }
}

/// The token cache against lookups that race a revocation, and a flood of
/// unknown tokens; each orders its events with a lookup paused between its
/// database read and remembering its answer (`orders_api::auth::hooks`,
/// compiled into test builds only).
mod lookups {
    use std::sync::mpsc;

    use orders_api::auth::cache::first_lookups_for_pool;
    use orders_api::auth::hooks::Pause;

    use super::*;

    const PATIENCE: Duration = Duration::from_secs(30);

    /// A well-formed token no key has.
    fn random_token() -> String {
        format!(
            "oa_{}{}",
            uuid::Uuid::new_v4().simple(),
            uuid::Uuid::new_v4().simple()
        )
    }

    fn revoke(app: &TestApp, token: &str) {
        let key = orders_api::auth::KeyRef::parse(token).unwrap();
        let revoked = orders_api::auth::revoke(&mut app.pool.get().unwrap().conn(), &key).unwrap();
        assert!(
            matches!(revoked, orders_api::auth::Revocation::Revoked { .. }),
            "{revoked:?}"
        );
    }

    both_backends! {
        /// Issue 29.6: a lookup reads a token live and pauses; the token is
        /// revoked; a second request's lookup reads it revoked (401); then
        /// the first remembers what it read. Its request was answered as it
        /// read (200), but the revocation stands: the next request is 401,
        /// although the cache would remember a live token for a minute.
        /// Before, the last answer remembered won, and the revoked token
        /// was accepted again for the whole time to live.
        fn a_revocation_is_never_undone_by_a_lookup_that_read_the_token_before_it(backend) {
            let app = TestApp::spawn_with(backend, |s| s.auth_cache_secs = 60);
            let token = app.create_token("carol");
            let pause = Pause::next_lookup_of(&[&token]);

            let (before, after) = std::thread::scope(|s| {
                let before = s.spawn(|| app.call_as(&token, "GET", "/v1/orders", None, None));
                assert!(pause.wait_until_paused(1, PATIENCE), "the first lookup never read");
                revoke(&app, &token);
                let after = app.call_as(&token, "GET", "/v1/orders", None, None);
                pause.release();
                (before.join().unwrap(), after)
            });

            assert_eq!(before.status, 200, "it read the token live: {}", before.body);
            assert_problem(&after, 401, "UNAUTHORIZED");
            let next = app.call_as(&token, "GET", "/v1/orders", None, None);
            assert_problem(&next, 401, "UNAUTHORIZED");
        }

        /// A token the database does not know, sent again within the time
        /// to live, is refused without a second lookup (a paused lookup
        /// would show one). Before, each one cost a database read.
        fn an_unknown_token_sent_again_is_refused_without_another_lookup(backend) {
            let app = TestApp::spawn(backend);
            let unknown = random_token();
            assert_problem(&app.call_as(&unknown, "GET", "/v1/orders", None, None), 401, "UNAUTHORIZED");

            let pause = Pause::next_lookup_of(&[&unknown]);
            let again = std::thread::scope(|s| {
                let again = s.spawn(|| app.call_as(&unknown, "GET", "/v1/orders", None, None));
                // Whichever comes first: the answer, or a lookup paused.
                let deadline = std::time::Instant::now() + PATIENCE;
                while !again.is_finished() {
                    assert!(std::time::Instant::now() < deadline, "no answer");
                    if pause.paused() > 0 {
                        pause.release();
                        panic!("the unknown token was looked up again");
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
                again.join().unwrap()
            });
            assert_problem(&again, 401, "UNAUTHORIZED");
            assert_eq!(pause.paused(), 0, "the unknown token was looked up again");
        }

        /// Issue 29.6: a flood of well-formed random tokens while their
        /// lookups hold database connections (paused after the read). As
        /// many as the bound (a quarter of the pool) are looked up; every
        /// other one waits its turn without a thread or a connection and is
        /// answered 503 with Retry-After when its wait is over — while those
        /// lookups are still held; a request with a known token is
        /// answered meanwhile — the flood holds one connection of four —
        /// and a valid token never seen waits its turn like the flood (503,
        /// then 200). The held lookups themselves are answered 503 at the
        /// read bound (2 × `DATABASE_TIMEOUT_SECS`), still held. Before, every unknown token took a blocking thread and
        /// a connection, and the known token's request waited behind them.
        fn a_flood_of_unknown_tokens_is_shed_and_leaves_connections_to_known_tokens(backend) {
            let pool_size = 4;
            let app = TestApp::spawn_with(backend, |s| {
                s.pool_size = pool_size;
                s.db_timeout_secs = 1;
            });
            let bound = first_lookups_for_pool(pool_size);
            assert_eq!(app.call("GET", "/v1/orders", None, None).status, 200, "alice's token is known");
            let new_key = app.create_token("dave");
            let flood: Vec<String> = (0..12).map(|_| random_token()).collect();
            let pause = Pause::next_lookup_of(&flood);

            let (answers, held) = std::thread::scope(|s| {
                let (tx, rx) = mpsc::channel();
                for token in &flood {
                    let (tx, app) = (tx.clone(), &app);
                    s.spawn(move || {
                        let _ = tx.send(app.call_as(token, "GET", "/v1/orders", None, None));
                    });
                }
                assert!(pause.wait_until_paused(bound, PATIENCE), "no lookup of the flood read");
                let shed: Vec<TestResponse> = (0..flood.len() - bound)
                    .map(|_| rx.recv_timeout(PATIENCE).expect("the excess is answered while the lookups are held"))
                    .collect();
                // Still held: the known token is served, the new one waits its turn.
                assert_eq!(pause.paused(), bound);
                let known = app.call("GET", "/v1/orders", None, None);
                let unfamiliar = app.call_as(&new_key, "GET", "/v1/orders", None, None);
                // A lookup that does not return is answered at the read
                // bound, while it is still held.
                let held: Vec<TestResponse> = (0..bound)
                    .map(|_| rx.recv_timeout(PATIENCE).expect("a held lookup is answered at its read bound"))
                    .collect();
                assert_eq!(pause.paused(), bound);
                pause.release();
                ((shed, known, unfamiliar), held)
            });
            let (shed, known, unfamiliar) = answers;

            for response in &shed {
                crate::bounds::assert_unavailable(response);
            }
            assert_eq!(known.status, 200, "the known token waited behind the flood: {}", known.body);
            crate::bounds::assert_unavailable(&unfamiliar);
            for response in &held {
                crate::bounds::assert_unavailable(response);
            }
            let served = app.call_as(&new_key, "GET", "/v1/orders", None, None);
            assert_eq!(served.status, 200, "{}", served.body);
            let metrics = app.request("GET", "/metrics", &[], None).body.clone();
            assert!(metrics.contains("orders_api_token_lookups_shed_total"), "{metrics}");
        }
    }
}
