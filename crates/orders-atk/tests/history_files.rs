//! `orders-atk history FILE` on the hand-written histories of
//! tests/histories/: its exit code (0 consistent, 1 inconsistent, 2
//! malformed) and what it prints.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_orders-atk");

fn history(name: &str) -> Output {
    let file = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/histories")
        .join(name);
    Command::new(BIN).arg("history").arg(file).output().unwrap()
}

fn texts(output: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn a_consistent_history_exits_0_and_passes_every_rule() {
    let output = history("consistent.jsonl");
    let (out, err) = texts(&output);
    assert_eq!(output.status.code(), Some(0), "{out}\n{err}");
    assert_eq!(out.matches("\nPASS  ").count(), 6, "{out}");
    assert!(out.ends_with("consistent: 0 violation(s); 20 events, 10 operations, 4 keys, 3 orders of 1 user(s), 3 acknowledged\n"), "{out}");
}

#[test]
fn each_inconsistent_history_exits_1_with_its_rule_and_the_offending_key_s_events() {
    for (file, rule, first_line) in [
        ("two-orders-one-key.jsonl", "one-order-per-key", 1),
        ("changed-body-replayed.jsonl", "other-request-never-ok", 1),
        (
            "lost-acknowledged-order.jsonl",
            "acknowledged-create-listed-once",
            1,
        ),
        ("stale-read.jsonl", "order-linearizable", 1),
    ] {
        let output = history(file);
        let (out, err) = texts(&output);
        assert_eq!(output.status.code(), Some(1), "{file}\n{out}\n{err}");
        assert!(out.contains(&format!("FAIL  {rule}: ")), "{file}\n{out}");
        assert!(
            out.contains(&format!(
                "INCONSISTENT  {rule}  key \"k-17\" of user \"alice\""
            )),
            "{file}\n{out}"
        );
        assert!(
            out.contains(&format!("\n  line {first_line:>6}  {{\"process\"")),
            "{file}\n{out}"
        );
        assert!(
            err.starts_with(&format!(
                "orders-atk: the history is inconsistent: 1 violation(s) of {rule}"
            )),
            "{file}\n{err}"
        );
    }
}

#[test]
fn a_malformed_history_exits_2_naming_the_line_and_why() {
    let output = history("malformed-type.jsonl");
    let (out, err) = texts(&output);
    assert_eq!(output.status.code(), Some(2), "{out}\n{err}");
    assert!(out.is_empty(), "{out}");
    assert!(
        err.contains(
            "malformed-type.jsonl is not a history that can be checked: line 5: `type` must be"
        ),
        "{err}"
    );

    let missing = Command::new(BIN)
        .args(["history", "/nonexistent/history.jsonl"])
        .output()
        .unwrap();
    assert_eq!(missing.status.code(), Some(2));
}

#[test]
fn a_history_on_stdin_and_a_json_report_are_read_and_written_alike() {
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/histories/stale-read.jsonl");
    let output = Command::new(BIN)
        .args(["history", "-", "--format", "json"])
        .stdin(std::fs::File::open(file).unwrap())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["violations"][0]["rule"], "order_linearizable");
    assert_eq!(
        report["violations"][0]["order"],
        "0193a5b2-7c4d-7e8f-9a0b-1c2d3e4f5a6b"
    );
    assert_eq!(
        report["violations"][0]["events"].as_array().unwrap().len(),
        6
    );
}
