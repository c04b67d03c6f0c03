//! `orders-api atk`, the real binary, against a spawned server: its exit
//! code, its summary line, its JUnit file, its cleanup.

use std::process::{Command, Output};

use orders_api::db::Backend;
use orders_atk::ATTACKS;

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
    fn orders_api_atk_passes_every_check_against_this_service_writes_junit_and_cancels_its_orders(backend) {
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
        assert!(out.contains(&format!("\n{all} passed, 0 failed, 0 skipped\n")), "{out}");
        for attack in ATTACKS {
            assert!(out.contains(&format!("PASS  {}  {}", attack.id, attack.title)), "{out}");
        }
        assert!(!out.contains(&app.token) && !out.contains(&bob), "the report shows no token");

        let xml = std::fs::read_to_string(&junit).expect("the JUnit file");
        let _ = std::fs::remove_file(&junit);
        assert!(xml.starts_with("<?xml"), "{xml}");
        assert!(xml.contains(&format!(r#"tests="{all}" failures="0""#)), "{xml}");
        assert_eq!(xml.matches("<testcase ").count(), all, "{xml}");
        assert_eq!(xml.matches("<failure").count(), 0, "{xml}");
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
fn without_tokens_orders_api_atk_skips_every_check_says_why_and_exits_0() {
    let app = TestApp::spawn(Backend::Sqlite);

    let output = orders_api_atk(&["--server", &app.address], &[]);

    let out = stdout(&output);
    assert!(output.status.success(), "{out}\n{}", stderr(&output));
    assert!(
        out.contains(&format!(
            "\n0 passed, 0 failed, {} skipped\n",
            ATTACKS.len()
        )),
        "{out}"
    );
    assert!(out.contains("SKIP  ATK-03"), "{out}");
    assert!(out.contains("skipped: no --token"), "{out}");
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
    assert!(out.contains("\n1 passed, 0 failed, 2 skipped\n"), "{out}");
    assert_eq!(out.matches("skipped: no --token-b").count(), 2, "{out}");
}

#[test]
fn orders_api_atk_exits_non_zero_with_the_evidence_when_a_check_fails() {
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
    assert!(out.contains("FAIL  ATK-03"), "{out}");
    assert!(
        out.contains("was answered 200 with the first order"),
        "{out}"
    );
    assert!(out.contains("\n1 passed, 1 failed, 0 skipped\n"), "{out}");
    assert_eq!(err.trim(), "orders-api: 1 of 2 checks failed");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("the JSON report"))
            .expect("JSON");
    let _ = std::fs::remove_file(&json);
    assert_eq!(report["failed"], 1);
    let atk_03 = &report["checks"][1];
    assert_eq!(atk_03["id"], "ATK-03");
    assert_eq!(atk_03["status"], "fail");
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
