//! One test per attack scenario of CONTRACT §5 and per extra the `atk` command
//! judges: each runs the command's own definition (`orders_atk`)
//! against the spawned server — it must be BLOCKED, with no deviation from
//! the contract — so CI and `orders-api atk` cannot drift apart, then checks
//! in the database what HTTP cannot see. Each check's control (a valid
//! create with a fresh key) leaves one order and one ledger entry per user.

use orders_atk::probe::Answer;
use orders_atk::{self as atk, CheckReport, Target};
use serde_json::Value;

use crate::both_backends;
use crate::expect::*;
use crate::helpers::*;

const FOREIGN_ORIGIN: &str = "https://evil.example";
const SHOP_ORIGIN: &str = "https://shop.example";

/// The target `orders-api atk` would see: `app`, as alice (user A) and bob
/// (user B). The orders it creates are kept, for the database assertions.
pub fn target_of(app: &TestApp) -> Target {
    let mut target = Target::new(&app.address);
    target.token = Some(app.token.clone());
    target.token_b = Some(app.create_token("bob"));
    target
}

/// Runs the attack `id` against `app` and fails, with its evidence, unless
/// it was blocked exactly as the contract says (no deviation). Returns the
/// report.
fn assert_attack_blocked(app: &TestApp, id: &str) -> CheckReport {
    let attack = atk::find(id).unwrap_or_else(|| panic!("{id} is not defined"));
    let report = attack.run(&target_of(app));
    assert!(
        report.blocked() && report.deviations.is_empty(),
        "{id} against this service is {}:\n{}",
        report.verdict.label(),
        report.evidence()
    );
    assert_eq!(
        report.control.len(),
        1 + usize::from(attack.needs == atk::Needs::TwoUsers)
    );
    report
}

/// Every answer the check kept, in order.
fn answers(report: &CheckReport) -> Vec<&Answer> {
    report
        .exchanges
        .iter()
        .filter_map(|e| e.response.as_ref())
        .collect()
}

