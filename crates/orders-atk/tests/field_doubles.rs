//! The runner against applications behind an idempotency layer of the
//! field's kind (tests/support/layered.rs), each layer or app wrong in one
//! way that a third-party middleware is: the verdict follows from what the
//! application did, and the report says what happened.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use orders_atk::{CheckReport, Shape, Target, Verdict, find};
use support::layered::{App, Layer, Layered};

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
