//! `orders-atk`: the attack runner on its own, for a team that wants only it
//! in its CI (`cargo install --path crates/orders-atk`). The same command as
//! `orders-api atk`, with the same flags, commands (`chaos`, `history`),
//! reports and exit codes.

use std::process::ExitCode;

use clap::Parser;

/// Runs the Idempotency-Key attack scenarios against a live deployment.
#[derive(Debug, Parser)]
#[command(name = "orders-atk", version, about)]
struct Cli {
    #[command(flatten)]
    args: orders_atk::AtkArgs,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match orders_atk::run(&cli.args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("orders-atk: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}
