//! The runner against applications behind an idempotency layer of the
//! field's kind (tests/support/layered.rs), each layer or app wrong in one
//! way that a third-party middleware is: the verdict follows from what the
//! application did, and the report says what happened.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::process::Command;

use orders_atk::{CheckReport, Shape, Target, Verdict, find};
use support::layered::{App, Compare, Layer, Layered};

const BIN: &str = env!("CARGO_BIN_EXE_orders-atk");

/// Runs check `id` against `double`, in the seed's shape (its `/orders`).
fn run(double: &Layered, id: &str, concurrency: usize) -> CheckReport {
    let mut target = Target::new(&double.address);
    target.shape = Shape::seed();
    target.concurrency = concurrency;
    let report = find(id).expect("defined").run(&target);
    eprintln!(
        "--- {id}: {}\n{}",
        report.verdict.label(),
        report.evidence()
    );
    report
}

fn exposures(report: &CheckReport) -> Vec<String> {
    match &report.verdict {
        Verdict::Exposed { exposed } => exposed.clone(),
        _ => Vec::new(),
    }
}

#[test]
fn a_float_quantity_the_application_accepts_is_exposed_behind_a_layer_that_records_refusals() {
    // The layer replays a recorded 422 for its key and refuses any other
    // body under it: bodies sharing one key would never reach the app.
    let double = Layered::start(
        Layer {
            records_refusals: true,
            ..Layer::CAREFUL
        },
        App {
            lax_quantity: true,
            ..App::STRICT
        },
    );

    let report = run(&double, "ATK-11", 8);

    let exposed = exposures(&report);
    assert!(
        exposed
            .iter()
            .any(|e| e.contains("quantity 1.0") && e.contains("created")),
        "{}",
        report.evidence()
    );
}

#[test]
fn a_refusal_that_the_idempotency_layer_gave_instead_of_the_application_is_named_as_such() {
    // Keys cut to 16 characters: two fresh keys of one check collide in
    // the layer, which answers the second body with its reuse refusal.
    let double = Layered::start(
        Layer {
            records_refusals: true,
            key_chars_kept: Some(16),
            ..Layer::CAREFUL
        },
        App::STRICT,
    );

    let report = run(&double, "ATK-06", 8);

    assert!(report.blocked(), "{}", report.evidence());
    assert!(
        report.deviations.iter().any(|d| d
            .contains("answered by the idempotency layer, not the application")
            && d.contains("quantity -1000000")),
        "{}",
        report.evidence()
    );
}

#[test]
fn a_key_bound_of_256_or_128_is_a_deviation_that_names_the_bound_not_an_exposure() {
    for bound in [256, 128] {
        let double = Layered::start(
            Layer {
                max_key: Some(bound),
                ..Layer::CAREFUL
            },
            App::STRICT,
        );

        let report = run(&double, "EXT-03", 8);

        assert!(report.blocked(), "{bound}: {}", report.evidence());
        let says = format!(
            "keys are bounded at {bound} characters where the contract says 255 ({bound} \
             accepted, {} refused",
            bound + 1
        );
        assert!(
            report.deviations.iter().any(|d| d.starts_with(&says)),
            "{says}\n{}",
            report.evidence()
        );
    }
}

#[test]
fn keys_without_a_bound_are_exposed_once_keys_of_8_and_64_kib_are_stored_and_replayed() {
    let double = Layered::start(
        Layer {
            max_key: None,
            ..Layer::CAREFUL
        },
        App::STRICT,
    );

    let report = run(&double, "EXT-03", 8);

    assert!(
        exposures(&report).iter().any(|e| e
            .contains("accepted and replayed 8 KiB and 64 KiB keys")
            && e.contains("8192")
            && e.contains("65536")
            && !e.contains("stored")),
        "{}",
        report.evidence()
    );
}

