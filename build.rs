//! Reports the PostgreSQL tests of the integration suite as *ignored* when
//! `TEST_DATABASE_URL` (or, for the one that needs a server with German
//! messages, `TEST_DATABASE_URL_DE`) is unset at build time, so that a
//! newcomer's `cargo test` says how many did not run instead of counting
//! them as passed. In CI (`CI` set) they are never ignored: without a
//! database they fail, and so does a test binary built with the variable
//! and run without it (see `tests/api/helpers.rs`).
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
}
