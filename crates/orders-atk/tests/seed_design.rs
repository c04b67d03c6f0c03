//! The runner against a second implementation of the pattern: the seed's
//! design (tests/support/seed.rs), run as it ships — no authentication,
//! integer ids, `422` for a missing key, a replay that ignores the body,
//! no key-length limit. The runner finds exactly what that design is
//! exposed to and calls the rest blocked, with the seed's answers that
//! differ from this contract as deviations.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::collections::BTreeMap;
use std::process::{Command, Output};

use orders_atk::{ATTACKS, RunReport, Shape, Target, Verdict, find, run_attacks};
use support::seed::{Dialect, Quirks, SeedServer};

const BIN: &str = env!("CARGO_BIN_EXE_orders-atk");

/// Every check against `seed` in the seed's shape, as `tokens` (none: no
/// Authorization), keeping its orders.
fn attack_the_seed(seed: &SeedServer, tokens: Option<(&str, &str)>) -> RunReport {
    let mut target = Target::new(&seed.address);
    target.shape = Shape::seed();
    target.concurrency = 8;
    if let Some((a, b)) = tokens {
        target.token = Some(a.into());
        target.token_b = Some(b.into());
    }
    run_attacks(&target, &ATTACKS.iter().collect::<Vec<_>>(), true)
}

/// Each check's verdict label, by id.
fn verdicts(report: &RunReport) -> BTreeMap<&'static str, &'static str> {
    report
        .checks
        .iter()
        .map(|c| (c.id, c.verdict.label()))
        .collect()
}

fn deviations_of<'r>(report: &'r RunReport, id: &str) -> &'r [String] {
    &report
        .checks
        .iter()
        .find(|c| c.id == id)
        .unwrap_or_else(|| panic!("no {id}"))
        .deviations
}

fn text(report: &RunReport) -> String {
    report
        .checks
        .iter()
        .map(|c| format!("{} {}\n{}", c.verdict.label(), c.id, c.evidence()))
        .collect()
}

#[test]
fn the_seed_s_design_is_exposed_to_a_changed_body_replay_and_unbounded_keys_and_blocks_the_rest_with_its_deviations()
 {
    let seed = SeedServer::start();

    let report = attack_the_seed(&seed, None);

    let all = text(&report);
    eprintln!("{all}");
    let exposed: Vec<&str> = report
        .checks
        .iter()
        .filter(|c| c.exposed())
        .map(|c| c.id)
        .collect();
    assert_eq!(exposed, ["ATK-03", "EXT-03"], "{all}");
    for (id, label) in verdicts(&report) {
        let expected = match id {
            "ATK-03" | "EXT-03" => "EXPOSED",
            "EXT-01" | "EXT-02" => "SKIPPED",
            _ => "BLOCKED",
        };
        assert_eq!(label, expected, "{id}\n{all}");
    }
    assert_eq!(
        report.summary(),
        format!(
            "12 blocked, 2 exposed, 0 not run, 2 skipped, {} deviations",
            report.deviations
        )
    );

    // What each exposure says.
    let Verdict::Exposed { exposed } = &report.checks[2].verdict else {
        panic!("{all}")
    };
    assert!(
        exposed[0].contains("was answered 201 with the first order ")
            && exposed[0].contains(" (quantity 2): "),
        "{exposed:?}"
    );
    let ext_03 = report.checks.iter().find(|c| c.id == "EXT-03").unwrap();
    let Verdict::Exposed { exposed } = &ext_03.verdict else {
        panic!("{all}")
    };
    assert!(
        exposed[0].starts_with(
            "keys have no bound: the target accepted and replayed 8 KiB and 64 KiB keys"
        ),
        "{exposed:?}"
    );

    // The seed's answers that differ from this contract, without the attack achieving anything.
    let deviations: BTreeMap<&str, &[String]> = report
        .checks
        .iter()
        .filter(|c| !c.deviations.is_empty())
        .map(|c| (c.id, c.deviations.as_slice()))
        .collect();
    assert_eq!(
        deviations.keys().copied().collect::<Vec<_>>(),
        ["ATK-01", "ATK-02", "ATK-05", "ATK-09", "ATK-12", "EXT-04"],
        "{all}"
    );
    assert_eq!(
        deviations_of(&report, "ATK-01"),
        ["422 where the contract says 400: a POST without Idempotency-Key"]
    );
    assert!(
        deviations_of(&report, "ATK-02")[0]
            .starts_with("422 where the contract says 400: the key \"\", the key \" \"")
    );
    assert!(deviations_of(&report, "ATK-09")[0].starts_with(
        "400 where the contract says 415: the application/x-www-form-urlencoded POST"
    ));
    assert!(
        deviations_of(&report, "ATK-12")[0]
            .starts_with("201 where the contract says 200 (a replay)")
    );
    assert!(
        deviations_of(&report, "EXT-04")
            .iter()
            .any(|d| d.contains("no `Idempotent-Replayed: true`"))
    );
    // The seed replays with 201 and no replay header: one order per round,
    // the other answers replays without the header.
    assert!(
        deviations_of(&report, "ATK-05")[0].contains(
            "again without `Idempotent-Replayed: true`: replays without the replay header"
        )
    );

    // Judged by state: the race made one order per round, the validation refused every bad body.
    for check in &report.checks {
        assert!(
            !check.control.is_empty() || check.id.starts_with("EXT-0") && check.id < "EXT-03",
            "{}",
            check.id
        );
    }
    assert!(seed.order_count() > 14, "{}", seed.order_count());
}