#[test]
fn an_http_server_s_header_limit_is_a_bound_too_found_by_bisection() {
    // No bound in the layer; the server refuses heads over 16 KiB (431).
    let double = Layered::start(
        Layer {
            max_key: None,
            head_limit: Some(16 * 1024),
            ..Layer::CAREFUL
        },
        App::STRICT,
    );

    let report = run(&double, "EXT-03", 8);

    assert!(report.blocked(), "{}", report.evidence());
    let bound = report.deviations.iter().find(|d| {
        d.starts_with("keys are bounded at ") && d.contains("65536 characters was answered 431")
    });
    let Some(bound) = bound else {
        panic!("{}", report.evidence())
    };
    // The bound found is the longest key whose request head fits in 16 KiB.
    let found: usize = bound["keys are bounded at ".len()..]
        .split(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{bound}"));
    assert!((16 * 1024 - 400..16 * 1024).contains(&found), "{bound}");
}

#[test]
fn an_express_error_page_in_a_500_is_internals_wherever_the_application_lives() {
    let page = include_str!("fixtures/internals/express-500.html");
    let double = Layered::start(
        Layer::CAREFUL,
        App {
            crash: Some((500, page)),
            ..App::STRICT
        },
    );

    let report = run(&double, "ATK-08", 8);

    assert!(
        exposures(&report)
            .iter()
            .any(|e| e.contains("internals") && e.contains("/tmp/samples/app.js:4:70")),
        "{}",
        report.evidence()
    );
}

#[test]
fn a_python_traceback_in_a_409_is_internals_too() {
    let traceback = include_str!("fixtures/internals/python-traceback.txt");
    let double = Layered::start(
        Layer::CAREFUL,
        App {
            crash: Some((409, traceback)),
            ..App::STRICT
        },
    );

    let report = run(&double, "ATK-08", 8);

    assert!(
        exposures(&report)
            .iter()
            .any(|e| e.contains("409") && e.contains("Python")),
        "{}",
        report.evidence()
    );
}

#[test]
fn a_quantity_sent_as_a_string_that_a_loose_comparison_replays_is_exposed() {
    let double = Layered::start(
        Layer {
            compare: Compare::Loose,
            ..Layer::CAREFUL
        },
        App::STRICT,
    );

    let report = run(&double, "ATK-03", 8);

    assert!(
        exposures(&report)
            .iter()
            .any(|e| e.contains("numbers sent as strings") && e.contains("first order")),
        "{}",
        report.evidence()
    );
}

#[test]
fn a_layer_that_compares_bytes_refuses_reordered_members_which_is_a_deviation_not_an_exposure() {
    let double = Layered::start(
        Layer {
            compare: Compare::Bytes,
            ..Layer::CAREFUL
        },
        App::STRICT,
    );

    let report = run(&double, "ATK-03", 8);

    assert!(report.blocked(), "{}", report.evidence());
    assert!(
        report
            .deviations
            .iter()
            .any(|d| d.contains("409") && d.contains("members reordered")),
        "{}",
        report.evidence()
    );
}

#[test]
fn the_race_counts_answers_marked_as_replays_apart_from_creations() {
    // The layer replays the recorded 201 as 201, with its replay header.
    let double = Layered::start(
        Layer {
            replays_201: true,
            ..Layer::CAREFUL
        },
        App::STRICT,
    );

    let report = run(&double, "ATK-05", 8);

    assert!(report.blocked(), "{}", report.evidence());
    assert!(
        report
            .notes
            .iter()
            .any(|n| n.contains("made 1 new order(s)")
                && n.contains("answers: 1 creation, 7 replayed, 0 replayed without")),
        "{}",
        report.evidence()
    );
    assert!(
        !report
            .deviations
            .iter()
            .any(|d| d.contains("duplicates were answered 201")),
        "{}",
        report.evidence()
    );
    assert_eq!(
        double.order_count(),
        1 + 3,
        "the control's and one per round"
    );
}

#[test]
fn a_race_whose_requests_never_overlapped_says_that_no_race_was_tried() {
    let double = Layered::start(Layer::CAREFUL, App::STRICT);

    let report = run(&double, "ATK-05", 1);

    let Verdict::NotRun { reason } = &report.verdict else {
        panic!("{}", report.evidence())
    };
    assert!(reason.contains("no race was tried"), "{reason}");
}

fn orders_atk(args: &[&str]) -> (Option<i32>, String, String) {
    let output = Command::new(BIN)
        .args(args)
        .env_remove("ORDERS_API_TOKEN")
        .env_remove("ORDERS_API_TOKEN_B")
        .output()
        .unwrap();
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

fn profile_file(name: &str, json: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("atk-field-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join(name);
    std::fs::write(&file, json).unwrap();
    file
}

#[test]
fn a_profile_extends_the_seed_and_names_the_key_header_the_replay_header_and_the_missing_routes() {
    let double = Layered::start(
        Layer {
            key_header: "X-Idempotency-Key",
            replay_header: "X-Idempotent-Replayed",
            ..Layer::CAREFUL
        },
        App {
            has_patch: false,
            has_delete: false,
            ..App::STRICT
        },
    );
    let profile = profile_file(
        "middleware.json",
        r#"{"extends": "seed", "key_header": "X-Idempotency-Key",
            "replay_header": "X-Idempotent-Replayed", "lacks": ["GET", "PATCH", "DELETE"]}"#,
    );

    let (code, out, err) = orders_atk(&[
        "--server",
        &double.address,
        "--profile",
        profile.to_str().unwrap(),
        "--concurrency",
        "8",
    ]);

    eprintln!("{out}\n{err}");
    // Every check judged, no deviation: the key went in its header, the
    // replays were seen by theirs, the orders were found by the listing.
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert!(
        out.ends_with("\n14 blocked, 0 exposed, 0 not run, 2 skipped, 0 deviations\n"),
        "{out}"
    );
    assert!(
        out.contains("skipped: the profile says the target lacks GET, PATCH, DELETE"),
        "{out}"
    );
    assert!(!out.contains("Cannot DELETE"), "{out}");
    assert!(
        out.contains("the profile says the target lacks DELETE"),
        "{out}"
    );
}

#[test]
fn a_profile_that_extends_a_shape_takes_its_values_for_the_members_it_leaves_out() {
    let double = Layered::start(Layer::CAREFUL, App::STRICT);
    // `extends: seed` gives `/orders` and no `limit=100`.
    let profile = profile_file("extends.json", r#"{"extends": "seed", "id_field": "id"}"#);

    let (code, out, err) = orders_atk(&[
        "--server",
        &double.address,
        "--profile",
        profile.to_str().unwrap(),
        "--only",
        "ATK-01,ATK-04",
    ]);

    assert_eq!(code, Some(0), "{out}\n{err}");
    assert!(
        out.contains(&format!("against {}/orders", double.address)),
        "{out}"
    );
}

#[test]
fn the_text_report_shows_a_target_s_repeated_html_page_once_cut_to_its_stated_length() {
    // No DELETE, and the profile does not say so: the cleanup's every
    // cancel is answered the same HTML page.
    let double = Layered::start(
        Layer::CAREFUL,
        App {
            has_delete: false,
            ..App::STRICT
        },
    );

    let profile = profile_file("no-lacks.json", r#"{"extends": "seed", "lacks": []}"#);

    let (_, out, err) = orders_atk(&[
        "--server",
        &double.address,
        "--profile",
        profile.to_str().unwrap(),
        "--concurrency",
        "8",
    ]);

    eprintln!("{out}\n{err}");
    let pages = out.lines().filter(|l| l.contains("Cannot DELETE")).count();
    assert_eq!(pages, 1, "{out}");
    assert!(out.contains("bodies cut to "), "{out}");
}

#[test]
fn a_non_integer_quantity_s_exposure_names_exactly_the_bodies_that_created_orders() {
    // Each body has a key of its own; the app takes 1.0 and 1e2 only.
    let double = Layered::start(
        Layer::CAREFUL,
        App {
            lax_quantity: true,
            ..App::STRICT
        },
    );

    let report = run(&double, "ATK-11", 8);

    let exposed = exposures(&report).join("\n");
    assert!(
        exposed.contains("quantity 1.0 created order")
            && exposed.contains("quantity 1e2 created order"),
        "{}",
        report.evidence()
    );
    for refused in [
        "quantity \"1\"",
        "quantity 1.5",
        "quantity true",
        "quantity null",
    ] {
        assert!(
            !exposed.contains(refused),
            "{refused}: {}",
            report.evidence()
        );
    }
}

#[test]
fn a_race_counts_creations_by_the_orders_made_and_names_replays_without_the_replay_header() {
    // The layer marks its replays with a header the runner is not told of.
    let double = Layered::start(
        Layer {
            replay_header: "X-Cache-Hit",
            ..Layer::CAREFUL
        },
        App::STRICT,
    );

    let report = run(&double, "ATK-05", 8);

    assert!(report.blocked(), "{}", report.evidence());
    assert_eq!(double.order_count(), 1 + 3, "{}", report.evidence());
    let evidence = report.evidence();
    assert!(
        evidence.contains("8 requests made 1 new order(s)") && evidence.contains("1 creation"),
        "{evidence}"
    );
    assert!(
        report.deviations.iter().any(|d| d
            .starts_with("round 1: 7 concurrent duplicates returned order")
            && d.contains("replays without the replay header")),
        "{evidence}"
    );
    assert!(
        !report
            .deviations
            .iter()
            .any(|d| d.contains("answered as creations")),
        "{evidence}"
    );
}

#[test]
fn a_refused_retry_of_a_completed_request_is_named_as_what_the_client_would_believe() {
    let double = Layered::start(
        Layer {
            refuses_retries: true,
            ..Layer::CAREFUL
        },
        App::STRICT,
    );

    let report = run(&double, "EXT-04", 8);

    assert!(report.blocked(), "{}", report.evidence());
    assert!(
        report.deviations.iter().any(|d| d
            .starts_with("the retry of the request that created order")
            && d.contains("was refused (422")
            && d.contains("a client would think the order it created failed")),
        "{}",
        report.evidence()
    );
}
