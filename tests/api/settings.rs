//! Settings that parse but cannot work are refused at startup (issue 7,
//! point 6), before the database is touched.

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
        .args(["migrate"])
        .env_clear()
        .env("DATABASE_URL", db.url.as_str())
        .env("IDEMPOTENCY_RETENTION_SECS", "250000000000")
        .output()
        .expect("run orders-api");

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
