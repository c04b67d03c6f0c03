//! `chaos` against two small implementations of this contract's API
//! (tests/support/orders_double.rs): one that keeps it, whose history comes
//! out consistent through every fault the proxy injects, and one whose key
//! replays its first answer for a changed body, which the check catches
//! with the offending key's events. Through the library and through the
//! binary, whose `--history` file `history` then checks alike.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::process::Command;
use std::time::Duration;

use orders_atk::Format;
use orders_atk::chaos::{ChaosConfig, ChaosReport, run_chaos};
use orders_atk::history::Rule;
use support::orders_double::{Mode, OrdersDouble};

const BIN: &str = env!("CARGO_BIN_EXE_orders-atk");

fn chaos_against(double: &OrdersDouble, seed: u64) -> ChaosReport {
    let mut config = ChaosConfig::new(&double.address, None);
    config.duration = Duration::from_secs(3);
    config.clients = 4;
    config.seed = seed;
    run_chaos(config).unwrap()
}

#[test]
fn chaos_finds_the_history_of_a_faithful_implementation_consistent_through_every_fault() {
    let double = OrdersDouble::start(Mode::Faithful);

    let report = chaos_against(&double, 7);

    let text = report.render(Format::Text);
    assert!(report.check.consistent(), "{text}");
    assert!(report.problems.is_empty(), "{text}");
    assert!(report.outcome().is_ok(), "{text}");
    assert!(report.acknowledged > 0, "{text}");
    // Every kind of operation ran, and the proxy broke some of them.
    for f in ["create", "update", "cancel", "read", "list"] {
        assert!(
            report.operations.get(f).is_some_and(|c| c.ok > 0),
            "no ok {f}\n{text}"
        );
    }
    let creates = &report.operations["create"];
    assert!(
        creates.fail > 0,
        "another body under a used key is refused\n{text}"
    );
    assert!(creates.info > 0, "some creates' outcome is unknown\n{text}");
    let faults = &report.faults;
    assert!(
        faults.dropped_answers > 0
            && faults.dropped_requests > 0
            && faults.resets > 0
            && faults.delayed > 0,
        "{faults:?}"
    );
    assert!(text.contains("\nconsistent: 0 violation(s); "), "{text}");
}

#[test]
fn chaos_against_a_target_that_replays_a_changed_body_is_inconsistent_and_shows_the_offending_key()
{
    let double = OrdersDouble::start(Mode::ReplaysChangedBody);

    let report = chaos_against(&double, 11);

    let text = report.render(Format::Text);
    let violation = report
        .check
        .of(Rule::OtherRequestNeverOk)
        .next()
        .unwrap_or_else(|| panic!("{text}"));
    let key = violation.key.as_deref().expect("the offending key");
    assert!(
        key.starts_with(&format!("chaos-{}-", report.run_id)),
        "{key}"
    );
    // Its events: the two requests under the key and their ok answers.
    assert!(violation.events.len() >= 4, "{violation:?}");
    for event in &violation.events {
        assert!(
            event.text.contains(&format!("\"key\":\"{key}\"")),
            "{event:?}"
        );
    }
    assert!(
        text.contains(&format!(
            "INCONSISTENT  other-request-never-ok  key \"{key}\""
        )),
        "{text}"
    );
    let refused = report.outcome().unwrap_err();
    assert_eq!(refused.exit_code(), 1);
    assert!(
        refused
            .to_string()
            .starts_with("the history is inconsistent"),
        "{refused}"
    );
}

#[test]
fn the_binary_s_chaos_exit_code_follows_the_check_and_its_history_file_checks_the_same() {
    for (mode, expected) in [(Mode::Faithful, 0), (Mode::ReplaysChangedBody, 1)] {
        let double = OrdersDouble::start(mode);
        let dir = std::env::temp_dir().join(format!("chaos-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        let history = dir.join("history.jsonl");
        let junit = dir.join("chaos.xml");

        let chaos = Command::new(BIN)
            .args([
                "chaos",
                "--server",
                &double.address,
                "--duration",
                "2",
                "--clients",
                "3",
                "--seed",
                "5",
            ])
            .args([
                "--history",
                history.to_str().unwrap(),
                "--format",
                "junit",
                "--out",
                junit.to_str().unwrap(),
            ])
            .env_remove("ORDERS_API_TOKEN")
            .env_remove("ORDERS_API_TOKEN_B")
            .output()
            .unwrap();
        let out = String::from_utf8_lossy(&chaos.stdout).into_owned();
        let err = String::from_utf8_lossy(&chaos.stderr).into_owned();
        assert_eq!(
            chaos.status.code(),
            Some(expected),
            "{mode:?}\n{out}\n{err}"
        );
        let xml = std::fs::read_to_string(&junit).unwrap();
        assert!(
            xml.contains(r#"<testsuite name="orders-api atk chaos""#),
            "{xml}"
        );
        assert_eq!(
            xml.matches("<testcase ").count(),
            Rule::ALL.len() + 1,
            "{xml}"
        );
        assert_eq!(xml.contains("<failure"), expected == 1, "{xml}");

        let checked = Command::new(BIN)
            .args(["history", history.to_str().unwrap()])
            .output()
            .unwrap();
        let again = String::from_utf8_lossy(&checked.stdout).into_owned();
        assert_eq!(checked.status.code(), Some(expected), "{again}");
        // The same verdict line as chaos's own.
        let verdict = |text: &str| {
            text.lines()
                .rev()
                .find(|l| l.contains(" violation(s); "))
                .map(str::to_owned)
        };
        assert_eq!(verdict(&again), verdict(&out), "{again}\n{out}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