fn json(answer: &Answer) -> Value {
    serde_json::from_str(&answer.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", answer.body))
}

/// Every answer with `status` is a problem with this `error` code.
fn assert_codes(report: &CheckReport, status: u16, code: &str) {
    let matching: Vec<&Answer> = answers(report)
        .into_iter()
        .filter(|a| a.status == status)
        .collect();
    assert!(!matching.is_empty(), "no {status} in {}", report.evidence());
    for answer in matching {
        assert_eq!(json(answer)["error"], code, "{}", answer.body);
    }
}

/// The fields the `422` answers name, one list per answer.
fn failing_fields_of(report: &CheckReport) -> Vec<Vec<String>> {
    answers(report)
        .into_iter()
        .filter(|a| a.status == 422)
        .map(|a| {
            let mut fields: Vec<String> = json(a)["errors"]
                .as_array()
                .unwrap_or_else(|| panic!("no errors in {}", a.body))
                .iter()
                .map(|e| e["field"].as_str().unwrap_or_default().to_owned())
                .collect();
            fields.sort();
            fields
        })
        .collect()
}

/// Nothing stored but the control's order: the key the attack used is still unused.
fn assert_nothing_stored(app: &TestApp) {
    assert_eq!(app.order_count(), CONTROL, "a refused order is not stored");
    assert_eq!(
        app.ledger_count(),
        CONTROL,
        "a refused request leaves its key unused"
    );
}

/// The orders (and ledger entries) a one-user check's control leaves.
const CONTROL: i64 = 1;

both_backends! {
    fn atk_01_a_post_without_an_idempotency_key_is_refused_and_creates_nothing(backend) {
        let app = TestApp::spawn(backend);
        let report = assert_attack_blocked(&app, "ATK-01");
        assert_codes(&report, 400, "VALIDATION_FAILED");
        assert_eq!(json(answers(&report)[0])["detail"], MISSING_KEY_DETAIL);
        assert_nothing_stored(&app);
    }

    fn atk_02_an_empty_or_whitespace_only_key_is_refused_and_creates_nothing(backend) {
        let app = TestApp::spawn(backend);
        let report = assert_attack_blocked(&app, "ATK-02");
        assert_eq!(answers(&report).len(), 5);
        for answer in answers(&report) {
            assert_eq!(json(answer)["detail"], MISSING_KEY_DETAIL);
        }
        assert_nothing_stored(&app);
    }

    fn atk_03_replaying_a_key_with_a_changed_body_is_a_conflict_and_the_original_order_is_unchanged(backend) {
        let app = TestApp::spawn(backend);
        let report = assert_attack_blocked(&app, "ATK-03");
        assert_codes(&report, 409, "IDEMPOTENCY_KEY_REUSED_WITH_DIFFERENT_PAYLOAD");
        let created = json(answers(&report)[0]);
        let id = created["id"].as_str().expect("id");
        assert_eq!(app.order_count(), CONTROL + 1, "no new order");
        assert_eq!(
            stored_order(&app, "alice", id),
            Some(created.clone()),
            "the original order is unchanged"
        );
        assert_eq!(created["quantity"], 2);
    }

    fn atk_04_two_different_keys_create_two_orders_by_design(backend) {
        let app = TestApp::spawn(backend);
        assert_attack_blocked(&app, "ATK-04");
        assert_eq!(app.order_count(), CONTROL + 2);
        assert_eq!(app.ledger_count(), CONTROL + 2);
    }

    fn atk_05_concurrent_requests_with_one_key_create_exactly_one_order(backend) {
        let app = TestApp::spawn(backend);
        let report = assert_attack_blocked(&app, "ATK-05");
        let rounds = report.notes.iter().filter(|n| n.starts_with("round ")).count();
        assert_eq!(rounds, 3, "{:?}", report.notes);
        assert_eq!(app.order_count(), CONTROL + 3, "one order per round");
        assert_eq!(app.ledger_count(), CONTROL + 3, "one ledger entry per round's key");
        for answer in answers(&report).into_iter().filter(|a| a.status == 409) {
            assert_eq!(json(answer)["error"], "IDEMPOTENCY_IN_PROGRESS");
        }
    }

    fn atk_06_a_negative_quantity_is_refused_and_creates_nothing(backend) {
        let app = TestApp::spawn(backend);
        let report = assert_attack_blocked(&app, "ATK-06");
        assert_eq!(failing_fields_of(&report), vec![vec!["quantity"]; 2]);
        assert_nothing_stored(&app);
    }

    fn atk_07_a_zero_quantity_is_refused_and_creates_nothing(backend) {
        let app = TestApp::spawn(backend);
        let report = assert_attack_blocked(&app, "ATK-07");
        assert_eq!(failing_fields_of(&report), vec![vec!["quantity"]]);
        assert_nothing_stored(&app);
    }

    fn atk_08_a_missing_item_or_other_required_field_is_refused_and_creates_nothing(backend) {
        let app = TestApp::spawn(backend);
        let report = assert_attack_blocked(&app, "ATK-08");
        assert_eq!(
            failing_fields_of(&report),
            vec![
                vec!["item"],
                vec!["quantity"],
                vec!["price"],
                vec!["item", "price", "quantity"],
            ]
        );
        assert_nothing_stored(&app);
    }

    fn atk_09_a_cross_origin_form_post_is_refused_and_foreign_origins_get_no_cors_grant(backend) {
        let app = TestApp::spawn(backend);
        let report = assert_attack_blocked(&app, "ATK-09");
        assert_codes(&report, 415, "UNSUPPORTED_MEDIA_TYPE");
        let preflight = answers(&report)[3];
        if preflight.status >= 400 {
            assert!(
                preflight.headers.iter().any(|(n, v)| n == "content-type" && v == PROBLEM_JSON),
                "a refused preflight is a problem like every other error: {preflight:?}"
            );
        }
        assert_eq!(app.order_count(), CONTROL + 1, "only the JSON request created an order");
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
        let report = assert_attack_blocked(&app, "ATK-10");
        assert_eq!(failing_fields_of(&report), vec![vec!["price"]; 2]);
        assert_nothing_stored(&app);
    }

    fn atk_11_a_quantity_given_as_a_string_or_a_float_is_refused_and_creates_nothing(backend) {
        let app = TestApp::spawn(backend);
        let report = assert_attack_blocked(&app, "ATK-11");
        let sent: Vec<&str> = report
            .exchanges
            .iter()
            .filter_map(|e| e.request.body.as_deref())
            .collect();
        for quantity in ["\"1\"", "1.5", "1.0", "1e2", "true", "null"] {
            let member = format!("\"quantity\":{quantity},");
            assert!(sent.iter().any(|b| b.contains(&member)), "{quantity} was not sent: {sent:?}");
        }
        assert_eq!(failing_fields_of(&report), vec![vec!["quantity"]; 6]);
        assert_nothing_stored(&app);
    }

    fn atk_12_sql_in_the_key_is_an_opaque_key_and_the_tables_are_intact(backend) {
        let app = TestApp::spawn(backend);
        let report = assert_attack_blocked(&app, "ATK-12");
        assert!(
            report.exchanges.iter().any(|e| e
                .request
                .headers
                .iter()
                .any(|(_, v)| v.contains("'; DROP TABLE orders; --"))),
            "{}",
            report.evidence()
        );
        assert_eq!(app.order_count(), CONTROL + 3, "one order per key, tables intact");
        assert_eq!(app.ledger_count(), CONTROL + 3);
    }

    fn ext_01_the_same_key_used_by_another_user_is_an_unrelated_key(backend) {
        let app = TestApp::spawn(backend);
        assert_attack_blocked(&app, "EXT-01");
        assert_eq!(app.order_count(), 2 * CONTROL + 2, "one order per user");
        assert_eq!(app.ledger_count(), 2 * CONTROL + 2, "one ledger entry per user's key");
    }

    fn ext_02_another_users_order_answers_404_like_a_nonexistent_one_and_stays_unchanged(backend) {
        let app = TestApp::spawn(backend);
        let report = assert_attack_blocked(&app, "EXT-02");
        assert_codes(&report, 404, "NOT_FOUND");
        let created = json(answers(&report)[0]);
        let id = created["id"].as_str().expect("id");
        assert_eq!(stored_order(&app, "alice", id), Some(created.clone()));
        assert_eq!(stored_order(&app, "bob", id), None);
        assert_eq!(app.order_count(), 2 * CONTROL + 1);
    }

    fn ext_03_a_key_over_255_characters_is_refused_and_one_of_255_is_accepted(backend) {
        let app = TestApp::spawn(backend);
        let report = assert_attack_blocked(&app, "EXT-03");
        let refused = answers(&report).into_iter().find(|a| a.status == 400).map(json);
        let refused = refused.unwrap_or_else(|| panic!("no 400: {}", report.evidence()));
        assert!(refused["detail"].as_str().unwrap_or_default().contains("255"), "{refused}");
        assert_eq!(app.order_count(), CONTROL + 1);
        assert_eq!(app.ledger_count(), CONTROL + 1);
    }

    fn ext_04_a_replay_preserves_location_content_type_and_body(backend) {
        let app = TestApp::spawn(backend);
        assert_attack_blocked(&app, "EXT-04");
        assert_eq!(app.order_count(), CONTROL + 1);
        assert_eq!(app.ledger_count(), CONTROL + 1);
    }
}
