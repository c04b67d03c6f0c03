//! Checks the model with bounds of your choice and prints the run and any
//! counterexample's trace:
//!
//! ```text
//! cargo run -p ledger-model --release --example explore -- [design] [name=value …]
//! ```
//!
//! `design` is one of `correct` (the default), `claim-first`, `no-unique`,
//! `record-outside`, `replay-skips-fingerprint`, `permit-while-waiting`,
//! `answer-before-commit`;
//! each `name=value` sets a field of `Bounds` (`clients=3 crashes=2
//! one_statement=false`), and `threads=N` the checker's threads.

use std::process::ExitCode;

use ledger_model::{Bounds, Design, LedgerModel, check_all, trace};

fn main() -> ExitCode {
    let mut design = Design::Correct;
    let mut bounds = Bounds::default();
    let mut threads = 2;
    for arg in std::env::args().skip(1) {
        let parsed = match arg.split_once('=') {
            None => parse_design(&arg).map(|d| design = d),
            Some((name, value)) => set(&mut bounds, &mut threads, name, value),
        };
        if parsed.is_none() {
            eprintln!("explore: cannot read {arg:?} (see the example's doc comment)");
            return ExitCode::from(2);
        }
    }
    let model = LedgerModel::new(design, bounds);
    let run = check_all(model, threads);
    println!("{design:?} {bounds:?}\n{}", run.summary());
    for (name, path) in &run.discoveries {
        println!(
            "\ncounterexample to \"{name}\":\n{}",
            trace::trace(&model, path)
        );
    }
    if run.discoveries.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn parse_design(s: &str) -> Option<Design> {
    Some(match s {
        "correct" => Design::Correct,
        "claim-first" => Design::ClaimFirstWithoutLease,
        "no-unique" => Design::NoUniqueColumn,
        "record-outside" => Design::RecordOutsideTransaction,
        "replay-skips-fingerprint" => Design::ReplaySkipsFingerprint,
        "permit-while-waiting" => Design::PermitHeldWhileWaiting,
        "answer-before-commit" => Design::AnswerBeforeCommit,
        _ => return None,
    })
}

fn set(b: &mut Bounds, threads: &mut usize, name: &str, value: &str) -> Option<()> {
    if name == "one_statement" {
        b.one_statement = value.parse().ok()?;
        return Some(());
    }
    if name == "threads" {
        *threads = value.parse().ok()?;
        return Some(());
    }
    let v: u8 = value.parse().ok()?;
    let field = match name {
        "clients" => &mut b.clients,
        "attempts" => &mut b.attempts,
        "processes" => &mut b.processes,
        "crashes" => &mut b.crashes,
        "losses" => &mut b.losses,
        "hangs" => &mut b.hangs,
        "purges" => &mut b.purges,
        "admission" => &mut b.admission,
        "waiters" => &mut b.waiters,
        "polls" => &mut b.polls,
        _ => return None,
    };
    *field = v;
    Some(())
}
