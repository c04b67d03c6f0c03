//! `orders-api atk history FILE`: a history of a service's operations,
//! recorded by any tool as JSON Lines in Jepsen's shape, checked against the
//! idempotency contract.
//!
//! The check is decomposed so that it stays cheap: per (user, key), the
//! requests sent under the key (which one executed, what every ok carried);
//! per user, the closing list against the acknowledged creates (each order
//! there once, none without a key that may have made it); per order, its
//! operations, checked for linearizability against a model of one order.
//!
//! ```
//! use orders_atk::history;
//!
//! let text = r#"
//! {"process": 1, "type": "invoke", "f": "create", "user": "alice", "key": "k-1", "value": {"item": "pen", "quantity": 2, "price": 3.5}, "time": 1}
//! {"process": 1, "type": "ok", "f": "create", "user": "alice", "key": "k-1", "value": {"status": 201, "body": {"id": "o-1", "item": "pen", "quantity": 2, "price": 3.5, "status": "pending"}}, "time": 2}
//! {"process": 2, "type": "invoke", "f": "create", "user": "alice", "key": "k-1", "value": {"item": "pen", "quantity": 9, "price": 3.5}, "time": 3}
//! {"process": 2, "type": "ok", "f": "create", "user": "alice", "key": "k-1", "value": {"status": 200, "body": {"id": "o-1", "item": "pen", "quantity": 2, "price": 3.5, "status": "pending"}}, "time": 4}
//! {"process": "closing", "type": "invoke", "f": "list", "user": "alice", "key": null, "value": null, "time": 5}
//! {"process": "closing", "type": "ok", "f": "list", "user": "alice", "key": null, "value": {"status": 200, "body": [{"id": "o-1", "item": "pen", "quantity": 2, "price": 3.5, "status": "pending"}]}, "time": 6}
//! "#;
//! let checked = history::check(&history::parse(text).unwrap()).unwrap();
//! // Quantity 9 under the key of quantity 2 was answered ok: the key replayed
//! // its first order for another request.
//! assert_eq!(checked.violations[0].rule, history::Rule::OtherRequestNeverOk);
//! assert_eq!(checked.violations[0].key.as_deref(), Some("k-1"));
//! ```

mod canon;
mod check;
mod event;
mod model;
pub(crate) mod report;

use std::path::PathBuf;

pub use canon::{canonical, id_text};
pub use check::{Checked, Rule, Shown, Violation, check};
pub use event::{
    Event, F, History, Malformed, Operation, Outcome, Process, Type, parse, parse_lines,
};

use crate::{AtkError, Format};

/// `orders-api atk history`'s arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct HistoryArgs {
    /// The history: JSON Lines, one event a line (`-` reads stdin).
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
    /// The report's format.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
    /// Write the report to FILE (the text report then goes to stdout).
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
}

/// A history file checked: where it came from, and what was found.
#[derive(Debug, Clone, serde::Serialize)]
pub struct HistoryReport {
    pub file: String,
    #[serde(flatten)]
    pub checked: Checked,
    pub millis: u128,
}

/// Reads and checks `text` (from `file`): `Err` only when it is malformed.
pub fn check_text(file: &str, text: &str) -> Result<HistoryReport, AtkError> {
    let started = std::time::Instant::now();
    let malformed = |m: Malformed| AtkError::Malformed {
        file: file.to_owned(),
        malformed: m,
    };
    let history = parse(text).map_err(malformed)?;
    let checked = check(&history).map_err(malformed)?;
    Ok(HistoryReport {
        file: file.to_owned(),
        checked,
        millis: started.elapsed().as_millis(),
    })
}

/// `orders-api atk history FILE`: reads, checks, reports; `Err` when the
/// history is inconsistent (exit 1) or cannot be read or is malformed (exit 2).
pub fn run(args: &HistoryArgs) -> Result<(), AtkError> {
    let name = args.file.display().to_string();
    let read = if name == "-" {
        std::io::read_to_string(std::io::stdin())
    } else {
        std::fs::read_to_string(&args.file)
    };
    let text = read.map_err(|source| AtkError::Read {
        path: name.clone(),
        source,
    })?;
    let report = check_text(&name, &text)?;
    crate::output::emit(
        &report.render(Format::Text),
        &|format| report.render(format),
        args.format,
        args.out.as_deref(),
    )?;
    report.outcome()
}

impl HistoryReport {
    /// The report in `format`, as the command writes it.
    pub fn render(&self, format: Format) -> String {
        match format {
            Format::Text => {
                let mut out = format!("orders-api atk history {}\n\n", self.file);
                report::rules_text(&self.checked, &mut out);
                out.push('\n');
                out.push_str(&report::checked_summary(&self.checked));
                out.push('\n');
                out
            }
            Format::Json => crate::output::json(self),
            Format::Junit => report::rules_junit(
                "orders-api atk history",
                &self.checked,
                self.millis,
                &[("file", self.file.clone())],
                &[],
            ),
        }
    }

    /// `Ok` when consistent; else how many violations, of which rules.
    pub fn outcome(&self) -> Result<(), AtkError> {
        if self.checked.consistent() {
            return Ok(());
        }
        Err(inconsistent(&self.checked))
    }
}

/// The error for an inconsistent history: how many violations of which rules.
pub(crate) fn inconsistent(checked: &Checked) -> AtkError {
    let rules: Vec<&str> = Rule::ALL
        .iter()
        .filter(|r| checked.of(**r).next().is_some())
        .map(|r| r.id())
        .collect();
    AtkError::Inconsistent {
        violations: checked.violations.len(),
        rules: rules.join(", "),
    }
}
