//! The packaging tasks of orders-api (`cargo xtask …`, an alias in
//! `.cargo/config.toml`).
//!
//! - `cargo xtask dist` writes what the Debian package ships besides the
//!   binary: one man page per command, bash, zsh and fish completions, and
//!   the service's settings file (`/etc/default/orders-api`), all from the
//!   command line's own definitions ([`orders_api::cli::Cli`]), so none of
//!   them can fall behind it. They go to `dist/` in the release build's
//!   folder (`$CARGO_TARGET_DIR/release/dist`), where the package's
//!   `[package.metadata.deb]` assets pick them up.
//! - `cargo xtask deb [ARGS…]` does that, then runs `cargo deb ARGS…`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use clap::CommandFactory;
use clap_complete::Shell;
use clap_mangen::Man;
use clap_mangen::roff::{Roff, italic, roman};
use orders_api::cli::Cli;

/// The binary, and the name of every page and completion.
const BIN: &str = "orders-api";
/// Where the package installs the settings file; the unit's `EnvironmentFile=`.
const SETTINGS_FILE: &str = "/etc/default/orders-api";
/// The service's state directory (`StateDirectory=orders-api`), which holds
/// the SQLite database.
const STATE_DIRECTORY: &str = "/var/lib/orders-api";
/// `DATABASE_URL` as the package sets it: the database in the state directory.
const PACKAGED_DATABASE_URL: &str = "sqlite:///var/lib/orders-api/orders.db";

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let result = match args.next().as_deref() {
        Some("dist") => dist().map(|out| println!("{}", out.display())),
        Some("deb") => dist().and_then(|_| cargo_deb(args.collect())),
        _ => Err("usage: cargo xtask dist | cargo xtask deb [CARGO-DEB ARGS…]".to_owned()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Writes the man pages, the completions and the settings file into a
/// fresh `dist/` folder (nothing stale from a removed command survives).
fn dist() -> Result<PathBuf, String> {
    let out = target_directory()?.join("release").join("dist");
    if out.exists() {
        std::fs::remove_dir_all(&out)
            .map_err(|e| format!("cannot clear {}: {e}", out.display()))?;
    }
    let write = |relative: &str, bytes: &[u8]| -> Result<PathBuf, String> {
        let path = out.join(relative);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
        }
        std::fs::write(&path, bytes)
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        Ok(path)
    };
    for (name, page) in man_pages()? {
        let path = write(&format!("man/{name}.1"), &page)?;
        gzip(&path)?;
    }
    for (file, shell) in [
        (BIN.to_owned(), Shell::Bash),
        (format!("_{BIN}"), Shell::Zsh),
        (format!("{BIN}.fish"), Shell::Fish),
    ] {
        write(&format!("completions/{file}"), &completion(shell)?)?;
    }
    write("default/orders-api", settings_file().as_bytes())?;
    Ok(out)
}

/// `cargo deb -p orders-api ARGS…`, its exit status as ours.
fn cargo_deb(args: Vec<String>) -> Result<(), String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let status = Command::new(cargo)
        .args(["deb", "-p", BIN])
        .args(args)
        .status()
        .map_err(|e| format!("cannot run cargo deb: {e}"))?;
    status
        .success()
        .then_some(())
        .ok_or_else(|| format!("cargo deb failed ({status}); is cargo-deb installed (cargo install cargo-deb --locked)?"))
}

/// The workspace's target folder, as cargo resolves it (`CARGO_TARGET_DIR`,
/// `build.target-dir`, or `target/`).
fn target_directory() -> Result<PathBuf, String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let output = Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--no-deps"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .map_err(|e| format!("cannot run cargo metadata: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    let metadata: serde_json::Value = serde_json::from_slice(&output.stdout)
        .map_err(|e| format!("cargo metadata printed no JSON: {e}"))?;
    metadata["target_directory"]
        .as_str()
        .map(PathBuf::from)
        .ok_or_else(|| "cargo metadata names no target_directory".to_owned())
}

/// `gzip -9n PATH`: what Debian policy asks of a man page (best compression,
/// no name or time stamp inside, so the same page gives the same bytes).
fn gzip(path: &Path) -> Result<(), String> {
    let status = Command::new("gzip")
        .args(["-9nf"])
        .arg(path)
        .status()
        .map_err(|e| format!("cannot run gzip: {e}"))?;
    status
        .success()
        .then_some(())
        .ok_or_else(|| format!("gzip {} failed ({status})", path.display()))
}

