use std::process::ExitCode;

use clap::Parser;
use orders_api::{cli, config::Cli, telemetry};

fn main() -> ExitCode {
    let args = Cli::parse();
    telemetry::init_logging();
    match cli::run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("orders-api: {e}");
            ExitCode::FAILURE
        }
    }
}
