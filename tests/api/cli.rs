//! The command line of CONTRACT §2, run as the real binary.

use std::process::{Command, Output};
use std::time::Duration;

use crate::both_backends;
use crate::helpers::*;
use crate::process::ServerProcess;

const BIN: &str = env!("CARGO_BIN_EXE_orders-api");

/// Runs `orders-api ARGS` against `db` with a clean environment.
fn orders_api(db: &TestDb, args: &[&str]) -> Output {
    run(orders_api_command()
        .args(args)
        .env("DATABASE_URL", db.url.as_str()))
}

/// `orders-api` with a clean environment.
fn orders_api_command() -> Command {
    let mut command = Command::new(BIN);
    clean_env(&mut command);
    command
}

/// Only `PATH`, and `RUST_LOG=warn`.
fn clean_env(command: &mut Command) {
    command
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("RUST_LOG", "warn");
}

fn run(command: &mut Command) -> Output {
    command.output().expect("run orders-api")
}

/// `orders-api ARGS` in `dir`, with no `DATABASE_URL` (the default is a file there).
fn orders_api_in(dir: &std::path::Path, args: &[&str]) -> Output {
    run(orders_api_command().args(args).current_dir(dir))
}

/// A folder of this test's own, removed afterwards.
struct TempDir(std::path::PathBuf);