/// The command line, as built for help: every subcommand named
/// `orders-api-…` for its page, no `help` subcommand.
fn command() -> clap::Command {
    let mut cmd = Cli::command().disable_help_subcommand(true);
    cmd.build();
    cmd
}

/// One page per command that is not hidden, by name
/// (`orders-api-keys-create`), each rendered by clap_mangen; the pages of
/// the commands that serve (`orders-api`, `orders-api-serve`) say where the
/// package keeps the settings and the database.
fn man_pages() -> Result<Vec<(String, Vec<u8>)>, String> {
    fn collect(cmd: &clap::Command, pages: &mut Vec<(String, Vec<u8>)>) -> Result<(), String> {
        let man = Man::new(cmd.clone());
        let name = man.get_filename().trim_end_matches(".1").to_owned();
        // Every page names the build, as `orders-api --version` does.
        let man = man
            .title(name.to_uppercase())
            .source(format!("{BIN} {}", orders_api::cli::VERSION))
            .manual("orders-api");
        let mut page = Vec::new();
        man.render(&mut page)
            .map_err(|e| format!("cannot render {name}: {e}"))?;
        if name == BIN || name == format!("{BIN}-serve") {
            files_section()
                .to_writer(&mut page)
                .map_err(|e| format!("cannot render {name}: {e}"))?;
        }
        pages.push((name, page));
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
            collect(sub, pages)?;
        }
        Ok(())
    }
    let mut pages = Vec::new();
    collect(&command(), &mut pages)?;
    Ok(pages)
}

/// The FILES section of the serving commands' pages.
fn files_section() -> Roff {
    let mut roff = Roff::new();
    roff.control("SH", ["FILES"])
        .control("TP", [])
        .text([italic(SETTINGS_FILE)])
        .text([roman(
            "The service's settings, as the Debian package installs them: every \
             environment variable of serve with its default, read by the systemd \
             unit (EnvironmentFile=).",
        )])
        .control("TP", [])
        .text([italic(format!("{STATE_DIRECTORY}/orders.db"))])
        .text([roman(
            "The SQLite database of the packaged service, in its state directory \
             (StateDirectory=orders-api). Run commands against it as the service's \
             user: see the README's \"Install as a service\".",
        )]);
    roff
}

/// `shell`'s completion script for `orders-api`.
fn completion(shell: Shell) -> Result<Vec<u8>, String> {
    use clap_complete::Generator;
    let mut cmd = command();
    cmd.set_bin_name(BIN);
    cmd.build();
    let mut script = Vec::new();
    shell
        .try_generate(&cmd, &mut script)
        .map_err(|e| format!("cannot write the {shell} completion: {e}"))?;
    Ok(script)
}

