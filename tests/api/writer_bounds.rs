//! Every phase of a write is bounded (CONTRACT §4, "Bounds that fire"): a
//! SQLite batch stuck in its `COMMIT`, a writer that cannot open a
//! connection, and a PostgreSQL unit that never returns all have their
//! callers answered `503` within the lease plus `COMMIT_GRACE`; `/readyz`
//! says not ready while the writer cannot write, ready once it can; and a
//! writer that cannot recover stops the server with an error, after which a
//! fresh server on the same database finds every acknowledged order.
//!
//! The disk is frozen at fault points of the writer (feature
//! `fault-points`, compiled into test builds only), keyed by the test's own
//! database file: a batch stops right before its `COMMIT` (with its write
//! lock held, as on a disk that does not answer its `fsync`), or a
//! replacement thread cannot open its connection. Tests wait for events
//! (a point reached, an answer, `/readyz` changing), never for the clock.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection;
use idempotency_ledger::db::writer::WriterHealth;
use idempotency_ledger::fault::{self, Point};
use orders_api::db::{Backend, Conn, Pool, WriteError};

use crate::bounds::assert_unavailable;
use crate::expect::*;
use crate::helpers::*;

/// Far longer than any bound here: a test that waits this long has failed.
const PATIENCE: Duration = Duration::from_secs(90);

