//! A checked history as a report: one line (or JUnit test case) per rule,
//! each violation with its counterexample. `history` and `chaos` report
//! their checks this way.

use std::fmt::Write;

use crate::history::check::{Checked, Rule, Violation};
use crate::output::xml;

/// Violations shown in full in a text report; the rest are counted.
const VIOLATIONS_SHOWN: usize = 20;

/// The rules and their violations, as text: one line per rule (`PASS` or
/// `FAIL` and how many), then each violation with its counterexample.
pub(crate) fn rules_text(checked: &Checked, out: &mut String) {
    for rule in Rule::ALL {
        let broken = checked.of(rule).count();
        let verdict = if broken == 0 { "PASS" } else { "FAIL" };
        let _ = write!(out, "{verdict}  {}: {}", rule.id(), rule.statement());
        if broken > 0 {
            let _ = write!(out, " ({broken} violation(s))");
        }
        out.push('\n');
    }
    for violation in checked.violations.iter().take(VIOLATIONS_SHOWN) {
        out.push('\n');
        out.push_str(&violation_text(violation));
    }
    if checked.violations.len() > VIOLATIONS_SHOWN {
        let _ = writeln!(
            out,
            "\n… and {} more violation(s) (the JSON report has them all)",
            checked.violations.len() - VIOLATIONS_SHOWN
        );
    }
}

fn violation_text(violation: &Violation) -> String {
    let mut out = String::new();
    let mut whose = format!("user {:?}", violation.user);
    if let Some(key) = &violation.key {
        whose = format!("key {key:?} of {whose}");
    }
    if let Some(order) = &violation.order {
        let _ = write!(whose, ", order {order}");
    }
    let _ = writeln!(out, "INCONSISTENT  {}  {whose}", violation.rule.id());
    let _ = writeln!(out, "  {}", violation.what);
    let _ = writeln!(
        out,
        "  counterexample ({} event(s)):",
        violation.events.len()
    );
    for event in &violation.events {
        let _ = writeln!(out, "  line {:>6}  {}", event.line, event.text);
    }
    out
}

pub(crate) fn checked_summary(checked: &Checked) -> String {
    let verdict = if checked.consistent() {
        "consistent"
    } else {
        "INCONSISTENT"
    };
    format!(
        "{verdict}: {} violation(s); {} events, {} operations, {} keys, {} orders of {} user(s), {} acknowledged",
        checked.violations.len(),
        checked.events,
        checked.operations,
        checked.keys,
        checked.orders,
        checked.users,
        checked.acknowledged
    )
}

/// One `<testcase>` per rule (a `<failure>` with the counterexamples when
/// broken), plus `extra` test cases (a failure when they carry a reason).
pub(crate) fn rules_junit(
    name: &str,
    checked: &Checked,
    millis: u128,
    properties: &[(&str, String)],
    extra: &[(&str, Option<String>)],
) -> String {
    let seconds = format!("{:.3}", millis as f64 / 1000.0);
    let tests = Rule::ALL.len() + extra.len();
    let failures = Rule::ALL
        .iter()
        .filter(|r| checked.of(**r).next().is_some())
        .count()
        + extra.iter().filter(|(_, why)| why.is_some()).count();
    let counts = format!(r#"tests="{tests}" failures="{failures}" skipped="0" time="{seconds}""#);
    let mut out = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    let _ = writeln!(out, r#"<testsuites name="{name}" {counts}>"#);
    let _ = writeln!(out, r#"  <testsuite name="{name}" errors="0" {counts}>"#);
    let _ = writeln!(out, "    <properties>");
    for (key, value) in properties {
        let _ = writeln!(
            out,
            "      <property name=\"{key}\" value=\"{}\"/>",
            xml(value)
        );
    }
    let _ = writeln!(out, "    </properties>");
    for rule in Rule::ALL {
        let _ = write!(
            out,
            "    <testcase classname=\"history\" name=\"{}: {}\" time=\"0\">",
            rule.id(),
            xml(rule.statement())
        );
        let broken: Vec<String> = checked.of(rule).map(violation_text).collect();
        if !broken.is_empty() {
            let first = checked
                .of(rule)
                .next()
                .map(|v| v.what.clone())
                .unwrap_or_default();
            let _ = write!(
                out,
                "\n      <failure message=\"{}\" type=\"INCONSISTENT\">{}</failure>\n    ",
                xml(&format!("{} violation(s): {first}", broken.len())),
                xml(&broken.join("\n"))
            );
        }
        let _ = writeln!(out, "</testcase>");
    }
    for (test, why) in extra {
        let _ = write!(
            out,
            "    <testcase classname=\"history\" name=\"{}\" time=\"0\">",
            xml(test)
        );
        if let Some(why) = why {
            let _ = write!(
                out,
                "\n      <failure message=\"{}\" type=\"NOT JUDGED\"/>\n    ",
                xml(why)
            );
        }
        let _ = writeln!(out, "</testcase>");
    }
    let _ = writeln!(
        out,
        "    <system-out>{}</system-out>",
        xml(&checked_summary(checked))
    );
    let _ = writeln!(out, "  </testsuite>\n</testsuites>");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::check::Shown;

    #[test]
    fn a_text_report_shows_twenty_violations_in_full_and_counts_the_rest() {
        let violation = |n: usize| Violation {
            rule: Rule::NoOrderWithoutKey,
            user: "alice".into(),
            key: None,
            order: Some(format!("o{n}")),
            what: "no create accounts for it".into(),
            events: vec![Shown {
                line: n,
                text: "{}".into(),
            }],
        };
        let checked = Checked {
            violations: (1..=25).map(violation).collect(),
            ..Checked::default()
        };
        let mut text = String::new();
        rules_text(&checked, &mut text);
        assert_eq!(
            text.matches("\nINCONSISTENT  no-order-without-key").count(),
            VIOLATIONS_SHOWN
        );
        assert!(
            text.contains("… and 5 more violation(s) (the JSON report has them all)"),
            "{text}"
        );
        assert!(text.contains("FAIL  no-order-without-key: no order exists for a key that was never sent (25 violation(s))"), "{text}");
    }
}
