//! A run's report as text (for people), JSON (everything) or JUnit XML
//! (for CI). Each carries every check's verdict, its reasons, its
//! deviations and the requests that got no answer; the text's last line
//! counts the verdicts. A checked history (from `history` or `chaos`) is
//! reported the same three ways: one test case per rule, each violation
//! with its counterexample.

use std::fmt::Write;
use std::io::Write as _;
use std::path::Path;

use super::chaos::ChaosReport;
use super::history::{Checked, HistoryReport, Rule};
use super::probe::{EVIDENCE_CHARS, Exchange, fold, trim};
use super::{AtkError, CheckReport, Format, RunReport, Verdict};

/// Violations shown in full in a text report; the rest are counted.
const VIOLATIONS_SHOWN: usize = 20;

/// Writes a report: `render(format)` to `out`, and then the `text` report to
/// stdout; without `out`, `render(format)` to stdout.
pub fn emit(
    text: &str,
    render: &dyn Fn(Format) -> String,
    format: Format,
    out: Option<&Path>,
) -> Result<(), AtkError> {
    let mut stdout = std::io::stdout().lock();
    let stdout_error = |source| AtkError::Write {
        path: "stdout".into(),
        source,
    };
    match out {
        Some(path) => {
            std::fs::write(path, render(format)).map_err(|source| AtkError::Write {
                path: path.display().to_string(),
                source,
            })?;
            writeln!(stdout, "report written to {}", path.display()).map_err(stdout_error)?;
            stdout.write_all(text.as_bytes()).map_err(stdout_error)?;
        }
        None => stdout
            .write_all(render(format).as_bytes())
            .map_err(stdout_error)?,
    }
    stdout.flush().map_err(stdout_error)
}

/// Body characters shown per exchange in the text of a check that was not blocked.
const FULL_BODY_CHARS: usize = 300;
/// Order ids named per cleanup problem; the rest are counted.
const CLEANUP_IDS_SHOWN: usize = 5;

pub fn render(report: &RunReport, format: Format) -> String {
    match format {
        Format::Text => text(report),
        Format::Json => json(report),
        Format::Junit => junit(report),
    }
}

fn text(report: &RunReport) -> String {
    let mut out = String::new();
    let auth = if report.authenticated {
        "bearer tokens"
    } else {
        "no Authorization"
    };
    let _ = writeln!(
        out,
        "orders-api atk against {}{} ({auth}; run {}, orders' item {})",
        report.server, report.shape.base_path, report.run_id, report.item
    );
    let _ = writeln!(
        out,
        "bodies cut to {FULL_BODY_CHARS} characters, whitespace folded, repeated lines \
         counted (the JSON report keeps each body's first {EVIDENCE_CHARS})\n"
    );
    for check in &report.checks {
        let _ = writeln!(
            out,
            "{}  {}  {}",
            check.verdict.label(),
            check.id,
            check.title
        );
        out.push_str(&evidence(check, "      "));
    }
    let cleanup = &report.cleanup;
    if cleanup.kept {
        let _ = writeln!(
            out,
            "\nkept the {} order(s) of this run (item {}, --keep)",
            cleanup.orders, report.item
        );
    } else if let Some(why) = &cleanup.not_tried {
        let _ = writeln!(
            out,
            "\nleft the {} order(s) of this run (item {}) as they are: {why}",
            cleanup.orders, report.item
        );
    } else {
        let _ = writeln!(
            out,
            "\ncancelled {} of the {} order(s) of this run (item {})",
            cleanup.cancelled, cleanup.orders, report.item
        );
        // One line per distinct answer: a target without DELETE answers each alike.
        let mut by_answer: Vec<(&str, Vec<&str>)> = Vec::new();
        for problem in &cleanup.problems {
            let (id, answer) = problem.split_once(": ").unwrap_or((problem, ""));
            match by_answer.iter_mut().find(|(a, _)| *a == answer) {
                Some((_, ids)) => ids.push(id),
                None => by_answer.push((answer, vec![id])),
            }
        }
        for (answer, ids) in by_answer {
            let shown = ids
                .iter()
                .take(CLEANUP_IDS_SHOWN)
                .copied()
                .collect::<Vec<_>>();
            let more = if ids.len() > shown.len() { ", …" } else { "" };
            let _ = writeln!(
                out,
                "  could not cancel {} order(s) ({}{more}): {answer}",
                ids.len(),
                shown.join(", ")
            );
        }
    }
    if report.deviations > 0 && !report.strict {
        let _ = writeln!(out, "deviations do not fail the run without --strict");
    }
    let unanswered = unanswered(report);
    if unanswered > 0 {
        let _ = writeln!(
            out,
            "{unanswered} request(s) got no answer: each is listed under its check"
        );
    }
    let _ = writeln!(out, "{}", report.summary());
    out
}

