use std::process::ExitCode;

use clap::Parser;
use clap::error::ErrorKind;
use orders_api::{cli::Cli, commands, telemetry};

fn main() -> ExitCode {
    let args = match Cli::try_parse() {
        Ok(args) => args,
        // A bad setting (a flag's or an environment variable's value) is one
        // clear line: "invalid value … for '--bind …': …" (exit 2).
        Err(e)
            if matches!(
                e.kind(),
                ErrorKind::ValueValidation | ErrorKind::InvalidValue
            ) =>
        {
            let rendered = e.render().to_string();
            let line = rendered
                .lines()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("error: invalid arguments");
            eprintln!("orders-api: {}", line.trim_start_matches("error: "));
            return ExitCode::from(2);
        }
        // Help and version (exit 0), and every other usage error whole, with
        // its usage line and the list of subcommands (exit 2).
        Err(e) => e.exit(),
    };
    let log_format = match telemetry::LogFormat::from_env() {
        Ok(format) => format,
        Err(e) => {
            eprintln!("orders-api: {e}");
            return ExitCode::from(2);
        }
    };
    if let Err(e) = args.validate() {
        eprintln!("orders-api: {e}");
        return ExitCode::from(2);
    }
    telemetry::init_logging(log_format);
    match commands::run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("orders-api: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}