#[test]
fn with_two_tokens_the_seed_s_global_keys_and_open_orders_expose_the_tenancy_checks_too() {
    // The seed ignores Authorization: two "users" are one.
    let seed = SeedServer::start();

    let report = attack_the_seed(&seed, Some(("token-of-a", "token-of-b")));

    let all = text(&report);
    let exposed: Vec<&str> = report
        .checks
        .iter()
        .filter(|c| c.exposed())
        .map(|c| c.id)
        .collect();
    assert_eq!(exposed, ["ATK-03", "EXT-01", "EXT-02", "EXT-03"], "{all}");
    let ext_01 = &report.checks.iter().find(|c| c.id == "EXT-01").unwrap();
    assert!(
        ext_01
            .evidence()
            .contains("keys are not scoped to their user"),
        "{all}"
    );
    // B's own orders show in A's listing (the seed lists every order): they
    // are not orders A's key made.
    assert!(
        !ext_01
            .evidence()
            .contains("user A's key created 2 orders for user A"),
        "{all}"
    );
    let ext_02 = &report.checks.iter().find(|c| c.id == "EXT-02").unwrap();
    assert!(
        ext_02.evidence().contains("user B's GET of user A's order"),
        "{all}"
    );
    // The seed has no PATCH and no DELETE: those are not tried.
    assert!(
        ext_02.notes.iter().any(|n| n
            == "user B's PATCH, DELETE not tried: the profile says the target lacks PATCH, DELETE"),
        "{all}"
    );
}

fn orders_atk(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env_remove("ORDERS_API_TOKEN")
        .env_remove("ORDERS_API_TOKEN_B")
        .output()
        .unwrap()
}

#[test]
fn orders_atk_with_the_seed_profile_exits_non_zero_naming_the_exposed_checks() {
    let seed = SeedServer::start();

    let output = orders_atk(&[
        "--server",
        &seed.address,
        "--profile",
        "seed",
        "--concurrency",
        "8",
    ]);

    let (out, err) = (
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
    );
    assert_eq!(output.status.code(), Some(1), "{out}\n{err}");
    assert_eq!(
        err.trim(),
        "orders-atk: 2 of 16 checks EXPOSED: ATK-03, EXT-03",
        "{out}"
    );
    eprintln!("{out}");
    let last = out.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("12 blocked, 2 exposed, 0 not run, 2 skipped, ")
            && last.ends_with(" deviations"),
        "{out}"
    );
    assert!(
        out.contains("EXPOSED  ATK-03  replay a key with a changed body"),
        "{out}"
    );
    assert!(
        out.contains("BLOCKED  ATK-01  POST without Idempotency-Key"),
        "{out}"
    );
    assert!(
        out.contains("deviation: 422 where the contract says 400"),
        "{out}"
    );
    assert!(out.contains("SKIPPED  EXT-01"), "{out}");
}