/// Requests of the whole run that got no answer.
fn unanswered(report: &RunReport) -> usize {
    report.checks.iter().map(|c| c.unanswered.len()).sum()
}

/// What a check saw, one line per fact, each starting with `indent`: for a
/// skip its reason; for a blocked attack its deviations, the requests that
/// got no answer, the requests and statuses; otherwise the reasons, the
/// expectation, the requests without an answer and every exchange with
/// headers and bodies.
pub(super) fn evidence(check: &CheckReport, indent: &str) -> String {
    let mut out = String::new();
    match &check.verdict {
        Verdict::Skipped { reason } => {
            let _ = writeln!(out, "{indent}skipped: {reason}");
            return out;
        }
        Verdict::NotRun { reason } => {
            let _ = writeln!(out, "{indent}not run: {reason}");
        }
        Verdict::Exposed { exposed } => {
            for what in exposed {
                let _ = writeln!(out, "{indent}exposed: {what}");
            }
            let _ = writeln!(out, "{indent}expected: {}", check.expects);
        }
        Verdict::Blocked => {}
    }
    for deviation in &check.deviations {
        let _ = writeln!(out, "{indent}deviation: {deviation}");
    }
    for note in &check.notes {
        let _ = writeln!(out, "{indent}{note}");
    }
    for request in &check.unanswered {
        let _ = writeln!(out, "{indent}no answer: {request}");
    }
    let full = !check.blocked();
    let mut lines: Vec<(String, usize)> = Vec::new();
    let exchanges = check
        .control
        .iter()
        .map(|e| exchange_text(e, indent, "control: ", full))
        .chain(
            check
                .exchanges
                .iter()
                .map(|e| exchange_text(e, indent, "", full)),
        );
    for text in exchanges {
        match lines.iter_mut().find(|(seen, _)| *seen == text) {
            Some((_, count)) => *count += 1,
            None => lines.push((text, 1)),
        }
    }
    for (text, count) in lines {
        match count {
            1 => out.push_str(&text),
            n => {
                let _ = writeln!(out, "{} (×{n})", text.trim_end_matches('\n'));
            }
        }
    }
    out
}

fn exchange_text(exchange: &Exchange, indent: &str, prefix: &str, full: bool) -> String {
    let request = &exchange.request;
    let user = request
        .user
        .map(|u| format!(" as {u:?}"))
        .unwrap_or_default();
    let mut line = format!("{indent}{prefix}{} {}{user}", request.method, request.path);
    let shown_headers = request
        .headers
        .iter()
        .filter(|(n, _)| n != "Authorization" && (full || n != "Content-Type"));
    for (name, value) in shown_headers {
        let _ = write!(line, " {name}: {value}");
    }
    if full && let Some(body) = &request.body {
        let _ = write!(
            line,
            "\n{indent}  body {}",
            trim(&fold(body), FULL_BODY_CHARS)
        );
    }
    let arrow = if full {
        format!("\n{indent}  →")
    } else {
        " →".to_owned()
    };
    match (&exchange.response, &exchange.error) {
        (Some(answer), _) => {
            let _ = write!(line, "{arrow} {}", answer.status);
            if full {
                for (name, value) in &answer.headers {
                    let _ = write!(line, " {name}: {value}");
                }
                let _ = write!(line, " {}", trim(&fold(&answer.body), FULL_BODY_CHARS));
            }
        }
        (None, Some(error)) => {
            let _ = write!(line, "{arrow} no answer: {error}");
        }
        (None, None) => {}
    }
    line.push('\n');
    line
}

/// A check JUnit counts as failed: exposed, or deviating under `--strict`.
fn fails(check: &CheckReport, strict: bool) -> bool {
    check.exposed() || (strict && check.blocked() && !check.deviations.is_empty())
}

