//! Two jobs.
//!
//! 1. Reports the PostgreSQL tests of the integration suite as *ignored*
//!    when `TEST_DATABASE_URL` (or, for the one that needs a server with
//!    German messages, `TEST_DATABASE_URL_DE`) is unset at build time, so
//!    that a newcomer's `cargo test` says how many did not run instead of
//!    counting them as passed. In CI (`CI` set) they are never ignored:
//!    without a database they fail, and so does a test binary built with
//!    the variable and run without it (see `tests/api/helpers.rs`).
//! 2. Names the commit the binary is built from, for `orders-api --version`
//!    (`ORDERS_API_COMMIT`): `git rev-parse --short HEAD`, or the variable
//!    as the environment gives it (a build from a source tarball), or
//!    `unknown`. It is looked up again when `HEAD` or the branch it names
//!    moves.
use std::process::Command;

fn main() {
    let ci = std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false");
    println!("cargo::rerun-if-env-changed=CI");
    for (variable, cfg) in [
        ("TEST_DATABASE_URL", "postgres_tests_ignored"),
        ("TEST_DATABASE_URL_DE", "postgres_de_tests_ignored"),
    ] {
        println!("cargo::rustc-check-cfg=cfg({cfg})");
        println!("cargo::rerun-if-env-changed={variable}");
        let set = std::env::var(variable).is_ok_and(|v| !v.is_empty());
        if !set && !ci {
            println!("cargo::rustc-cfg={cfg}");
        }
    }

    println!("cargo::rerun-if-env-changed=ORDERS_API_COMMIT");
    let commit = std::env::var("ORDERS_API_COMMIT")
        .ok()
        .filter(|c| !c.trim().is_empty())
        .or_else(|| git(&["rev-parse", "--short", "HEAD"]))
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo::rustc-env=ORDERS_API_COMMIT={}", commit.trim());
    // HEAD, the branch it names (a worktree's HEAD lives apart from the
    // refs), and packed-refs, where a branch's commit may be instead.
    let mut watched = vec!["HEAD".to_owned(), "packed-refs".to_owned()];
    watched.extend(git(&["symbolic-ref", "-q", "HEAD"]));
    for name in watched {
        if let Some(path) = git(&["rev-parse", "--git-path", &name])
            && std::path::Path::new(&path).exists()
        {
            println!("cargo::rerun-if-changed={path}");
        }
    }
}

/// `git ARGS`'s one line of output, when git is there and succeeds.
fn git(args: &[&str]) -> Option<String> {
    let output = Command::new("git").args(args).output().ok()?;
    let line = String::from_utf8(output.stdout).ok()?.trim().to_owned();
    (output.status.success() && !line.is_empty()).then_some(line)
}