/// `/etc/default/orders-api`: every setting of `serve` (each flag with an
/// environment variable, in the order `--help` lists them), its help and
/// its default, commented out, but `DATABASE_URL`, which the package points
/// at the state directory; then the two variables only the environment
/// sets (`RUST_LOG`, `LOG_FORMAT`: see `orders_api::telemetry::LogFormat`).
fn settings_file() -> String {
    let mut text = format!(
        "# {SETTINGS_FILE}: the settings of the orders-api service, read by its\n\
         # systemd unit (EnvironmentFile=). Every setting of `orders-api serve` is\n\
         # listed with its default: uncomment a line to change it, then\n\
         # `systemctl restart orders-api`. Quote a value that holds spaces or shell\n\
         # characters (`&` in a URL) in double quotes: systemd and sh read it alike.\n\
         # Readable by root only: a PostgreSQL password may be in DATABASE_URL.\n\
         # `man orders-api-serve` describes the same settings.\n"
    );
    let serve = command();
    let serve = serve
        .find_subcommand("serve")
        .cloned()
        .unwrap_or_else(command);
    for arg in serve.get_arguments() {
        let Some(env) = arg.get_env().and_then(|e| e.to_str()) else {
            continue;
        };
        let mut help = arg
            .get_long_help()
            .or(arg.get_help())
            .map(|h| h.to_string())
            .unwrap_or_default();
        if !help.ends_with('.') {
            help.push('.');
        }
        let default = arg
            .get_default_values()
            .iter()
            .map(|v| v.to_string_lossy())
            .collect::<Vec<_>>()
            .join(",");
        let flag = arg.get_long().map(|l| format!("--{l}")).unwrap_or_default();
        text.push('\n');
        for line in wrap(&help, 76) {
            let _ = writeln!(text, "# {line}");
        }
        if env == "DATABASE_URL" {
            let _ = writeln!(
                text,
                "# ({flag}) orders-api's own default, {default}, is a file in\n\
                 # the working directory; the package keeps the database in its state\n\
                 # directory, {STATE_DIRECTORY}.\n\
                 {env}={PACKAGED_DATABASE_URL}"
            );
        } else if arg.get_default_values().is_empty() {
            let _ = writeln!(text, "# ({flag}; not set by default.)\n#{env}=");
        } else {
            let _ = writeln!(text, "# ({flag})\n#{env}={default}");
        }
    }
    text.push_str(
        "\n# The log filter: a level (error, warn, info, debug, trace) or directives\n\
         # such as `orders_api=debug,info`.\n\
         #RUST_LOG=info\n\
         \n\
         # `text`, or `json` for one JSON object per log line (any case; empty:\n\
         # text). Any other value is refused at startup, in one line.\n\
         #LOG_FORMAT=text\n",
    );
    text
}

/// `text`'s words in lines of at most `width` characters (a longer word
/// alone on its line).
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        if !line.is_empty() && line.len() + 1 + word.len() > width {
            lines.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.is_empty() {
        lines.push(line);
    }
    lines
}

#[cfg(test)]
mod tests {
    use clap::Parser;
    use orders_api::cli::{Cli, Command as CliCommand};

    use super::*;

    /// `NAME=VALUE` of every line that sets a variable, commented or not.
    fn assignments(file: &str) -> Vec<(bool, String, String)> {
        file.lines()
            .filter_map(|line| {
                let (commented, rest) = match line.strip_prefix('#') {
                    Some(rest) => (true, rest),
                    None => (false, line),
                };
                let (name, value) = rest.split_once('=')?;
                let is_name =
                    !name.is_empty() && name.bytes().all(|b| b.is_ascii_uppercase() || b == b'_');
                is_name.then(|| (commented, name.to_owned(), value.to_owned()))
            })
            .collect()
    }

