//! A run's report as text (for people), JSON (everything) or JUnit XML
//! (for CI). Each carries every check's verdict, its reasons, its
//! deviations and the requests that got no answer; the text's last line
//! counts the verdicts.

use std::fmt::Write;

use crate::output::{json, xml};
use crate::probe::{EVIDENCE_CHARS, Exchange, fold, trim};
use crate::{CheckReport, Format, RunReport, Verdict};

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
