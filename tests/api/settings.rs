//! Settings that parse but cannot work are refused at startup, before the
//! database is touched.

use std::process::Command;

use crate::helpers::*;

const BIN: &str = env!("CARGO_BIN_EXE_orders-api");

/// A retention of about 2.5e11 s used to be stored as a year-10000 expiry,
/// which SQLite sorts before today: the entry was purged at once. Now the
/// process refuses it with one line that names the setting, and exits
/// without creating the database.
#[test]
fn a_retention_beyond_100_years_is_refused_at_startup_with_one_line() {
    let db = TestDb::fresh(orders_api::db::Backend::Sqlite);
    let output = Command::new(BIN)
        .args(["serve", "--bind", "127.0.0.1:0"])
        .env_clear()
        .env("DATABASE_URL", db.url.as_str())
        .env("IDEMPOTENCY_RETENTION_SECS", "250000000000")
        .output()
        .expect("run orders-api");

    assert_refused_without_touching(&output, &db);
}

/// The same value as a flag of `serve` used to start the server: only the
/// bare command's settings were checked, and `serve` has its own.
#[test]
fn a_retention_beyond_100_years_given_as_a_flag_of_serve_is_refused_too() {
    for args in [
        &["serve", "--retention-secs", "250000000000"][..],
        &["--retention-secs", "250000000000"],
    ] {
        let db = TestDb::fresh(orders_api::db::Backend::Sqlite);
        let mut child = Command::new(BIN)
            .args(args)
            .args(["--bind", "127.0.0.1:0"])
            .env_clear()
            .env("DATABASE_URL", db.url.as_str())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run orders-api");
        // Bounded: a server that started anyway is stopped, and the test fails.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while child.try_wait().expect("wait").is_none() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let _ = child.kill();
        let output = child.wait_with_output().expect("output");
        assert_refused_without_touching(&output, &db);
    }
}

fn assert_refused_without_touching(output: &std::process::Output, db: &TestDb) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("orders-api: IDEMPOTENCY_RETENTION_SECS"),
        "{stderr}"
    );
    assert!(
        !std::path::Path::new(db.url.as_str()).exists(),
        "the database was touched"
    );
}
