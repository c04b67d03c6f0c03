//! The command line of SPEC §2, run as the real binary.

use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::both_backends;
use crate::helpers::*;

const BIN: &str = env!("CARGO_BIN_EXE_orders-api");

/// Runs `orders-api ARGS` against `db` with a clean environment.
fn orders_api(db: &TestDb, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("DATABASE_URL", db.url.as_str())
        .env("RUST_LOG", "warn")
        .output()
        .expect("run orders-api")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn is_token(s: &str) -> bool {
    s.len() == 67 && s.starts_with("oa_") && s[3..].bytes().all(|b| b.is_ascii_hexdigit())
}

/// Starts `serve` on a free port and returns what it printed on stderr up to
/// the line that says it listens, then stops it.
fn serve_once(db: &TestDb) -> String {
    let mut child = Command::new(BIN)
        .args(["serve", "--bind", "127.0.0.1:0"])
        .env("DATABASE_URL", db.url.as_str())
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start serve");
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut seen = String::new();
    while Instant::now() < deadline {
        // Once it listens, whatever follows comes at once: stop after a quiet moment.
        let wait = if seen.contains("listening on") {
            700
        } else {
            200
        };
        match rx.recv_timeout(Duration::from_millis(wait)) {
            Ok(line) => {
                seen.push_str(&line);
                seen.push('\n');
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) if seen.contains("listening on") => {
                break;
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    seen
}

both_backends! {
    fn keys_create_prints_only_a_token_that_authenticates_its_user(backend) {
        let app = TestApp::spawn(backend);
        let out = orders_api(&app.db, &["keys", "create", "carol"]);
        assert!(out.status.success(), "{}", stderr(&out));
        let printed = stdout(&out);
        let token = printed.trim_end_matches('\n');
        assert!(is_token(token), "stdout must be only the token, got {printed:?}");
        assert_eq!(printed.lines().count(), 1);
        let created = app.call_as(token, "POST", "/v1/orders", Some("cli-1"), Some(&order_body("W", 1, "1")));
        assert_eq!(created.status, 201);
        // The order belongs to carol: alice cannot see it.
        let location = created.header("Location").unwrap().to_owned();
        assert_eq!(app.call("GET", &location, None, None).status, 404);
        assert_eq!(app.call_as(token, "GET", &location, None, None).status, 200);
    }

    fn keys_list_shows_ids_users_and_prefixes_but_never_a_token(backend) {
        let app = TestApp::spawn(backend);
        let token = stdout(&orders_api(&app.db, &["keys", "create", "dave"])).trim().to_owned();
        let out = orders_api(&app.db, &["keys", "list"]);
        assert!(out.status.success(), "{}", stderr(&out));
        let listing = stdout(&out);
        assert!(listing.contains("dave") && listing.contains("alice"), "{listing}");
        assert!(listing.contains(&token[..11]), "the prefix is shown: {listing}");
        assert!(!listing.contains(&token[11..]), "the rest of the token is never shown: {listing}");
        assert!(!listing.contains(&app.token[11..]));
    }

    fn keys_revoke_by_token_or_by_id_makes_the_token_unauthorized(backend) {
        // Without the token cache: revocation then takes effect at once.
        let app = TestApp::spawn_with(backend, |s| s.auth_cache_secs = 0);
        let by_token = stdout(&orders_api(&app.db, &["keys", "create", "erin"])).trim().to_owned();
        let by_id = stdout(&orders_api(&app.db, &["keys", "create", "frank"])).trim().to_owned();
        assert_eq!(app.call_as(&by_token, "GET", "/v1/orders", None, None).status, 200);

        let out = orders_api(&app.db, &["keys", "revoke", &by_token]);
        assert!(out.status.success(), "{}", stderr(&out));
        assert_eq!(app.call_as(&by_token, "GET", "/v1/orders", None, None).status, 401);

        let listing = stdout(&orders_api(&app.db, &["keys", "list"]));
        let id = listing
            .lines()
            .find(|l| l.contains("frank"))
            .and_then(|l| l.split_whitespace().next())
            .expect("frank's row")
            .to_owned();
        assert!(orders_api(&app.db, &["keys", "revoke", &id]).status.success());
        assert_eq!(app.call_as(&by_id, "GET", "/v1/orders", None, None).status, 401);
        // alice's key is untouched.
        assert_eq!(app.call("GET", "/v1/orders", None, None).status, 200);

        let again = orders_api(&app.db, &["keys", "revoke", &by_token]);
        assert!(!again.status.success(), "revoking a revoked key reports that nothing matched");
    }

    fn purge_deletes_expired_ledger_entries_and_prints_how_many(backend) {
        let app = TestApp::spawn_with(backend, |s| s.retention_secs = 1);
        assert_eq!(app.post_order(Some("p-1"), &order_body("W", 1, "1")).status, 201);
        assert_eq!(app.post_order(Some("p-2"), &order_body("W", 2, "1")).status, 201);
        assert_eq!(app.ledger_count(), 2);
        std::thread::sleep(Duration::from_millis(2100));
        let out = orders_api(&app.db, &["purge"]);
        assert!(out.status.success(), "{}", stderr(&out));
        assert_eq!(stdout(&out).trim(), "2");
        assert_eq!(app.ledger_count(), 0);
        assert_eq!(app.order_count(), 2, "the purge never touches orders");
        let again = orders_api(&app.db, &["purge"]);
        assert_eq!(stdout(&again).trim(), "0");
    }

    fn serve_prints_a_demo_token_once_when_the_store_has_no_keys(backend) {
        let db = TestDb::fresh(backend);
        let first = serve_once(&db);
        assert!(first.contains("listening on"), "{first}");
        let token = first
            .split_whitespace()
            .find(|w| is_token(w))
            .unwrap_or_else(|| panic!("no demo token printed: {first}"))
            .to_owned();
        let listing = stdout(&orders_api(&db, &["keys", "list"]));
        assert!(listing.contains("demo") && listing.contains(&token[..11]), "{listing}");

        let second = serve_once(&db);
        assert!(second.contains("listening on"), "{second}");
        assert!(!second.split_whitespace().any(is_token), "a token is printed only when no key exists: {second}");
    }

    fn migrate_applies_the_schema_and_exits_zero(backend) {
        let db = TestDb::fresh(backend);
        let out = orders_api(&db, &["migrate"]);
        assert!(out.status.success(), "{}", stderr(&out));
        let again = orders_api(&db, &["migrate"]);
        assert!(again.status.success(), "migrating twice is a no-op");
        let listing = orders_api(&db, &["keys", "list"]);
        assert!(listing.status.success(), "the schema exists: {}", stderr(&listing));
    }
}

fn assert_one_line_failure(out: &Output, needle: &str) {
    assert!(!out.status.success());
    let err = stderr(out);
    assert_eq!(err.trim_end().lines().count(), 1, "one line, got: {err}");
    assert!(err.contains(needle), "expected {needle:?} in {err}");
    assert!(!err.contains("panicked") && !err.contains("backtrace"));
}

#[test]
fn a_bad_setting_exits_non_zero_with_one_clear_line() {
    let db = TestDb::fresh(orders_api::db::Backend::Sqlite);
    assert_one_line_failure(
        &orders_api(&db, &["--database-url", "mysql://localhost/x", "migrate"]),
        "mysql",
    );
    assert_one_line_failure(
        &orders_api(&db, &["--lease-secs", "0", "migrate"]),
        "lease-secs",
    );
    assert_one_line_failure(
        &orders_api(&db, &["--cors-allowed-origins", "not an origin", "migrate"]),
        "origin",
    );
    assert_one_line_failure(
        &orders_api(
            &db,
            &[
                "--database-url",
                "postgres://nobody@127.0.0.1:1/none",
                "migrate",
            ],
        ),
        "cannot open database",
    );
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    assert_one_line_failure(
        &orders_api(&db, &["serve", "--bind", &addr]),
        "cannot listen",
    );
}