    fn unit() -> String {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../debian/orders-api.service");
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    fn unit_value<'a>(unit: &'a str, key: &str) -> Vec<&'a str> {
        unit.lines()
            .filter_map(|l| l.strip_prefix(key)?.strip_prefix('='))
            .collect()
    }

    #[test]
    fn the_settings_file_lists_every_setting_of_serve_and_only_the_database_is_set() {
        let file = settings_file();
        let set = assignments(&file);
        let serve = command().find_subcommand("serve").unwrap().clone();
        for arg in serve.get_arguments() {
            if let Some(env) = arg.get_env() {
                let env = env.to_str().unwrap();
                assert!(
                    set.iter().any(|(_, name, _)| name == env),
                    "{env} missing:\n{file}"
                );
            }
        }
        for env in ["RUST_LOG", "LOG_FORMAT", "WRITE_ADMISSION", "HTTP_WORKERS"] {
            assert!(set.iter().any(|(_, name, _)| name == env), "{env} missing");
        }
        let uncommented: Vec<_> = set.iter().filter(|(commented, ..)| !commented).collect();
        assert_eq!(
            uncommented,
            [&(
                false,
                "DATABASE_URL".to_owned(),
                PACKAGED_DATABASE_URL.to_owned()
            )]
        );
    }

    #[test]
    fn every_default_the_settings_file_lists_is_the_one_serve_already_has() {
        let file = settings_file();
        let serve = command().find_subcommand("serve").unwrap().clone();
        let mut args = vec!["orders-api".to_owned(), "serve".to_owned()];
        for (_, name, value) in assignments(&file) {
            let Some(arg) = serve
                .get_arguments()
                .find(|a| a.get_env().is_some_and(|e| e == name.as_str()))
            else {
                continue; // RUST_LOG, LOG_FORMAT: read by the logger
            };
            if name == "DATABASE_URL" || value.is_empty() {
                continue;
            }
            args.push(format!("--{}", arg.get_long().unwrap()));
            args.push(value);
        }
        let listed = Cli::try_parse_from(&args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
        let bare = Cli::try_parse_from(["orders-api", "serve"]).unwrap();
        let (Some(CliCommand::Serve(listed)), Some(CliCommand::Serve(bare))) =
            (listed.command, bare.command)
        else {
            panic!("serve parses as serve")
        };
        assert_eq!(format!("{listed:?}"), format!("{bare:?}"), "{args:?}");
    }

    #[test]
    fn the_unit_reads_the_settings_file_keeps_the_database_in_its_state_directory_and_outwaits_the_grace()
     {
        let unit = unit();
        assert_eq!(unit_value(&unit, "EnvironmentFile"), [SETTINGS_FILE]);
        assert_eq!(unit_value(&unit, "StateDirectory"), ["orders-api"]);
        assert_eq!(unit_value(&unit, "WorkingDirectory"), [STATE_DIRECTORY]);
        assert!(PACKAGED_DATABASE_URL.ends_with(&format!("{STATE_DIRECTORY}/orders.db")));
        assert_eq!(unit_value(&unit, "Type"), ["notify"]);
        assert_eq!(unit_value(&unit, "KillSignal"), ["SIGTERM"]);
        assert_eq!(unit_value(&unit, "Restart"), ["on-failure"]);
        let stop = unit_value(&unit, "TimeoutStopSec");
        let stop: u64 = stop[0].trim_end_matches('s').parse().unwrap();
        assert!(
            stop >= orders_api::startup::SHUTDOWN_GRACE + 10,
            "TimeoutStopSec={stop} leaves no room after the {} s grace",
            orders_api::startup::SHUTDOWN_GRACE
        );
        assert_eq!(
            unit_value(&unit, "ExecStart"),
            [format!("/usr/bin/{BIN} serve")]
        );
    }

    #[test]
    fn the_debian_changelog_names_this_version() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../debian/changelog");
        let changelog = std::fs::read_to_string(&path).unwrap();
        let version = orders_api::cli::VERSION.split(' ').next().unwrap();
        assert!(
            changelog.starts_with(&format!("{BIN} ({version}-1) ")),
            "debian/changelog's first entry is not {version}-1: bump it with the version"
        );
    }

    #[test]
    fn there_is_one_man_page_per_command() {
        let pages = man_pages().unwrap();
        let names: Vec<&str> = pages.iter().map(|(n, _)| n.as_str()).collect();
        for name in [
            "orders-api",
            "orders-api-serve",
            "orders-api-migrate",
            "orders-api-keys",
            "orders-api-keys-create",
            "orders-api-keys-list",
            "orders-api-keys-revoke",
            "orders-api-purge",
            "orders-api-client",
            "orders-api-client-sync",
            "orders-api-atk",
        ] {
            assert!(names.contains(&name), "{name} missing from {names:?}");
        }
        assert!(!names.iter().any(|n| n.ends_with("-help")), "{names:?}");
        let mut unique = names.clone();
        unique.dedup();
        assert_eq!(unique.len(), names.len());
        let top = String::from_utf8(pages[0].1.clone()).unwrap();
        assert!(
            top.contains(".SH FILES") && top.contains("/etc/default/orders\\-api"),
            "{top}"
        );
        assert!(
            top.contains(orders_api::cli::VERSION),
            "the page names the build"
        );
    }

    #[test]
    fn each_completion_knows_the_subcommands() {
        for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
            let script = String::from_utf8(completion(shell).unwrap()).unwrap();
            // fish spells a flag `-l database-url`.
            for word in ["serve", "migrate", "keys", "revoke", "database-url"] {
                assert!(script.contains(word), "{shell}: {word}");
            }
        }
    }

    #[test]
    fn wrap_keeps_every_word_in_lines_of_the_width() {
        let text = "a bb ccc dddd eeeee ffffff";
        let lines = wrap(text, 8);
        assert!(lines.iter().all(|l| l.len() <= 8), "{lines:?}");
        assert_eq!(lines.join(" "), text);
        assert_eq!(wrap("", 8), Vec::<String>::new());
    }
}
