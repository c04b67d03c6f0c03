use std::process::ExitCode;

use clap::Parser;
use clap::error::ErrorKind;
use orders_api::{cli, config::Cli, telemetry};

fn main() -> ExitCode {
    let args = match Cli::try_parse() {
        Ok(args) => args,
        Err(e) if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) => {
            e.exit()
        }
        Err(e) => {
            // One clear line, not a usage dump: "error: invalid value … for '--bind …': …".
            let rendered = e.render().to_string();
            let line = rendered
                .lines()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("error: invalid arguments");
            eprintln!("orders-api: {}", line.trim_start_matches("error: "));
            return ExitCode::from(2);
        }
    };
    if let Err(e) = args.settings.validate() {
        eprintln!("orders-api: {e}");
        return ExitCode::from(2);
    }
    telemetry::init_logging();
    match cli::run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("orders-api: {e}");
            ExitCode::FAILURE
        }
    }
}