impl TempDir {
    fn new() -> Self {
        let path =
            std::env::temp_dir().join(format!("orders-cli-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&path).expect("create a temp folder");
        Self(path)
    }

    fn entries(&self) -> Vec<String> {
        std::fs::read_dir(&self.0)
            .expect("read the temp folder")
            .map(|e| {
                e.expect("an entry")
                    .file_name()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::process::Command::new("chmod")
            .arg("-R")
            .arg("u+rwx")
            .arg(&self.0)
            .status();
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The id and the shown prefix of `user`'s key in `keys list`.
fn listed_key(db: &TestDb, user: &str) -> (String, String) {
    let listing = stdout(&orders_api(db, &["keys", "list"]));
    let row: Vec<&str> = listing
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some(user))
        .unwrap_or_else(|| panic!("no row of {user} in {listing}"))
        .split_whitespace()
        .collect();
    (row[0].to_owned(), row[2].to_owned())
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

/// Starts `serve` on a free port and returns what it printed on stderr once
/// it answered, then stops it.
fn serve_once(db: &TestDb) -> String {
    let server =
        ServerProcess::start_with_env(&db.url, &[], &[("RUST_LOG", "info"), ("NO_COLOR", "1")]);
    // It prints the token and "listening on" before it serves; both are in
    // the log once /healthz answered.
    server.log_text()
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
        assert_one_line_failure(&again, "already revoked");
    }

    fn keys_revoke_takes_the_prefix_keys_list_shows(backend) {
        let app = TestApp::spawn(backend);
        let token = stdout(&orders_api(&app.db, &["keys", "create", "grace"])).trim().to_owned();
        let (id, shown) = listed_key(&app.db, "grace");
        assert_eq!(shown, format!("{}…", &token[..11]));

        let out = orders_api(&app.db, &["keys", "revoke", &shown]);
        assert!(out.status.success(), "{}", stderr(&out));
        assert_eq!(stdout(&out).trim(), format!("revoked key {id} of user grace"));
        assert_eq!(app.call_as(&token, "GET", "/v1/orders", None, None).status, 401);
        assert_eq!(app.call("GET", "/v1/orders", None, None).status, 200, "alice's key is untouched");
        // Without the ellipsis too.
        let bare = orders_api(&app.db, &["keys", "revoke", &token[..11]]);
        assert_one_line_failure(&bare, &format!("key {id} was already revoked at"));
    }

    fn revoking_a_revoked_key_says_it_was_already_revoked_and_an_unknown_one_that_none_matches(backend) {
        let app = TestApp::spawn(backend);
        stdout(&orders_api(&app.db, &["keys", "create", "heidi"]));
        let (id, _) = listed_key(&app.db, "heidi");
        assert!(orders_api(&app.db, &["keys", "revoke", &id]).status.success());
        let again = orders_api(&app.db, &["keys", "revoke", &id]);
        assert_one_line_failure(&again, &format!("key {id} was already revoked at"));
        assert_eq!(again.status.code(), Some(1));

        assert_one_line_failure(&orders_api(&app.db, &["keys", "revoke", "999999"]), "no key matches id 999999");
        assert_one_line_failure(&orders_api(&app.db, &["keys", "revoke", "oa_00000000"]), "no key matches oa_00000000…");
        let unknown_token = format!("oa_{}", "0".repeat(64));
        let out = orders_api(&app.db, &["keys", "revoke", &unknown_token]);
        assert_one_line_failure(&out, "no key matches oa_00000000…");
        assert!(!stderr(&out).contains(&unknown_token), "a whole token is never echoed");
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
    for (args, needle) in [
        (
            &["migrate", "--database-url", "mysql://localhost/x"][..],
            "mysql",
        ),
        (&["--lease-secs", "0"], "lease-secs"),
        (&["serve", "--lease-secs", "0"], "lease-secs"),
        (
            &["serve", "--cors-allowed-origins", "not an origin"],
            "origin",
        ),
    ] {
        let out = orders_api(&db, args);
        assert_one_line_failure(&out, needle);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
    }
    let unreachable = orders_api(
        &db,
        &[
            "migrate",
            "--database-url",
            "postgres://nobody@127.0.0.1:1/none",
        ],
    );
    assert_one_line_failure(&unreachable, "cannot open database");
    assert_eq!(unreachable.status.code(), Some(1));
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    assert_one_line_failure(
        &orders_api(&db, &["serve", "--bind", &addr]),
        "cannot listen",
    );
}

#[test]
fn version_names_the_version_and_the_commit_it_was_built_from() {
    let dir = TempDir::new();
    // What build.rs found: `git rev-parse --short HEAD` in a checkout.
    let built_from = env!("ORDERS_API_COMMIT");
    let head = Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|out| out.status.success());
    match head {
        Some(head) if std::env::var_os("ORDERS_API_COMMIT").is_none() => {
            assert_eq!(built_from, stdout(&head).trim(), "the checkout's HEAD");
        }
        _ => assert!(!built_from.is_empty(), "`unknown` at least"),
    }

    for flag in ["--version", "-V"] {
        let out = orders_api_in(&dir.0, &[flag]);

        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        assert_eq!(
            stdout(&out),
            format!(
                "orders-api {} (commit {built_from})\n",
                env!("CARGO_PKG_VERSION")
            )
        );
    }
    assert!(dir.entries().is_empty(), "{:?}", dir.entries());
}

#[test]
fn usage_errors_print_clap_s_whole_message_with_the_usage_line() {
    let dir = TempDir::new();
    let missing = orders_api_in(&dir.0, &["keys", "create"]);
    assert_eq!(missing.status.code(), Some(2));
    let err = stderr(&missing);
    assert!(
        err.contains("the following required arguments were not provided"),
        "{err}"
    );
    assert!(
        err.contains("<USER_ID>"),
        "the missing argument is named: {err}"
    );
    assert!(
        err.contains("Usage: orders-api keys create <USER_ID>"),
        "{err}"
    );

    let no_subcommand = orders_api_in(&dir.0, &["keys"]);
    assert_eq!(no_subcommand.status.code(), Some(2));
    let err = stderr(&no_subcommand);
    for line in ["Usage: orders-api keys", "create", "list", "revoke"] {
        assert!(err.contains(line), "{line:?} missing from: {err}");
    }

    let unknown = orders_api_in(&dir.0, &["migrate", "--bind", "127.0.0.1:0"]);
    assert_eq!(
        unknown.status.code(),
        Some(2),
        "migrate takes no server flag"
    );
    assert!(
        stderr(&unknown).contains("Usage: orders-api migrate"),
        "{}",
        stderr(&unknown)
    );
    assert!(
        dir.entries().is_empty(),
        "a usage error opens no database: {:?}",
        dir.entries()
    );

    let help = orders_api_in(&dir.0, &["keys", "revoke", "--help"]);
    assert_eq!(help.status.code(), Some(0));
    let help = stdout(&help);
    assert!(
        help.contains("TOKEN_OR_ID") && help.contains("--database-url"),
        "{help}"
    );
    assert!(
        !help.contains("--bind") && !help.contains("--workers"),
        "{help}"
    );
}

#[test]
fn keys_create_refuses_user_ids_with_outer_whitespace_and_says_so() {
    let db = TestDb::fresh(orders_api::db::Backend::Sqlite);
    assert!(orders_api(&db, &["migrate"]).status.success());
    for (user, says) in [
        (" bob", "USER_ID must not begin or end with whitespace"),
        ("bob ", "USER_ID must not begin or end with whitespace"),
        ("  ", "USER_ID must not be empty or only whitespace"),
        ("b\u{e9}b", "USER_ID must be printable ASCII"),
    ] {
        let out = orders_api(&db, &["keys", "create", user]);
        assert_one_line_failure(&out, says);
        assert!(stdout(&out).is_empty(), "no token for {user:?}");
    }
    let listing = stdout(&orders_api(&db, &["keys", "list"]));
    assert_eq!(listing.lines().count(), 1, "only the header: {listing}");
    let inner = orders_api(&db, &["keys", "create", "bob smith"]);
    assert!(
        inner.status.success(),
        "inner spaces are fine: {}",
        stderr(&inner)
    );
}

#[test]
fn keys_revoke_with_any_argument_answers_one_line_and_never_panics() {
    let db = TestDb::fresh(orders_api::db::Backend::Sqlite);
    for arg in [
        "ééééééééééééééé",
        "oa_é",
        "",
        "-",
        "\u{1f600}",
        "12é",
        "oa_12345678…é",
    ] {
        let out = orders_api(&db, &["keys", "revoke", "--", arg]);
        assert_eq!(out.status.code(), Some(1), "{arg:?}: {}", stderr(&out));
        assert_one_line_failure(&out, "TOKEN_OR_ID must be");
    }
}

#[test]
fn a_missing_or_forbidden_sqlite_location_is_named_with_its_cause() {
    let dir = TempDir::new();
    let missing = dir.0.join("no-such-folder/orders.db");
    let out = orders_api_in(
        &dir.0,
        &["migrate", "--database-url", &missing.display().to_string()],
    );
    assert_one_line_failure(
        &out,
        &format!(
            "the folder {} does not exist",
            dir.0.join("no-such-folder").display()
        ),
    );

    let locked = dir.0.join("locked");
    std::fs::create_dir(&locked).unwrap();
    let path = locked.join("orders.db").display().to_string();
    let out = unprivileged(&dir, &["migrate", "--database-url", &path]);
    assert_one_line_failure(
        &out,
        &format!("cannot create {path} in {}", locked.display()),
    );
    assert!(
        stderr(&out).contains("ermission denied"),
        "{}",
        stderr(&out)
    );
}

/// Runs `orders-api ARGS` in `dir` after taking write access to it away;
/// as root (who may write anywhere) as `nobody`.
fn unprivileged(dir: &TempDir, args: &[&str]) -> Output {
    let uid = Command::new("id").arg("-u").output().unwrap().stdout;
    let mut command = if String::from_utf8_lossy(&uid).trim() == "0" {
        let mut setpriv = Command::new("setpriv");
        setpriv.args(["--reuid=65534", "--regid=65534", "--clear-groups", BIN]);
        setpriv
    } else {
        Command::new(BIN)
    };
    clean_env(&mut command);
    let status = Command::new("chmod")
        .args(["-R", "a+rX,a-w"])
        .arg(&dir.0)
        .status()
        .unwrap();
    assert!(status.success());
    let out = run(command.args(args).current_dir(&dir.0));
    let _ = Command::new("chmod")
        .args(["-R", "u+w"])
        .arg(&dir.0)
        .status();
    out
}

/// A WAL database copied into a folder no one may write in: SQLite cannot
/// create the `-wal` and `-shm` files it reads a WAL database with, so
/// `keys list` used to fail ("reading it needs …-wal and …-shm"); it reads
/// the copy as immutable.
#[test]
fn keys_list_reads_a_copy_of_a_wal_database_in_a_read_only_folder() {
    let db = TestDb::fresh(orders_api::db::Backend::Sqlite);
    assert!(orders_api(&db, &["migrate"]).status.success());
    assert!(orders_api(&db, &["keys", "create", "kim"]).status.success());
    {
        use diesel::{Connection, RunQueryDsl, SqliteConnection};
        let mut c = SqliteConnection::establish(db.url.as_str()).unwrap();
        diesel::sql_query("PRAGMA wal_checkpoint(TRUNCATE)")
            .execute(&mut c)
            .unwrap();
    }
    let dir = TempDir::new();
    let copy = dir.0.join("copy.db");
    std::fs::copy(db.url.as_str(), &copy).unwrap();
    let header = std::fs::read(&copy).unwrap();
    assert_eq!(
        header.get(18..20),
        Some(&[2, 2][..]),
        "the copy is in WAL mode"
    );

    let out = unprivileged(
        &dir,
        &[
            "keys",
            "list",
            "--database-url",
            &copy.display().to_string(),
        ],
    );

    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("kim"), "{}", stdout(&out));
    assert_eq!(dir.entries(), ["copy.db"], "nothing was created beside it");
}

#[test]
fn keys_list_reads_a_read_only_database_when_no_migration_is_pending() {
    let db = TestDb::fresh(orders_api::db::Backend::Sqlite);
    assert!(orders_api(&db, &["migrate"]).status.success());
    assert!(
        orders_api(&db, &["keys", "create", "ivan"])
            .status
            .success()
    );
    // A copy whose journal is not WAL: switching it would be a write.
    {
        use diesel::{Connection, RunQueryDsl, SqliteConnection};
        let mut c = SqliteConnection::establish(db.url.as_str()).unwrap();
        diesel::sql_query("PRAGMA journal_mode = DELETE")
            .execute(&mut c)
            .unwrap();
    }
    let read_only = format!("file:{}?mode=ro", db.url.as_str());
    let out = run(orders_api_command().args(["keys", "list", "--database-url", &read_only]));
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("ivan"), "{}", stdout(&out));

    let create =
        run(orders_api_command().args(["keys", "create", "judy", "--database-url", &read_only]));
    assert_one_line_failure(&create, "readonly");
}

#[test]
fn a_postgres_error_is_one_line_with_the_url_as_typed() {
    let dir = TempDir::new();
    let url = "postgres://nobody@127.0.0.1:1/none";
    let out = orders_api_in(&dir.0, &["migrate", "--database-url", url]);
    assert_one_line_failure(
        &out,
        &format!("cannot open database {url}: connection to server at"),
    );
    let err = stderr(&out);
    assert!(!err.contains("gssencmode"), "{err}");
    assert!(
        err.contains("Connection refused. Is the server running"),
        "the hint is its own sentence: {err}"
    );
}

#[test]
fn a_libpq_keyword_value_string_is_refused_and_creates_no_file() {
    let dir = TempDir::new();
    for args in [
        &[
            "migrate",
            "--database-url",
            "host=127.0.0.1 port=5432 dbname=orders",
        ][..],
        &["--database-url", "host=127.0.0.1 dbname=orders"],
    ] {
        let out = orders_api_in(&dir.0, args);
        assert_one_line_failure(&out, "keyword/value");
        assert!(
            stderr(&out).contains("postgres://USER"),
            "names the accepted form: {}",
            stderr(&out)
        );
        assert_eq!(out.status.code(), Some(2));
    }
    let from_env = run(orders_api_command()
        .arg("migrate")
        .current_dir(&dir.0)
        .env("DATABASE_URL", "dbname=orders user=me"));
    assert_one_line_failure(&from_env, "keyword/value");
    assert!(dir.entries().is_empty(), "{:?}", dir.entries());
}

crate::postgres_only! {
    fn migrate_creates_a_missing_postgres_database_when_the_role_may() {
        let db = TestDb::missing(orders_api::db::Backend::Postgres);
        let out = orders_api(&db, &["migrate"]);
        assert!(out.status.success(), "{}", stderr(&out));
        let listing = orders_api(&db, &["keys", "list"]);
        assert!(
            listing.status.success(),
            "the schema exists: {}",
            stderr(&listing)
        );
    }
}

crate::postgres_only! {
    fn a_missing_postgres_database_the_role_may_not_create_is_one_clear_line() {
        use diesel::{Connection, PgConnection, RunQueryDsl};
        let role = format!("weak_{}", uuid::Uuid::new_v4().simple());
        let mut admin = PgConnection::establish(&test_database_url()).unwrap();
        diesel::sql_query(format!("CREATE ROLE {role} LOGIN NOCREATEDB"))
            .execute(&mut admin)
            .unwrap();
        let db = TestDb::missing(orders_api::db::Backend::Postgres);
        let name = db
            .url
            .as_str()
            .rsplit('/')
            .next()
            .unwrap()
            .split('?')
            .next()
            .unwrap()
            .to_owned();
        // The same server and database as the role, without a password (the
        // test cluster trusts local connections).
        let (scheme, rest) = db.url.as_str().split_once("://").unwrap();
        let host = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
        let as_role = format!("{scheme}://{role}@{host}");
        let out = run(orders_api_command().args(["migrate", "--database-url", &as_role]));
        let _ = diesel::sql_query(format!("DROP ROLE {role}")).execute(&mut admin);
        assert_one_line_failure(
            &out,
            &format!("database \"{name}\" does not exist on postgres://{role}@"),
        );
        assert!(
            stderr(&out).contains("may not create databases"),
            "{}",
            stderr(&out)
        );
    }
}

/// The password of [`secret_urls`]; each form writes it so that its typed
/// and its decoded forms both start with this.
const PASSWORD: &str = "S3cretPw";

/// `DATABASE_URL` in every form libpq takes a password in, each naming a
/// closed port (the database is down), and one that libpq quotes whole in
/// its error: a password in the user information, a `password` parameter
/// first, in the middle and last, its name or value percent-encoded in
/// either case, and a keyword/value string (which the service refuses).
fn secret_urls() -> Vec<String> {
    let port = crate::process::free_port();
    let server = format!("127.0.0.1:{port}");
    vec![
        format!("postgres://orders:{PASSWORD}@{server}/orders"),
        format!("postgres://orders@{server}/orders?password={PASSWORD}"),
        format!(
            "postgresql://orders@{server}/orders?sslmode=disable&password={PASSWORD}&connect_timeout=5"
        ),
        format!("postgres://orders@{server}/orders?connect_timeout=5&p%61ssword={PASSWORD}%2fx"),
        format!("postgres://orders@{server}/orders?P%41SSWORD={PASSWORD}%2Fx"),
        format!("postgres://orders:{PASSWORD}%40x@{server}/orders?sslpassword={PASSWORD}"),
        format!("postgres://orders:{PASSWORD}@[::1]x/orders"),
        format!("host=127.0.0.1 port={port} user=orders password={PASSWORD}"),
        format!("postgres://orders:{PASSWORD}@oops@{server}/orders"),
        format!("mysql://orders:{PASSWORD}@{server}/orders"),
    ]
}

/// SPEC §2 "No secret is ever printed": with the database down, `serve`,
/// `migrate`, `keys list` and `purge` fail in one line that shows the URL
/// without its password (or refuses a form it does not take without
/// repeating it), whether the URL comes from `DATABASE_URL` or the flag,
/// with every log level on. Before, a `password=` parameter was printed.
#[test]
fn a_password_in_the_database_url_is_never_printed_whatever_its_form_and_the_command() {
    let dir = TempDir::new();
    for url in secret_urls() {
        for command in [&["serve"][..], &["migrate"], &["keys", "list"], &["purge"]] {
            let from_env = run(orders_api_command()
                .args(command)
                .current_dir(&dir.0)
                .env("RUST_LOG", "trace")
                .env("DATABASE_URL", &url));
            let from_flag = run(orders_api_command()
                .args(command)
                .args(["--database-url", &url])
                .current_dir(&dir.0)
                .env("RUST_LOG", "trace"));
            for out in [from_env, from_flag] {
                let (stdout, stderr) = (stdout(&out), stderr(&out));
                assert!(!out.status.success(), "{command:?} {url}: {stdout}");
                assert!(
                    !stdout.contains(PASSWORD) && !stderr.contains(PASSWORD),
                    "{command:?} printed the password of {url}:\n{stdout}{stderr}"
                );
                assert_one_line_failure(&out, "");
                assert!(
                    stderr.contains("***") || stderr.contains("DATABASE_URL"),
                    "{command:?} {url}: the message names the URL, its password hidden: {stderr}"
                );
            }
        }
    }
    assert!(dir.entries().is_empty(), "{:?}", dir.entries());
}

/// clap shows an argument's environment value in `--help` unless told not
/// to: the database URL's never is.
#[test]
fn help_never_shows_the_database_url_from_the_environment() {
    let url = format!("postgres://orders:{PASSWORD}@127.0.0.1:1/orders?password={PASSWORD}");
    for command in [
        &[][..],
        &["serve"],
        &["migrate"],
        &["purge"],
        &["keys"],
        &["keys", "list"],
        &["keys", "create"],
        &["keys", "revoke"],
    ] {
        for help in ["-h", "--help"] {
            let out = run(orders_api_command()
                .args(command)
                .arg(help)
                .env("DATABASE_URL", &url));
            assert_eq!(out.status.code(), Some(0), "{command:?}: {}", stderr(&out));
            let text = stdout(&out);
            assert!(text.contains("--database-url"), "{command:?}: {text}");
            assert!(
                !text.contains(PASSWORD),
                "{command:?} {help} shows it: {text}"
            );
        }
    }
}

crate::postgres_only! {
    /// The pool's own log line when it cannot open a connection (it keeps
    /// retrying in the background) shows the URL without its password, at
    /// any log level: a server started with a `password=` parameter whose
    /// database then refuses every new connection.
    fn a_password_in_the_database_url_is_never_logged_when_the_pool_cannot_reconnect() {
        use orders_api::db::DatabaseUrl;

        let db = TestDb::fresh(orders_api::db::Backend::Postgres);
        // The test cluster trusts local connections: libpq sends no password.
        let url = DatabaseUrl::parse(&format!("{}&password={PASSWORD}", db.url.as_str())).unwrap();
        let pool = crate::process::prepare(&url);
        let token = crate::process::create_token(&pool, "alice");
        drop(pool);
        let server = ServerProcess::start_with_env(&url, &[], &[("RUST_LOG", "trace")]);
        let client = crate::net::Client::new(&server.address(), &token, Duration::from_secs(30));
        assert_eq!(client.call("GET", "/v1/orders", None, None).unwrap().status, 200);

        db.as_admin("ALTER DATABASE {db} ALLOW_CONNECTIONS false");
        db.as_admin(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE datname = '{db}' AND pid <> pg_backend_pid()",
        );
        // Each request needs a connection the pool then tries to open.
        let logged = "cannot open a database connection; retrying";
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while !server.log_text().contains(logged) {
            assert!(std::time::Instant::now() < deadline, "the pool never said it could not connect");
            let refused = client.call("GET", "/v1/orders", None, None).unwrap();
            assert_eq!(refused.status, 503, "{}", refused.body);
        }
        db.as_admin("ALTER DATABASE {db} ALLOW_CONNECTIONS true");

        let log = server.log_text();
        assert!(!log.contains(PASSWORD), "the log shows the password:\n{log}");
        let line = log.lines().find(|l| l.contains(logged)).unwrap();
        assert!(line.contains("password=***"), "the URL is named, its password hidden: {line}");
    }
}

/// The commands that must not create the database, on each backend.
mod existing_database {
    use super::*;

    both_backends! {
        /// SPEC §2: `keys list`, `keys create`, `keys revoke` and `purge`
        /// refuse a database that does not exist in one line, exit 1, and
        /// create nothing — no file, no PostgreSQL database; `migrate` creates
        /// it. Before, each of them created it (and migrated it), and `keys
        /// list` printed an empty table and exited 0.
        fn commands_other_than_migrate_and_serve_refuse_a_database_that_does_not_exist_and_create_none(backend) {
            let db = TestDb::missing(backend);
            for command in [&["keys", "list"][..], &["keys", "create", "bob"], &["keys", "revoke", "1"], &["purge"]] {
                let out = orders_api(&db, command);
                assert_one_line_failure(&out, "no database at ");
            assert!(stderr(&out).contains(db.url.as_str()), "names the database: {}", stderr(&out));
                assert!(stderr(&out).contains("`orders-api migrate` creates it"), "{}", stderr(&out));
                assert_eq!(out.status.code(), Some(1), "{command:?}");
                assert!(stdout(&out).is_empty(), "{command:?}: {}", stdout(&out));
                assert!(!db.exists(), "{command:?} created the database");
            }
            let migrated = orders_api(&db, &["migrate"]);
            assert!(migrated.status.success(), "{}", stderr(&migrated));
            assert!(db.exists());
            let listing = orders_api(&db, &["keys", "list"]);
            assert!(listing.status.success(), "{}", stderr(&listing));
        }

        /// `keys list` only reads: on a database whose migrations are pending
        /// it applies none, and says so in one line.
        fn keys_list_refuses_a_database_with_pending_migrations_and_migrates_nothing(backend) {
            let db = TestDb::empty(backend);
            let out = orders_api(&db, &["keys", "list"]);
            assert_one_line_failure(&out, "migration(s) pending): `orders-api keys list` only reads");
            let migrated = any_migration_applied(&db);
            assert!(!migrated, "keys list applied migrations");
        }

        /// The connection `keys list` reads with refuses every write: SQLite
        /// opens the file read-only, PostgreSQL reads in a READ ONLY
        /// transaction.
        fn the_connection_keys_list_reads_with_refuses_every_write(backend) {
            let db = TestDb::fresh(backend);
            orders_api::db::run_migrations(&db.url).unwrap();
            let write = db.url.read_only("a test", |conn| {
                orders_api::dispatch!(conn, c, _s => diesel::RunQueryDsl::execute(
                    diesel::sql_query(
                        "INSERT INTO api_keys (user_id, token_hash, token_prefix, created_at) \
                         VALUES ('mallory', 'h', 'p', '2026-01-01 00:00:00+00:00')",
                    ),
                    c,
                ))
            });
            let err = write.expect_err("a write on the read-only connection").to_string();
            assert!(err.contains("read") && err.contains("only"), "{err}");
            let listing = stdout(&orders_api(&db, &["keys", "list"]));
            assert!(!listing.contains("mallory"), "{listing}");
        }
    }
}

/// Whether `db` has the migrations table (any migration applied).
fn any_migration_applied(db: &TestDb) -> bool {
    use diesel::{Connection, RunQueryDsl};
    #[derive(diesel::QueryableByName)]
    struct Found {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }
    let query = match db.backend() {
        orders_api::db::Backend::Sqlite => {
            "SELECT count(*) AS n FROM sqlite_master WHERE name = '__diesel_schema_migrations'"
        }
        orders_api::db::Backend::Postgres => {
            "SELECT count(*) AS n FROM pg_tables WHERE tablename = '__diesel_schema_migrations'"
        }
    };
    let found = match db.backend() {
        orders_api::db::Backend::Sqlite => {
            let mut c = diesel::SqliteConnection::establish(db.url.as_str()).unwrap();
            diesel::sql_query(query)
                .get_result::<Found>(&mut c)
                .unwrap()
        }
        orders_api::db::Backend::Postgres => {
            let mut c = diesel::PgConnection::establish(db.url.as_str()).unwrap();
            diesel::sql_query(query)
                .get_result::<Found>(&mut c)
                .unwrap()
        }
    };
    found.n > 0
}

/// Each command's help says whether it creates the database.
#[test]
fn each_commands_help_says_whether_it_creates_the_database() {
    for (command, says) in [
        (
            &["migrate"][..],
            "creating the database when it does not exist",
        ),
        (&["serve"], "creating the database when it does not exist"),
        (&["keys", "list"], "opens the database read-only"),
        (
            &["keys", "create"],
            "Refuses a database that does not exist",
        ),
        (
            &["keys", "revoke"],
            "Refuses a database that does not exist",
        ),
        (&["purge"], "the database must exist"),
    ] {
        let out = run(orders_api_command().args(command).arg("--help"));
        let help = stdout(&out)
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        assert!(help.contains(says), "{command:?} --help: {help}");
    }
}
