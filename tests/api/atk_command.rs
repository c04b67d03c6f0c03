//! `orders-api atk`, the real binary, against a spawned server: its
//! verdicts, its exit code, its count line, its JUnit and JSON files, its
//! cleanup.

use std::process::{Command, Output};

use orders_api::db::Backend;
use orders_atk::{ATTACKS, Needs};

use crate::atk_broken::{Breakage, BrokenFront};
use crate::both_backends;
use crate::helpers::*;

const BIN: &str = env!("CARGO_BIN_EXE_orders-api");

/// Runs `orders-api atk ARGS` with a clean environment (plus `env`).
fn orders_api_atk(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(BIN)
        .arg("atk")
        .args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .envs(env.iter().copied())
        .output()
        .expect("run orders-api atk")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

both_backends! {
    fn orders_api_atk_finds_every_attack_blocked_by_this_service_exits_0_writes_junit_and_cancels_its_orders(backend) {
        let app = TestApp::spawn(backend);
        let bob = app.create_token("bob");
        let junit = std::env::temp_dir().join(format!("atk-{}.xml", uuid::Uuid::new_v4().simple()));

        let output = orders_api_atk(
            &[
                "--server", &app.address,
                "--concurrency", "20",
                "--format", "junit",
                "--out", junit.to_str().expect("path"),
            ],
            &[("ORDERS_API_TOKEN", &app.token), ("ORDERS_API_TOKEN_B", &bob)],
        );

        let (out, err) = (stdout(&output), stderr(&output));
        assert!(output.status.success(), "exit {:?}\n{out}\n{err}", output.status);
        let all = ATTACKS.len();
        assert!(
            out.ends_with(&format!("\n{all} blocked, 0 exposed, 0 not run, 0 skipped, 0 deviations\n")),
            "{out}"
        );
        for attack in ATTACKS {
            assert!(out.contains(&format!("BLOCKED  {}  {}", attack.id, attack.title)), "{out}");
        }
        assert!(!out.contains("deviation:"), "{out}");
        assert!(!out.contains(&app.token) && !out.contains(&bob), "the report shows no token");

        let xml = std::fs::read_to_string(&junit).expect("the JUnit file");
        let _ = std::fs::remove_file(&junit);
        assert!(xml.starts_with("<?xml"), "{xml}");
        assert!(xml.contains(&format!(r#"tests="{all}" failures="0""#)), "{xml}");
        assert_eq!(xml.matches("<testcase ").count(), all, "{xml}");
        assert_eq!(xml.matches("<failure").count(), 0, "{xml}");
        assert_eq!(xml.matches("<skipped").count(), 0, "{xml}");
        assert!(xml.contains(&format!(r#"<property name="blocked" value="{all}"/>"#)), "{xml}");
        assert!(!xml.contains(&app.token), "the JUnit file shows no token");

        // Every order the run created is cancelled, for both users.
        let created = app.order_count();
        assert!(created > 10, "the run created {created} orders");
        let mut seen = 0;
        for token in [&app.token, &bob] {
            let list = app.call_as(token, "GET", "/v1/orders?limit=100", None, None).json();
            for order in list["data"].as_array().expect("data") {
                assert_eq!(order["status"], "cancelled", "{order}");
                assert!(order["item"].as_str().is_some_and(|i| i.starts_with("atk-")), "{order}");
                seen += 1;
            }
        }
        assert_eq!(seen, created);
    }
}

#[test]
fn without_a_token_orders_api_atk_judges_nothing_says_what_the_control_got_and_exits_non_zero() {
    let app = TestApp::spawn(Backend::Sqlite);

    let output = orders_api_atk(&["--server", &app.address], &[]);

    let (out, err) = (stdout(&output), stderr(&output));
    assert_eq!(output.status.code(), Some(1), "{out}\n{err}");
    let tenancy = ATTACKS
        .iter()
        .filter(|a| a.needs == Needs::TwoUsers)
        .count();
    let one_user = ATTACKS.len() - tenancy;
    assert!(
        out.ends_with(&format!(
            "\n0 blocked, 0 exposed, {one_user} not run, {tenancy} skipped, 0 deviations\n"
        )),
        "{out}"
    );
    assert!(out.contains("NOT RUN  ATK-03"), "{out}");
    assert_eq!(
        out.matches("not run: the control (a valid create with a fresh key) was answered 401 ")
            .count(),
        one_user,
        "{out}"
    );
    assert!(
        out.contains("; no --token was given, and the target requires authentication — "),
        "{out}"
    );
    assert!(
        out.contains("control: POST /v1/orders Idempotency-Key:"),
        "the control's exchange is the evidence: {out}"
    );
    assert!(out.contains("(no Authorization; run "), "{out}");
    assert!(
        err.starts_with("orders-api: no check could run, nothing was judged: "),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    assert_eq!(app.order_count(), 0);
}

#[test]
fn without_a_second_token_orders_api_atk_skips_only_the_tenancy_checks() {
    let app = TestApp::spawn(Backend::Sqlite);

    let output = orders_api_atk(
        &[
            "--server",
            &app.address,
            "--only",
            "ATK-01,EXT-01,EXT-02",
            "--keep",
        ],
        &[("ORDERS_API_TOKEN", &app.token)],
    );

    let out = stdout(&output);
    assert!(output.status.success(), "{out}\n{}", stderr(&output));
    assert!(
        out.ends_with("\n1 blocked, 0 exposed, 0 not run, 2 skipped, 0 deviations\n"),
        "{out}"
    );
    assert_eq!(
        out.matches("skipped: the tenancy checks need two users")
            .count(),
        2,
        "{out}"
    );
}

#[test]
fn orders_api_atk_exits_non_zero_with_the_evidence_when_an_attack_is_exposed() {
    let app = TestApp::spawn(Backend::Sqlite);
    let front = BrokenFront::new(&app.address, Breakage::ConflictAsReplay);
    let json = std::env::temp_dir().join(format!("atk-{}.json", uuid::Uuid::new_v4().simple()));

    let output = orders_api_atk(
        &[
            "--server",
            &front.address,
            "--only",
            "ATK-03,ATK-01",
            "--format",
            "json",
            "--out",
            json.to_str().expect("path"),
        ],
        &[("ORDERS_API_TOKEN", &app.token)],
    );

    let (out, err) = (stdout(&output), stderr(&output));
    eprintln!("{out}");
    assert_eq!(output.status.code(), Some(1), "{out}\n{err}");
    assert!(out.contains("EXPOSED  ATK-03"), "{out}");
    assert!(out.contains("BLOCKED  ATK-01"), "{out}");
    assert!(
        out.contains("was answered 200 with the first order"),
        "{out}"
    );
    assert!(
        out.ends_with("\n1 blocked, 1 exposed, 0 not run, 0 skipped, 0 deviations\n"),
        "{out}"
    );
    assert_eq!(err.trim(), "orders-api: 1 of 2 checks EXPOSED: ATK-03");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("the JSON report"))
            .expect("JSON");
    let _ = std::fs::remove_file(&json);
    assert_eq!(report["exposed"], 1);
    assert_eq!(report["blocked"], 1);
    assert_eq!(report["checks"][0]["verdict"], "blocked");
    let atk_03 = &report["checks"][1];
    assert_eq!(atk_03["id"], "ATK-03");
    assert_eq!(atk_03["verdict"], "exposed");
    assert!(
        atk_03["exposed"][0]
            .as_str()
            .is_some_and(|e| e.contains("was answered 200 with the first order")),
        "{atk_03:#}"
    );
    assert_eq!(
        atk_03["control"][0]["response"]["status"], 201,
        "{atk_03:#}"
    );
    assert_eq!(
        atk_03["exchanges"][1]["response"]["status"], 200,
        "{atk_03:#}"
    );
}

#[test]
fn orders_api_atk_refuses_a_server_not_on_this_machine_unless_allowed() {
    let output = orders_api_atk(&["--server", "http://192.0.2.1:8080", "--token", "x"], &[]);

    assert_eq!(output.status.code(), Some(1));
    let err = stderr(&output);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("--allow-remote"), "{err}");
    assert!(stdout(&output).is_empty());
}
