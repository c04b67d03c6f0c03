//! PostgreSQL deployments that differ from the test cluster's defaults: a
//! database whose default isolation is `serializable`, a server that
//! writes its messages in German, and several processes migrating one
//! database at once.

use diesel::connection::SimpleConnection;
use diesel::{Connection, PgConnection, RunQueryDsl};
use orders_api::db::DatabaseUrl;

use crate::helpers::*;
use crate::race::{assert_in_progress, assert_ran_once, race};

/// The admin URL of a cluster started with `lc_messages=de_DE.UTF-8`
/// (`.ci/run` starts one).
const TEST_DATABASE_URL_DE: &str = "TEST_DATABASE_URL_DE";
/// A role that is not a superuser: it cannot `SET lc_messages`.
const APP_ROLE: &str = "orders_app";

/// One value of `SHOW name`, on a plain connection to `url`.
fn show(url: &DatabaseUrl, name: &str) -> String {
    #[derive(diesel::QueryableByName)]
    struct Setting {
        #[diesel(sql_type = diesel::sql_types::Text)]
        value: String,
    }
    let mut conn = PgConnection::establish(url.as_str()).expect("connect");
    diesel::sql_query(format!("SELECT current_setting('{name}') AS value"))
        .get_result::<Setting>(&mut conn)
        .expect("read a setting")
        .value
}

crate::postgres_only! {
    /// CONTRACT §4's race guarantee on a database whose transactions are
    /// serializable unless told otherwise: the service pins READ COMMITTED, so a
    /// race loser waits for the winner and replays (or is told in progress),
    /// instead of failing with a serialization error (a 503).
    fn concurrent_creates_with_one_key_on_a_serializable_database_create_one_order_and_no_5xx() {
        let db = TestDb::fresh(orders_api::db::Backend::Postgres);
        db.as_admin("ALTER DATABASE {db} SET default_transaction_isolation = 'serializable'");
        assert_eq!(
            show(&db.url, "default_transaction_isolation"),
            "serializable"
        );
        let app = TestApp::spawn_on(db, |_| {});
        let body = order_body("Widget", 2, "9.99");

        for round in 0..5 {
            let key = format!("serializable-{round}");
            let responses = race(&app, "POST", "/v1/orders", &key, |_| Some(body.clone()));

            assert_ran_once(&responses, 201);
            assert_eq!(app.order_count(), round + 1, "round {round}");
        }
        assert_eq!(app.ledger_count(), 5);
    }
}

/// Failures are recognised without reading English text. On a
/// server whose messages are German, a request whose key is held (its
/// ledger entry inserted, uncommitted, by the test) still answers `409 IDEMPOTENCY_IN_PROGRESS`
/// after `lock_timeout`, not a 500 — as a role that may not `SET
/// lc_messages`, so the service cannot just switch the language back.
#[test]
#[cfg_attr(
    postgres_de_tests_ignored,
    ignore = "set TEST_DATABASE_URL_DE to a cluster with German messages to run this test"
)]
fn with_german_server_messages_a_lock_timeout_still_answers_409_in_progress() {
    let admin_url = require_cluster(TEST_DATABASE_URL_DE);
    let mut db = TestDb::fresh_postgres_on(&admin_url);
    db.as_admin(&format!(
        "DO $$ BEGIN CREATE ROLE {APP_ROLE} LOGIN; \
         EXCEPTION WHEN duplicate_object THEN NULL; END $$"
    ));
    db.as_admin(&format!("ALTER DATABASE {{db}} OWNER TO {APP_ROLE}"));
    db.url = DatabaseUrl::parse(&db.url.as_str().replacen(
        "://postgres@",
        &format!("://{APP_ROLE}@"),
        1,
    ))
    .expect("the role's URL");
    let mut probe = PgConnection::establish(db.url.as_str()).expect("connect");
    let division = diesel::sql_query("SELECT 1/0").execute(&mut probe);
    assert!(
        show(&db.url, "lc_messages").starts_with("de_DE")
            && division.is_err_and(|e| e.to_string() == "Division durch Null"),
        "{TEST_DATABASE_URL_DE} must name a cluster whose messages are German"
    );
    assert_eq!(show(&db.url, "is_superuser"), "off");
    let app = TestApp::spawn_on(db, |_| {});
    let body = order_body("Widget", 2, "9.99");

    // A concurrent writer of the same key: its uncommitted entry holds the
    // row lock that this request's record must wait for.
    let mut holder = PgConnection::establish(app.db.url.as_str()).expect("connect");
    holder
        .batch_execute(
            "BEGIN; INSERT INTO idempotency_ledger (idempotency_key, user_id, \
             request_fingerprint, response_status, response_headers, response_body, \
             created_at, expires_at) \
             VALUES ('held-key', 'alice', 'held', 201, '[]', '\\x7b7d', now(), now() + interval '1 day')",
        )
        .expect("hold the entry");
    let waiting = app.post_order(Some("held-key"), &body);
    holder.batch_execute("ROLLBACK").expect("release the entry");

    assert_in_progress(&waiting);
    assert_eq!(app.order_count(), 0, "the waiting request created nothing");
    let retry = app.post_order(Some("held-key"), &body);
    assert_eq!(retry.status, 201, "{}", retry.body);
}