/// `/readyz`'s status once it is `status` (polled: its change is the event).
fn wait_for_readiness(app: &TestApp, status: u16) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let ready = app.request("GET", "/readyz", &[], None);
        if ready.status == status {
            if status == 503 {
                assert_unavailable(&ready);
            }
            return;
        }
        assert!(
            Instant::now() < deadline,
            "/readyz stayed {} ({})",
            ready.status,
            ready.body
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until the writer can write again (a thread it gave up on has
/// returned, or a connection opened): `/readyz` answers `200`.
pub fn wait_until_ready(app: &TestApp) {
    wait_for_readiness(app, 200);
}

/// The database as the server's pool was given it: the writer's fault
/// points are keyed by it.
fn file(app: &TestApp) -> String {
    app.db.url.as_str().to_owned()
}

/// A unit that writes a row of its own (a key of user `ghost`), to see
/// afterwards whether its batch committed.
fn ghost_unit(conn: &mut Conn<'_>) -> Result<(), diesel::result::Error> {
    let Conn::Sqlite(c) = conn else {
        panic!("a SQLite writer")
    };
    c.batch_execute(
        "INSERT INTO api_keys (user_id, token_hash, token_prefix, created_at) \
         VALUES ('ghost', 'stuck', 'p', '2026-01-01')",
    )
}

fn ghosts(pool: &Pool) -> i64 {
    use diesel::prelude::*;
    use orders_api::db::schema::sqlite::api_keys;
    let mut pooled = pool.get().expect("connection");
    let Conn::Sqlite(c) = pooled.conn() else {
        panic!("a SQLite pool")
    };
    api_keys::table
        .filter(api_keys::user_id.eq("ghost"))
        .count()
        .get_result(c)
        .expect("count")
}

/// A panic whose payload panics again when dropped: the second panic is
/// outside the unit's `catch_unwind` and kills the writer thread.
struct Bomb;

impl Drop for Bomb {
    fn drop(&mut self) {
        panic!("the writer thread dies");
    }
}

/// Kills the writer thread, so that the watchdog starts a replacement.
fn kill_the_writer(pool: &Pool) {
    let killed = pool.write_blocking(|_conn| -> Result<(), diesel::result::Error> {
        std::panic::panic_any(Bomb)
    });
    assert!(killed.is_err(), "{killed:?}");
}

/// A create whose batch is stuck in its `COMMIT` is answered `503` with
/// `Retry-After` while the `COMMIT` still has not returned (lease 1 s here,
/// plus `COMMIT_GRACE`); meanwhile `/readyz` says not ready and a new
/// create is refused `503` at once. Once the `COMMIT` returns — it went
/// through: the outcome the `503` left unknown — the writer is ready again,
/// the retry replays the order, and the refused key runs. The same with a
/// `COMMIT` that fails: its caller (here a blocking one, which only the
/// watchdog can answer) is answered while it hangs, and once it fails
/// nothing of the batch persisted. Before, such callers waited for as long
/// as the `COMMIT` did, and `/readyz` said ready.
#[test]
fn a_batch_stuck_in_its_commit_is_answered_503_the_writer_is_not_ready_and_the_key_replays_once_it_commits()
 {
    let app = TestApp::spawn_with(Backend::Sqlite, |s| s.lease_secs = 1);
    let body = order_body("Widget", 1, "1");
    wait_until_ready(&app);

    let hold = fault::hold(Point::BeforeCommit, &file(&app));
    let stuck = app.post_order(Some("stuck"), &body);
    assert!(hold.wait_reached(PATIENCE), "the batch reached its COMMIT");
    // Answered, and the COMMIT is still held.
    assert_unavailable(&stuck);
    wait_for_readiness(&app, 503);
    assert!(
        matches!(app.pool.writer_health(), WriterHealth::Stalled(_)),
        "{:?}",
        app.pool.writer_health()
    );
    let refused = app.post_order(Some("refused"), &body);
    assert_unavailable(&refused);

    hold.release();
    wait_until_ready(&app);
    let retry = app.post_order(Some("stuck"), &body);
    assert_eq!(retry.status, 200, "the commit went through: {}", retry.body);
    assert_eq!(retry.header("Idempotent-Replayed"), Some("true"));
    let refused = app.post_order(Some("refused"), &body);
    assert_eq!(
        refused.status, 201,
        "the refused key is free: {}",
        refused.body
    );
    assert_not_replayed(&refused);
    assert_eq!((app.order_count(), app.ledger_count()), (2, 2));

    // A COMMIT that hangs, then fails.
    let hold = fault::hold(Point::BeforeCommit, &file(&app));
    let (answered, answer) = mpsc::channel();
    let pool = app.pool.clone();
    let caller = std::thread::spawn(move || {
        let _ = answered.send(pool.write_blocking(ghost_unit));
    });
    let answer = answer
        .recv_timeout(PATIENCE)
        .expect("the blocking caller is answered while its COMMIT hangs");
    assert!(hold.wait_reached(PATIENCE));
    assert!(
        matches!(answer, Err(WriteError::Unavailable(_))),
        "{answer:?}"
    );
    caller.join().expect("caller");
    wait_for_readiness(&app, 503);
    hold.fail();
    wait_until_ready(&app);
    assert_eq!(ghosts(&app.pool), 0, "the failed COMMIT left nothing");
    let after = app.post_order(Some("after"), &body);
    assert_eq!(after.status, 201, "{}", after.body);
}

/// A writer whose replacement cannot open its connection (the writer
/// thread died; every open fails) answers `/readyz` `503` and every write
/// `503` at once, and serves writes again as soon as a connection opens.
/// Before, the watchdog tried to open it on its own thread, and later
/// callers could wait unanswered.
#[test]
fn a_writer_that_cannot_open_a_connection_is_not_ready_and_refuses_writes_until_it_can() {
    let app = TestApp::spawn(Backend::Sqlite);
    let body = order_body("Widget", 1, "1");
    let first = app.post_order(Some("first"), &body);
    assert_eq!(first.status, 201, "{}", first.body);

    let failing = fault::failing(Point::OpenWriter, &file(&app));
    kill_the_writer(&app.pool);
    assert!(
        failing.wait_reached(PATIENCE),
        "a replacement tried to open its connection"
    );
    wait_for_readiness(&app, 503);
    let refused = app.post_order(Some("refused"), &body);
    assert_unavailable(&refused);

    drop(failing);
    wait_until_ready(&app);
    let retry = app.post_order(Some("refused"), &body);
    assert_eq!(retry.status, 201, "the refused key is free: {}", retry.body);
    assert_eq!((app.order_count(), app.ledger_count()), (2, 2));
}

/// Whatever the writer does, a caller is answered within the lease plus
/// `COMMIT_GRACE`: here the replacement of a dead writer thread hangs
/// while it opens its connection (a disk that does not answer), so no
/// thread takes the create that queued for it — its own deadline answers
/// it `503`, and a unit whose caller was answered never runs afterwards.
/// Meanwhile `/readyz` turns not ready; once the open returns, writes are
/// served again, and the key is free.
#[test]
fn a_write_queued_for_a_writer_that_never_takes_it_is_answered_503_at_its_deadline() {
    let app = TestApp::spawn_with(Backend::Sqlite, |s| s.lease_secs = 2);
    let body = order_body("Widget", 1, "1");
    let first = app.post_order(Some("first"), &body);
    assert_eq!(first.status, 201, "{}", first.body);

    let hold = fault::hold(Point::OpenWriter, &file(&app));
    kill_the_writer(&app.pool);
    assert!(hold.wait_reached(PATIENCE), "the replacement is opening");
    let queued = std::thread::scope(|s| {
        let queued = s.spawn(|| app.post_order(Some("queued"), &body));
        // An opening connection is waited for, up to the lease: the create
        // queues for it rather than being refused.
        let deadline = Instant::now() + PATIENCE;
        while crate::group_commit::queued(&app.pool) == 0 && !queued.is_finished() {
            assert!(Instant::now() < deadline, "the create never queued");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(!queued.is_finished(), "the create was refused at once");
        wait_for_readiness(&app, 503);
        queued.join().expect("client")
    });
    assert_unavailable(&queued);

    hold.release();
    wait_until_ready(&app);
    let retry = app.post_order(Some("queued"), &body);
    assert_eq!(retry.status, 201, "the key is free: {}", retry.body);
    assert_eq!((app.order_count(), app.ledger_count()), (2, 2));
}

/// A batch whose `COMMIT` never returns leaves the writer unable to write;
/// once that has lasted the lease plus `COMMIT_GRACE` more, the server
/// stops by itself with an error that says why (the binary then exits
/// non-zero, for its supervisor to restart it). A fresh server on the same
/// database — the dead process's transaction gone with it, as the failed
/// `COMMIT` leaves it here — finds every order that was acknowledged `201`,
/// and the stuck key is free. Before, the server went on, unable to write,
/// and said ready.
#[test]
fn a_writer_that_cannot_recover_stops_the_server_with_an_error_and_a_restart_finds_every_acknowledged_order()
 {
    let app = TestApp::spawn_with(Backend::Sqlite, |s| s.lease_secs = 1);
    let body = order_body("Widget", 1, "1");
    let acknowledged: Vec<TestResponse> = (0..5)
        .map(|i| {
            let created = app.post_order(Some(&format!("acknowledged-{i}")), &body);
            assert_eq!(created.status, 201, "{}", created.body);
            created
        })
        .collect();

    let hold = fault::hold(Point::BeforeCommit, &file(&app));
    let stuck = app.post_order(Some("stuck"), &body);
    assert_unavailable(&stuck);
    let stopped = app.wait_until_stopped(PATIENCE);
    let why = stopped.expect_err("the server stops with an error");
    assert!(
        why.contains("could not write") && why.contains("supervisor"),
        "{why}"
    );
    hold.fail();

    let again = TestApp::spawn_on(app.db.again(), |s| s.lease_secs = 1);
    for created in &acknowledged {
        let location = created.header("Location").expect("Location");
        let found = again.call("GET", location, None, None);
        assert_eq!(found.status, 200, "{location}: {}", found.body);
        assert_eq!(found.json(), created.json());
    }
    let retry = again.post_order(Some("stuck"), &body);
    assert_eq!(retry.status, 201, "the stuck key is free: {}", retry.body);
    assert_not_replayed(&retry);
    assert_eq!((again.order_count(), again.ledger_count()), (6, 6));
}

/// Replacement connections that keep failing to open for the lease plus
/// `COMMIT_GRACE` stop the server with an error that says why.
#[test]
fn a_writer_whose_connections_keep_failing_to_open_stops_the_server_with_an_error() {
    let app = TestApp::spawn_with(Backend::Sqlite, |s| s.lease_secs = 1);
    let first = app.post_order(Some("first"), &order_body("Widget", 1, "1"));
    assert_eq!(first.status, 201, "{}", first.body);

    let _failing = fault::failing(Point::OpenWriter, &file(&app));
    kill_the_writer(&app.pool);
    let why = app
        .wait_until_stopped(PATIENCE)
        .expect_err("the server stops with an error");
    assert!(why.contains("cannot open a writer connection"), "{why}");
}

/// A pool dropped while its writer's replacement cannot open a connection
/// (every open fails, the writer has stopped writing) stops that thread
/// too: the drop returns. The replacement looks for the stop between two
/// tries; had it looked only for a newer replacement, the drop would wait
/// for a thread that never ends (cargo-mutants: `||` → `&&` in `connect`).
#[test]
fn a_pool_dropped_while_its_writer_cannot_open_a_connection_stops_it_and_returns() {
    let db = TestDb::fresh(Backend::Sqlite);
    orders_api::db::run_migrations(&db.url).expect("migrations");
    let pool = orders_api::db::connect(
        &db.url,
        &orders_api::db::PoolOptions {
            max_size: 2,
            connection_timeout: Duration::from_secs(10),
            lease: Duration::from_secs(30),
            write_queue: 16,
            shown: "the test database".into(),
        },
    )
    .expect("pool");
    pool.write_blocking(|_| Ok::<_, diesel::result::Error>(()))
        .expect("the writer")
        .expect("the unit");

    let failing = fault::failing(Point::OpenWriter, db.url.as_str());
    kill_the_writer(&pool);
    assert!(
        failing.wait_reached(PATIENCE),
        "a replacement tried to open its connection"
    );
    let (dropped, on_dropped) = mpsc::channel();
    std::thread::spawn(move || {
        drop(pool);
        let _ = dropped.send(());
    });
    on_dropped
        .recv_timeout(PATIENCE)
        .expect("the drop returns while every open still fails");
    drop(failing);
}

crate::postgres_only! {
    /// PostgreSQL: a unit whose thread never returns (here it waits for the
    /// test; a `COMMIT` waiting for a synchronous standby is another) has its
    /// caller answered `Unavailable` at the lease (1 s) plus `COMMIT_GRACE`,
    /// while it still hangs — the outcome unknown, as a `503` says. Here the
    /// server ended the session idle in its transaction at the lease, so once
    /// the unit returns nothing of it commits.
    fn a_postgresql_unit_that_never_returns_has_its_caller_answered_at_the_lease_plus_the_grace() {
        let db = TestDb::fresh(Backend::Postgres);
        orders_api::db::run_migrations(&db.url).expect("migrations");
        let lease = Duration::from_secs(1);
        let pool = orders_api::db::connect(
            &db.url,
            &orders_api::db::PoolOptions {
                max_size: 2,
                connection_timeout: Duration::from_secs(10),
                lease,
                write_queue: 1,
                shown: "the test database".into(),
            },
        )
        .expect("pool");
        let (running, on_running) = mpsc::channel();
        let (release, on_release) = mpsc::channel::<()>();

        let system = actix_web::rt::System::new();
        let answer = system.block_on(
            pool.write(move |conn| -> Result<(), diesel::result::Error> {
                let Conn::Postgres(c) = conn else {
                    panic!("a PostgreSQL pool")
                };
                c.batch_execute(
                    "INSERT INTO api_keys (user_id, token_hash, token_prefix, created_at) \
                 VALUES ('ghost', 'hung', 'p', now())",
                )?;
                running.send(()).expect("report running");
                let _ = on_release.recv_timeout(PATIENCE);
                Ok(())
            }),
        );
        on_running.try_recv().expect("the unit ran");
        assert!(
            matches!(&answer, Err(WriteError::Unavailable(why)) if why.contains("outcome is unknown")),
            "{answer:?}"
        );
        // Answered while the unit still hangs; now let it return, and let its
        // blocking thread end.
        drop(release);
        drop(system);

        let mut pooled = pool.get().expect("connection");
        let Conn::Postgres(c) = pooled.conn() else {
            panic!("a PostgreSQL pool")
        };
        let ghosts: Count = diesel::RunQueryDsl::get_result(
            diesel::sql_query("SELECT count(*) AS n FROM api_keys WHERE user_id = 'ghost'"),
            c,
        )
        .expect("count");
        assert_eq!(ghosts.n, 0, "the late unit committed");
    }
}

crate::postgres_only! {
    /// On PostgreSQL a create goes as one autocommitted statement; when its
    /// answer does not come back (here: the statement has committed, and its
    /// blocking thread is held before it reports, as a commit waiting for a
    /// synchronous standby or a server that stopped answering would leave it),
    /// the caller is answered `503` with `Retry-After` at the lease plus
    /// `COMMIT_GRACE`, while the thread is still held. The order went through —
    /// the outcome the `503` left unknown — so a retry, still during the hold,
    /// replays it, and one order exists. Before, the caller waited for as long
    /// as the statement's thread did.
    fn a_postgresql_create_whose_statement_never_answers_is_answered_503_and_its_retry_replays_the_order() {
        let app = TestApp::spawn_with(Backend::Postgres, |s| s.lease_secs = 1);
        let body = order_body("Widget", 1, "1");
        // Fault points are held per key for the whole test process: no other
        // test uses this one.
        let key = "never-answered";
        let hold = fault::hold(Point::AfterOneStatement, key);

        let unanswered = app.post_order(Some(key), &body);
        assert!(hold.wait_reached(PATIENCE), "the statement ran");
        // Answered, and the statement's thread is still held.
        assert_unavailable(&unanswered);
        let retry = app.post_order(Some(key), &body);
        assert_eq!(retry.status, 200, "{}", retry.body);
        assert_eq!(retry.header("Idempotent-Replayed"), Some("true"));
        let location = retry.header("Location").expect("Location");
        let found = app.call("GET", location, None, None);
        assert_eq!(found.status, 200, "{}", found.body);
        assert_eq!(found.json(), retry.json());
        hold.release();
        assert_eq!((app.order_count(), app.ledger_count()), (1, 1));
    }
}

#[derive(diesel::QueryableByName)]
struct Count {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    n: i64,
}