fn junit(report: &RunReport) -> String {
    let seconds = |millis: u128| format!("{:.3}", millis as f64 / 1000.0);
    let mut out = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    let failures = report
        .checks
        .iter()
        .filter(|c| fails(c, report.strict))
        .count();
    let counts = format!(
        r#"tests="{}" failures="{failures}" skipped="{}" time="{}""#,
        report.checks.len(),
        report.not_run + report.skipped,
        seconds(report.millis)
    );
    let _ = writeln!(out, r#"<testsuites name="orders-api atk" {counts}>"#);
    let _ = writeln!(
        out,
        r#"  <testsuite name="orders-api atk" errors="0" {counts}>"#
    );
    let _ = writeln!(out, "    <properties>");
    let (blocked, exposed, not_run, skipped, deviations, unanswered) = (
        report.blocked.to_string(),
        report.exposed.to_string(),
        report.not_run.to_string(),
        report.skipped.to_string(),
        report.deviations.to_string(),
        unanswered(report).to_string(),
    );
    for (name, value) in [
        ("server", report.server.as_str()),
        ("base_path", report.shape.base_path.as_str()),
        ("run_id", report.run_id.as_str()),
        ("item", report.item.as_str()),
        ("blocked", blocked.as_str()),
        ("exposed", exposed.as_str()),
        ("not_run", not_run.as_str()),
        ("skipped", skipped.as_str()),
        ("deviations", deviations.as_str()),
        ("unanswered", unanswered.as_str()),
    ] {
        let _ = writeln!(
            out,
            "      <property name=\"{name}\" value=\"{}\"/>",
            xml(value)
        );
    }
    let _ = writeln!(out, "    </properties>");
    for check in &report.checks {
        let _ = write!(
            out,
            "    <testcase classname=\"atk\" name=\"{}\" time=\"{}\">",
            xml(&format!("{} {}", check.id, check.title)),
            seconds(check.millis)
        );
        let evidence = xml(&format!(
            "{}\n{}",
            check.verdict.label(),
            evidence(check, "")
        ));
        match &check.verdict {
            Verdict::Exposed { exposed } => {
                let _ = write!(
                    out,
                    "\n      <failure message=\"{}\" type=\"EXPOSED\">{evidence}</failure>\n    ",
                    xml(&format!("EXPOSED: {}", exposed.join("; ")))
                );
            }
            Verdict::Blocked if fails(check, report.strict) => {
                let _ = write!(
                    out,
                    "\n      <failure message=\"{}\" type=\"deviation\">{evidence}</failure>\n    ",
                    xml(&format!(
                        "BLOCKED with deviations (--strict): {}",
                        check.deviations.join("; ")
                    ))
                );
            }
            Verdict::Blocked => {
                let _ = write!(out, "\n      <system-out>{evidence}</system-out>\n    ");
            }
            Verdict::NotRun { reason } => {
                let _ = write!(
                    out,
                    "\n      <skipped message=\"{}\"/>\n      <system-out>{evidence}</system-out>\n    ",
                    xml(&format!("NOT RUN: {reason}"))
                );
            }
            Verdict::Skipped { reason } => {
                let _ = write!(
                    out,
                    "\n      <skipped message=\"{}\"/>\n    ",
                    xml(&format!("SKIPPED: {reason}"))
                );
            }
        }
        let _ = writeln!(out, "</testcase>");
    }
    let _ = writeln!(
        out,
        "    <system-out>{}</system-out>",
        xml(&format!(
            "{}\ncleanup: {} of {} order(s) cancelled{}",
            report.summary(),
            report.cleanup.cancelled,
            report.cleanup.orders,
            if report.cleanup.kept { " (--keep)" } else { "" }
        ))
    );
    let _ = writeln!(out, "  </testsuite>\n</testsuites>");
    out
}

/// The rules and their violations, as text: one line per rule (`PASS` or
/// `FAIL` and how many), then each violation with its counterexample.
fn rules_text(checked: &Checked, out: &mut String) {
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

fn violation_text(violation: &crate::history::Violation) -> String {
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

fn checked_summary(checked: &Checked) -> String {
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

/// `orders-api atk history`'s text report.
fn history_text(report: &HistoryReport) -> String {
    let mut out = format!("orders-api atk history {}\n\n", report.file);
    rules_text(&report.checked, &mut out);
    let _ = writeln!(out, "\n{}", checked_summary(&report.checked));
    out
}

/// `orders-api atk history`'s report in `format`.
pub fn history(report: &HistoryReport, format: Format) -> String {
    match format {
        Format::Text => history_text(report),
        Format::Json => json(report),
        Format::Junit => rules_junit(
            "orders-api atk history",
            &report.checked,
            report.millis,
            &[("file", report.file.clone())],
            &[],
        ),
    }
}

fn json(report: &impl serde::Serialize) -> String {
    // A report is plain data: serializing it cannot fail.
    let mut json = serde_json::to_string_pretty(report).unwrap_or_default();
    json.push('\n');
    json
}

/// `orders-api atk chaos`'s text report.
fn chaos_text(report: &ChaosReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "orders-api atk chaos against {} through {} (run {}, seed {}, {} clients as {}, {} s)\n",
        report.server,
        report.proxy,
        report.run_id,
        report.seed,
        report.clients,
        report.users.join(" and "),
        report.duration_secs
    );
    for (f, c) in &report.operations {
        let _ = writeln!(
            out,
            "{f:>6}: {} attempts, {} ok, {} fail, {} info",
            c.attempts, c.ok, c.fail, c.info
        );
    }
    let f = &report.faults;
    let _ = writeln!(
        out,
        "proxy: {} requests, {} passed, {} delayed, {} dropped before the server, {} answers dropped, \
         {} resets, {} answered 502 (no answer from the server)",
        f.requests,
        f.passed,
        f.delayed,
        f.dropped_requests,
        f.dropped_answers,
        f.resets,
        f.server_unreachable
    );
    if !report.restarts.is_empty() {
        let failed = report.restarts.iter().filter(|r| !r.ok).count();
        let _ = writeln!(
            out,
            "restarts: {} ({failed} failed{})",
            report.restarts.len(),
            report
                .restarts
                .iter()
                .find(|r| !r.ok)
                .map(|r| format!(": {}", r.outcome))
                .unwrap_or_default()
        );
    }
    if let Some(file) = &report.history_file {
        let _ = writeln!(out, "history: {file} ({} events)", report.lines.len());
    }
    out.push('\n');
    for problem in &report.problems {
        let _ = writeln!(out, "cannot judge: {problem}");
    }
    rules_text(&report.check, &mut out);
    let _ = writeln!(out, "\n{}", checked_summary(&report.check));
    out
}

/// `orders-api atk chaos`'s report in `format`.
pub fn chaos(report: &ChaosReport, format: Format) -> String {
    match format {
        Format::Text => chaos_text(report),
        Format::Json => json(report),
        Format::Junit => {
            let acknowledged = if report.acknowledged > 0 {
                None
            } else {
                Some("no create, update or cancel was answered 2xx".to_owned())
            };
            let mut extra: Vec<(&str, Option<String>)> =
                vec![("something acknowledged", acknowledged)];
            for problem in &report.problems {
                extra.push(("the run could be judged", Some(problem.clone())));
            }
            rules_junit(
                "orders-api atk chaos",
                &report.check,
                report.millis,
                &[
                    ("server", report.server.clone()),
                    ("run_id", report.run_id.clone()),
                    ("seed", report.seed.to_string()),
                    ("acknowledged", report.acknowledged.to_string()),
                    ("restarts", report.restarts.len().to_string()),
                ],
                &extra,
            )
        }
    }
}

/// One `<testcase>` per rule (a `<failure>` with the counterexamples when
/// broken), plus `extra` test cases (a failure when they carry a reason).
fn rules_junit(
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

/// Text as XML character data or an attribute value; characters XML 1.0
/// cannot hold become U+FFFD.
fn xml(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\t' | '\n' | '\r' => out.push(c),
            c if (c as u32) < 0x20 || c == '\u{FFFE}' || c == '\u{FFFF}' => out.push('\u{FFFD}'),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::{Shown, Violation};

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

    #[test]
    fn xml_escapes_markup_and_drops_what_xml_cannot_hold() {
        assert_eq!(
            xml("<a href=\"x\">'&'</a>\u{1}\t"),
            "&lt;a href=&quot;x&quot;&gt;&apos;&amp;&apos;&lt;/a&gt;\u{FFFD}\t"
        );
    }
}