crate::postgres_only! {
    /// Whatever the database's defaults, every pooled session is READ
    /// COMMITTED and bounded by the lease (statement and idle-in-transaction
    /// timeouts; on PostgreSQL 17+ also `transaction_timeout`, so a dead
    /// host's key is held at most one lease there instead of two).
    fn every_pooled_postgres_session_is_read_committed_and_bounded_by_the_lease() {
        #[derive(diesel::QueryableByName)]
        struct Setting {
            #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
            value: Option<String>,
        }
        let db = TestDb::fresh(orders_api::db::Backend::Postgres);
        db.as_admin("ALTER DATABASE {db} SET default_transaction_isolation = 'repeatable read'");
        let app = TestApp::spawn_on(db, |s| s.lease_secs = 7);
        let mut pooled = app.pool.get().expect("connection");
        let orders_api::db::Conn::Postgres(conn) = pooled.conn() else {
            panic!("a PostgreSQL pool")
        };
        let mut setting = |name: &str| {
            diesel::sql_query(format!("SELECT current_setting('{name}', true) AS value"))
                .get_result::<Setting>(conn)
                .expect("read a setting")
                .value
        };

        assert_eq!(
            setting("default_transaction_isolation").as_deref(),
            Some("read committed")
        );
        assert_eq!(setting("statement_timeout").as_deref(), Some("7s"));
        assert_eq!(
            setting("idle_in_transaction_session_timeout").as_deref(),
            Some("7s")
        );
        let version: i64 = setting("server_version_num")
            .and_then(|v| v.parse().ok())
            .expect("server_version_num");
        let transaction_timeout = setting("transaction_timeout");
        if version >= 170_000 {
            assert_eq!(transaction_timeout.as_deref(), Some("7s"));
        } else {
            assert_eq!(transaction_timeout, None, "no such setting before 17");
        }
    }
}

/// The advisory lock that serialises migrations (`src/db/migrate.rs`).
const MIGRATION_LOCK: i64 = 0x6f72_6465_7273;

crate::postgres_only! {
    /// Several processes may start against one database at once: one migrates,
    /// the others wait for it. A migration that builds an index CONCURRENTLY
    /// waits for every older snapshot in the database, so a process that waited
    /// for the migration lock inside a statement (holding that statement's
    /// snapshot) and the build would wait for each other until PostgreSQL failed
    /// one of them as a deadlock. A waiting process holds nothing while it
    /// waits: the build finishes, and so does its migration afterwards.
    fn a_process_waiting_to_migrate_holds_up_no_concurrent_index_build() {
        let db = TestDb::fresh(orders_api::db::Backend::Postgres);
        let mut migrating = PgConnection::establish(db.url.as_str()).expect("connect");
        migrating
            .batch_execute(&format!(
                "CREATE TABLE built (n int); SELECT pg_advisory_lock({MIGRATION_LOCK})"
            ))
            .expect("take the migration lock");
        let url = db.url.clone();
        let waiting = std::thread::spawn(move || orders_api::db::run_migrations(&url));
        crate::process::wait_for_session_where(
            &db.url,
            "query LIKE '%advisory_lock(%' AND query NOT LIKE '%CREATE TABLE built%'",
            std::time::Duration::from_secs(30),
        );

        let built = migrating.batch_execute("CREATE INDEX CONCURRENTLY built_n ON built (n)");
        migrating
            .batch_execute(&format!("SELECT pg_advisory_unlock({MIGRATION_LOCK})"))
            .expect("release the migration lock");
        let migrated = waiting.join().expect("the waiting process");

        assert!(built.is_ok(), "the concurrent build: {built:?}");
        assert!(
            migrated.as_ref().is_ok_and(|n| *n > 0),
            "the waiting process then migrates: {migrated:?}"
        );
    }
}