#[test]
fn a_deviation_fails_the_run_only_with_strict() {
    let seed = SeedServer::start();
    let base = [
        "--server",
        &seed.address,
        "--profile",
        "seed",
        "--only",
        "ATK-01,ATK-06",
    ];

    let lenient = orders_atk(&base);
    let out = String::from_utf8_lossy(&lenient.stdout);
    assert!(lenient.status.success(), "{out}");
    assert!(
        out.ends_with("\n2 blocked, 0 exposed, 0 not run, 0 skipped, 1 deviations\n"),
        "{out}"
    );

    let strict = orders_atk(&[&base[..], &["--strict", "--format", "junit"]].concat());
    let xml = String::from_utf8_lossy(&strict.stdout);
    assert_eq!(strict.status.code(), Some(1), "{xml}");
    assert!(
        String::from_utf8_lossy(&strict.stderr)
            .contains("1 deviation(s) from the contract (--strict): ATK-01"),
        "{}",
        String::from_utf8_lossy(&strict.stderr)
    );
    assert!(
        xml.contains(r#"tests="2" failures="1" skipped="0""#),
        "{xml}"
    );
    assert!(xml.contains(r#"<failure message="BLOCKED with deviations (--strict): 422 where the contract says 400"#), "{xml}");
}

#[test]
fn a_wrong_base_path_is_not_blocked_it_is_not_run_and_the_run_fails() {
    let seed = SeedServer::start();

    let output = orders_atk(&[
        "--server",
        &seed.address,
        "--profile",
        "seed",
        "--base-path",
        "/v1/orders",
        "--only",
        "ATK-01,ATK-03",
    ]);

    let (out, err) = (
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
    );
    assert_eq!(output.status.code(), Some(1), "{out}\n{err}");
    assert!(out.contains("NOT RUN  ATK-01"), "{out}");
    assert!(
        out.contains("not run: the control (a valid create with a fresh key) was answered 404"),
        "{out}"
    );
    assert!(
        out.contains("are its orders at /v1/orders (--base-path, --profile)?"),
        "{out}"
    );
    assert!(
        out.ends_with("\n0 blocked, 0 exposed, 2 not run, 0 skipped, 0 deviations\n"),
        "{out}"
    );
    assert!(err.starts_with("orders-atk: no check could run, nothing was judged: 2 not run, 0 skipped; ATK-01: the control"), "{err}");
    assert_eq!(seed.order_count(), 0);
}

#[test]
fn a_profile_file_points_the_runner_at_the_same_design_in_another_shape_with_the_same_verdicts() {
    // Another path, other names, string ids, everything under "data".
    let seed = SeedServer::speaking(Dialect {
        base: "/api/purchases",
        item: "product",
        quantity: "qty",
        price: "unit_price",
        string_ids: true,
        envelope: true,
    });
    let dir = std::env::temp_dir().join(format!("atk-shape-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let profile = dir.join("purchases.json");
    std::fs::write(
        &profile,
        r#"{"base_path": "/api/purchases", "item_field": "product",
            "quantity_field": "qty", "price_field": "unit_price", "list_query": ""}"#,
    )
    .unwrap();
    let json = dir.join("report.json");

    let output = orders_atk(&[
        "--server",
        &seed.address,
        "--profile",
        profile.to_str().unwrap(),
        "--concurrency",
        "8",
        "--format",
        "json",
        "--out",
        json.to_str().unwrap(),
    ]);

    let out = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(1), "{out}");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let exposed: Vec<&str> = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["verdict"] == "exposed")
        .map(|c| c["id"].as_str().unwrap())
        .collect();
    assert_eq!(exposed, ["ATK-03", "EXT-03"], "{out}");
    assert_eq!(
        (report["blocked"].as_u64(), report["not_run"].as_u64()),
        (Some(12), Some(0)),
        "{out}"
    );
    assert_eq!(report["shape"]["quantity_field"], "qty");
    let atk_03 = &report["checks"][2];
    assert!(
        atk_03["exposed"][0]
            .as_str()
            .unwrap()
            .contains(r#"with the first order p-"#),
        "{atk_03:#}"
    );
    assert!(
        atk_03["exchanges"][0]["request"]["body"]
            .as_str()
            .unwrap()
            .contains(r#""qty":2,"unit_price":9.99"#),
        "{atk_03:#}"
    );
}

#[test]
fn a_wrong_id_field_is_not_run_and_says_which_member_it_looked_for() {
    let seed = SeedServer::start();

    let output = orders_atk(&[
        "--server",
        &seed.address,
        "--profile",
        "seed",
        "--id-field",
        "order_id",
        "--only",
        "ATK-04",
    ]);

    let out = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(1), "{out}");
    assert!(
        out.contains("was answered 201 {\"id\":1,")
            && out.contains("without an order id in `order_id` (--id-field, --profile)"),
        "{out}"
    );
    assert!(
        out.ends_with("\n0 blocked, 0 exposed, 1 not run, 0 skipped, 0 deviations\n"),
        "{out}"
    );
}

/// Issue 29.7: a target that makes an order for every request and drops
/// the answer of every other duplicate. Its rounds of the race are judged
/// by what it made — several orders for one key: EXPOSED — and each
/// request that got no answer is listed, in the text, the JSON and the
/// JUnit report. Before, the first missing answer made ATK-05 "not run",
/// and the orders it made were never looked at.
#[test]
fn a_target_that_drops_answers_and_makes_an_order_per_request_is_exposed_on_atk_05_with_its_unanswered_requests_listed()
 {
    let seed = SeedServer::with_quirks(
        Dialect::SEED,
        Quirks {
            order_per_request: true,
            drops: |_, before| before % 2 == 1,
        },
    );
    let mut target = Target::new(&seed.address);
    target.shape = Shape::seed();
    target.concurrency = 8;

    let report = run_attacks(&target, &[find("ATK-05").unwrap()], true);

    let check = &report.checks[0];
    let all = text(&report);
    let Verdict::Exposed { exposed } = &check.verdict else {
        panic!("{all}")
    };
    assert!(
        exposed[0].starts_with("round 1: 8 concurrent requests with one key created 8 orders: "),
        "{all}"
    );
    // Three rounds of eight; in each, the 2nd, 4th, 6th and 8th got no answer.
    assert_eq!(check.unanswered.len(), 12, "{all}");
    assert!(
        check
            .unanswered
            .iter()
            .all(|u| u.starts_with("POST /orders got no answer: ")),
        "{:?}",
        check.unanswered
    );
    assert!(
        check
            .deviations
            .iter()
            .any(|d| d.contains("4 of 8 concurrent duplicates got no answer")),
        "{all}"
    );
    assert_eq!(
        seed.order_count(),
        1 + 3 * 8,
        "the control's and the rounds'"
    );

    // In each report format.
    let dir = std::env::temp_dir().join(format!("atk-unanswered-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let run = |format: &str| {
        let out = dir.join(format!("report.{format}"));
        let output = orders_atk(&[
            "--server",
            &seed.address,
            "--profile",
            "seed",
            "--only",
            "ATK-05",
            "--concurrency",
            "8",
            "--format",
            format,
            "--out",
            out.to_str().unwrap(),
        ]);
        assert_eq!(output.status.code(), Some(1), "{format}");
        (
            String::from_utf8_lossy(&output.stdout).into_owned(),
            std::fs::read_to_string(&out).unwrap(),
        )
    };
    let (text, _) = run("text");
    assert!(text.contains("EXPOSED  ATK-05"), "{text}");
    assert_eq!(
        text.matches("no answer: POST /orders got no answer: ")
            .count(),
        12,
        "{text}"
    );
    assert!(
        text.contains("12 request(s) got no answer: each is listed under its check"),
        "{text}"
    );
    let (_, json) = run("json");
    let json: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(json["checks"][0]["verdict"], "exposed");
    assert_eq!(
        json["checks"][0]["unanswered"].as_array().map(Vec::len),
        Some(12),
        "{json:#}"
    );
    let (_, xml) = run("junit");
    assert!(
        xml.contains(r#"<property name="unanswered" value="12"/>"#),
        "{xml}"
    );
    assert!(xml.contains(r#"type="EXPOSED""#), "{xml}");
    assert_eq!(
        xml.matches("no answer: POST /orders got no answer: ")
            .count(),
        12,
        "{xml}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A check that needs an answer to go on — ATK-03 needs the order its
/// first request made — and does not get it is not run, and says which
/// request kept it from being judged; the request is listed.
#[test]
fn a_check_kept_from_being_judged_by_a_request_without_an_answer_says_which() {
    let seed = SeedServer::with_quirks(
        Dialect::SEED,
        Quirks {
            order_per_request: false,
            drops: |key, before| key.ends_with("-03") && before == 0,
        },
    );
    let mut target = Target::new(&seed.address);
    target.shape = Shape::seed();

    let report = run_attacks(&target, &[find("ATK-03").unwrap()], true);

    let check = &report.checks[0];
    let Verdict::NotRun { reason } = &check.verdict else {
        panic!("{}", text(&report))
    };
    assert!(
        reason.starts_with("the attack could not be judged: POST /orders got no answer: "),
        "{reason}"
    );
    assert_eq!(check.unanswered.len(), 1, "{:?}", check.unanswered);
    assert!(reason.ends_with(&check.unanswered[0]["POST /orders got no answer: ".len()..]));
}
