//! Settings that parse but cannot work are refused at startup, before the
//! database is touched.

use std::process::Command;

use crate::both_backends;
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

/// `orders-api ARGS` with only `PATH`, `RUST_LOG=warn` and `env`, run for at
/// most 20 s: a command that should have refused to start and serves
/// instead is stopped, and its output is what it wrote meanwhile.
fn bounded(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let mut child = Command::new(BIN)
        .args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("RUST_LOG", "warn")
        .envs(env.iter().copied())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run orders-api");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while child.try_wait().expect("wait").is_none() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let _ = child.kill();
    child.wait_with_output().expect("output")
}

/// Exit 2, one line on stderr that says `needle`.
fn assert_one_line_refusal(output: &std::process::Output, what: &str, needle: &str) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{what}: {stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{what}: {stderr}");
    assert!(stderr.starts_with("orders-api: "), "{what}: {stderr}");
    assert!(
        stderr.contains(needle),
        "{what}: expected {needle:?} in {stderr}"
    );
}

both_backends! {
    /// An unknown `LOG_FORMAT` was written as text without a word, and a
    /// CORS origin with an impossible port or a user in it was accepted
    /// (and never matched a browser's `Origin`). Each is now refused in one
    /// line before the database is created.
    fn an_unknown_log_format_or_a_cors_origin_that_is_not_one_is_refused_before_the_database_is_created(backend) {
        let db = TestDb::missing(backend);
        let url = db.url.as_str().to_owned();
        let serve = ["serve", "--bind", "127.0.0.1:0"];
        for (args, env, needle) in [
            (&["migrate"][..], &[("LOG_FORMAT", "xml")][..], "LOG_FORMAT is \"xml\": it must be text or json"),
            (&serve, &[("LOG_FORMAT", "xml")], "LOG_FORMAT"),
            (&serve, &[("LOG_FORMAT", "json ")], "LOG_FORMAT"),
            (&[&serve[..], &["--cors-allowed-origins", "https://a:99999"]].concat(), &[], "https://a:99999\" is not an origin"),
            (&serve, &[("CORS_ALLOWED_ORIGINS", "https://ok.example,https://user@a")], "https://user@a\" is not an origin"),
            (&serve, &[("CORS_ALLOWED_ORIGINS", "https://a:0")], "port 0"),
            (&serve, &[("CORS_ALLOWED_ORIGINS", "https://a/")], "not an origin"),
        ] {
            let env = [&[("DATABASE_URL", url.as_str())][..], env].concat();
            let output = bounded(args, &env);
            assert_one_line_refusal(&output, &format!("{args:?} {env:?}"), needle);
            assert!(!db.exists(), "{args:?} {env:?} created the database");
        }
        // What is understood still works.
        let output = bounded(&["migrate"], &[("DATABASE_URL", url.as_str()), ("LOG_FORMAT", "JSON")]);
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        assert!(db.exists());
    }
}

/// A SQLite URL whose parameters turn off file locking or keep the database
/// in memory was accepted (`migrate` exited 0 having kept nothing; `serve`
/// ran with no lock between processes), and a query on a plain path became
/// part of the file name. `migrate` and `serve` now refuse each in one line
/// naming the parameter, and create nothing.
#[test]
fn sqlite_urls_that_turn_off_locking_keep_the_database_in_memory_or_carry_unknown_parameters_are_refused_creating_nothing()
 {
    let dir =
        std::env::temp_dir().join(format!("orders-settings-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).expect("a temp folder");
    let d = dir.display();
    let cases = [
        (
            format!("sqlite://{d}/a.db?nolock=1"),
            "query parameter \"nolock\"",
        ),
        (format!("{d}/a.db?mode=ro"), "query parameter \"mode\""),
        (
            format!("sqlite://file:{d}/b.db?vfs=unix-none"),
            "vfs=unix-none",
        ),
        (
            format!("sqlite://file:{d}/b.db?vfs=unix-dotfile"),
            "vfs=unix-dotfile",
        ),
        (
            format!("sqlite://file:{d}/c.db?nolock=1"),
            "nolock turns off",
        ),
        (
            format!("sqlite://file:{d}/c.db?immutable=1"),
            "immutable turns off",
        ),
        (format!("sqlite://file:{d}/d.db?mode=memory"), "in memory"),
        ("sqlite://file::memory:".to_owned(), "in memory"),
        (
            "sqlite://file::memory:?cache=shared".to_owned(),
            "in memory",
        ),
        (
            format!("sqlite://file:{d}/e.db?cache=shared"),
            "\"cache\" is not one the server understands",
        ),
        ("sqlite://file:?mode=rwc".to_owned(), "names no file"),
    ];
    for (url, needle) in &cases {
        for args in [&["migrate"][..], &["serve", "--bind", "127.0.0.1:0"]] {
            for by_flag in [false, true] {
                let output = if by_flag {
                    bounded(&[args, &["--database-url", url.as_str()]].concat(), &[])
                } else {
                    bounded(args, &[("DATABASE_URL", url.as_str())])
                };
                assert_one_line_refusal(&output, &format!("{args:?} {url}"), needle);
            }
        }
        let left: Vec<_> = std::fs::read_dir(&dir).expect("read the folder").collect();
        assert!(left.is_empty(), "{url} created {left:?}");
    }
    // What SQLite is told and the server understands still opens.
    let read_write = format!("sqlite://file:{d}/f.db?mode=rwc&vfs=unix");
    let output = bounded(&["migrate"], &[("DATABASE_URL", read_write.as_str())]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(dir.join("f.db").exists());
    let _ = std::fs::remove_dir_all(&dir);
}
