//! SQLite's group commit (`db::writer`): every answered mutation is synced,
//! many requests share one `COMMIT`, and each request of a batch keeps the
//! guarantees it would have alone.
//!
//! The tests compose a batch deterministically: a unit that holds the writer
//! until the test has queued the requests it wants in the next batch (the
//! writer's own queue depth says when they are all waiting).

use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Text};
use orders_api::db::{Backend, Conn, Pool};

use crate::expect::*;
use crate::helpers::*;

/// A unit running on the writer until the returned sender is dropped.
pub struct HeldWriter {
    release: mpsc::Sender<()>,
    holder: JoinHandle<()>,
}

impl HeldWriter {
    pub fn hold(pool: &Pool) -> Self {
        let (running, on_running) = mpsc::channel();
        let (release, on_release) = mpsc::channel::<()>();
        let pool = pool.clone();
        let holder = std::thread::spawn(move || {
            let held = pool.write_blocking(move |_conn| -> Result<(), diesel::result::Error> {
                running.send(()).expect("report running");
                let _ = on_release.recv_timeout(Duration::from_secs(60));
                Ok(())
            });
            held.expect("the holding unit's batch commits")
                .expect("holding unit");
        });
        on_running
            .recv_timeout(Duration::from_secs(30))
            .expect("the writer runs the holding unit");
        Self { release, holder }
    }

    /// Waits until `n` units wait behind the holder, then lets the writer go.
    pub fn release_when_queued(self, pool: &Pool, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while queued(pool) < n {
            assert!(
                Instant::now() < deadline,
                "only {} of {n} units were queued",
                queued(pool)
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(queued(pool), n, "exactly the units of the next batch wait");
        drop(self.release);
        self.holder.join().expect("holder thread");
    }
}

pub fn queued(pool: &Pool) -> usize {
    pool.writer_stats().map_or(0, |s| s.queued)
}

fn batches(pool: &Pool) -> u64 {
    pool.writer_stats().map_or(0, |s| s.batches)
}

fn sqlite<'a>(conn: &'a mut Conn<'_>) -> &'a mut SqliteConnection {
    match conn {
        Conn::Sqlite(c) => c,
        Conn::Postgres(_) => panic!("a SQLite test got a PostgreSQL connection"),
    }
}

#[derive(QueryableByName)]
struct Setting {
    #[diesel(sql_type = BigInt)]
    synchronous: i64,
}

#[derive(QueryableByName)]
struct JournalMode {
    #[diesel(sql_type = Text)]
    journal_mode: String,
}

fn assert_durable(c: &mut SqliteConnection, which: &str) {
    let sync = diesel::sql_query("PRAGMA synchronous")
        .get_result::<Setting>(c)
        .expect("PRAGMA synchronous");
    // 2 = FULL, 3 = EXTRA: the WAL is synced at every commit.
    assert!(
        sync.synchronous >= 2,
        "{which}: synchronous = {}",
        sync.synchronous
    );
    let mode = diesel::sql_query("PRAGMA journal_mode")
        .get_result::<JournalMode>(c)
        .expect("PRAGMA journal_mode");
    assert_eq!(mode.journal_mode, "wal", "{which}");
}

#[test]
fn every_sqlite_connection_of_the_pool_and_the_writer_syncs_each_commit() {
    let app = TestApp::spawn_with(Backend::Sqlite, |s| s.pool_size = 4);
    // Hold every pooled connection at once, so that each one is checked.
    let mut held: Vec<_> = (0..4)
        .map(|_| app.pool.get().expect("connection"))
        .collect();
    for (i, pooled) in held.iter_mut().enumerate() {
        assert_durable(
            sqlite(&mut pooled.conn()),
            &format!("pooled connection {i}"),
        );
    }
    drop(held);
    app.pool
        .write_blocking(|conn| -> Result<(), diesel::result::Error> {
            assert_durable(sqlite(conn), "the writer");
            Ok(())
        })
        .expect("writer")
        .expect("unit");
}

#[test]
fn requests_that_wait_together_share_one_commit_and_each_is_stored() {
    let app = TestApp::spawn(Backend::Sqlite);
    let before = {
        let held = HeldWriter::hold(&app.pool);
        let before = batches(&app.pool);
        std::thread::scope(|s| {
            let posts: Vec<_> = (0..8)
                .map(|i| {
                    let app = &app;
                    s.spawn(move || {
                        app.post_order(Some(&format!("k{i}")), &order_body("Widget", 1, "1"))
                    })
                })
                .collect();
            held.release_when_queued(&app.pool, 8);
            for post in posts {
                let response = post.join().expect("client");
                assert_eq!(response.status, 201, "{}", response.body);
            }
        });
        before
    };
    // The holder's batch, then one batch for all eight.
    assert_eq!(batches(&app.pool) - before, 2, "eight requests, one commit");
    assert_eq!((app.order_count(), app.ledger_count()), (8, 8));
}

/// One transaction commits at most `MAX_BATCH` units: with one more than
/// that queued behind a held writer, the first batch takes `MAX_BATCH` and
/// the last unit commits in a batch of its own. (cargo-mutants: a batch of
/// `MAX_BATCH + 1` passed every other test.)
#[test]
fn a_batch_commits_at_most_max_batch_units_and_the_next_takes_the_rest() {
    use idempotency_ledger::db::writer::MAX_BATCH;
    let app = TestApp::spawn(Backend::Sqlite);
    let held = HeldWriter::hold(&app.pool);
    let before = app.pool.writer_stats().expect("the writer runs");
    std::thread::scope(|s| {
        let units: Vec<_> = (0..=MAX_BATCH)
            .map(|_| {
                let pool = app.pool.clone();
                s.spawn(move || pool.write_blocking(|_| Ok::<_, diesel::result::Error>(())))
            })
            .collect();
        held.release_when_queued(&app.pool, MAX_BATCH + 1);
        for unit in units {
            let answer = unit.join().expect("caller");
            assert!(matches!(answer, Ok(Ok(()))), "{answer:?}");
        }
    });
    let after = app.pool.writer_stats().expect("the writer runs");
    // The holder's batch, one of MAX_BATCH, one of the last unit.
    assert_eq!(after.batches - before.batches, 3, "{before:?} → {after:?}");
    assert_eq!(
        after.units - before.units,
        u64::try_from(MAX_BATCH).unwrap() + 2
    );
}

/// One unit per key waits for the writer: the second request with the key
/// waits outside the queue for the first (see `bounds.rs`), then replays it.
#[test]
fn two_requests_with_one_key_run_once_and_the_second_replays_the_first() {
    let app = TestApp::spawn(Backend::Sqlite);
    let body = order_body("Widget", 2, "9.99");
    let held = HeldWriter::hold(&app.pool);
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| app.post_order(Some("twice"), &body));
        let b = s.spawn(|| app.post_order(Some("twice"), &body));
        held.release_when_queued(&app.pool, 1);
        (a.join().expect("client a"), b.join().expect("client b"))
    });
    let (first, replay) = if a.status == 201 { (a, b) } else { (b, a) };
    assert_eq!(first.status, 201, "{}", first.body);
    assert_replay_of(&first, &replay);
    assert_eq!((app.order_count(), app.ledger_count()), (1, 1));
}

#[test]
fn a_unit_that_fails_is_rolled_back_alone_and_the_rest_of_its_batch_commits() {
    let app = TestApp::spawn(Backend::Sqlite);
    let held = HeldWriter::hold(&app.pool);
    std::thread::scope(|s| {
        let before = s.spawn(|| app.post_order(Some("before"), &order_body("Widget", 1, "1")));
        let pool = app.pool.clone();
        let failing = s.spawn(move || {
            pool.write_blocking(|conn| -> Result<(), diesel::result::Error> {
                sqlite(conn).batch_execute(
                    "INSERT INTO api_keys (user_id, token_hash, token_prefix, created_at) \
                     VALUES ('ghost', 'h', 'p', '2026-01-01')",
                )?;
                Err(diesel::result::Error::RollbackTransaction)
            })
        });
        let after = s.spawn(|| app.post_order(Some("after"), &order_body("Widget", 1, "1")));
        held.release_when_queued(&app.pool, 3);
        assert_eq!(before.join().expect("client").status, 201);
        assert_eq!(after.join().expect("client").status, 201);
        let failed = failing.join().expect("failing unit");
        assert!(
            matches!(failed, Ok(Err(_))),
            "the unit's own error: {failed:?}"
        );
    });
    assert_eq!((app.order_count(), app.ledger_count()), (2, 2));
    let ghosts: i64 = {
        let mut pooled = app.pool.get().expect("connection");
        let mut conn = pooled.conn();
        orders_api::db::schema::sqlite::api_keys::table
            .filter(orders_api::db::schema::sqlite::api_keys::user_id.eq("ghost"))
            .count()
            .get_result(sqlite(&mut conn))
            .expect("count")
    };
    assert_eq!(ghosts, 0, "the failed unit's insert was rolled back");
}

#[test]
fn a_batch_whose_commit_fails_answers_every_request_503_records_none_and_frees_every_key() {
    let app = TestApp::spawn(Backend::Sqlite);
    // A deferred foreign key makes the COMMIT itself fail, whatever the units did.
    app.pool
        .write_blocking(|conn| -> Result<(), diesel::result::Error> {
            sqlite(conn).batch_execute(
                "CREATE TABLE parent (id INTEGER PRIMARY KEY);
                 CREATE TABLE child (parent INTEGER REFERENCES parent (id) DEFERRABLE INITIALLY DEFERRED);",
            )
        })
        .expect("writer")
        .expect("tables");
    let keys = ["a", "b", "c"];
    let held = HeldWriter::hold(&app.pool);
    std::thread::scope(|s| {
        let posts: Vec<_> = keys
            .iter()
            .map(|key| s.spawn(|| app.post_order(Some(key), &order_body("Widget", 1, "1"))))
            .collect();
        let pool = app.pool.clone();
        let orphan = s.spawn(move || {
            pool.write_blocking(|conn| -> Result<(), diesel::result::Error> {
                sqlite(conn).batch_execute("INSERT INTO child (parent) VALUES (42)")
            })
        });
        held.release_when_queued(&app.pool, keys.len() + 1);
        for post in posts {
            let response = post.join().expect("client");
            assert_problem(&response, 503, "SERVICE_UNAVAILABLE");
            assert!(
                response.header("Retry-After").is_some(),
                "503 without Retry-After"
            );
        }
        let orphan = orphan.join().expect("orphan unit");
        assert!(
            orphan.is_err(),
            "the failed commit is reported to every unit: {orphan:?}"
        );
    });
    assert_eq!(
        (app.order_count(), app.ledger_count()),
        (0, 0),
        "nothing persisted"
    );

    // Every key is free: each retry runs now.
    for key in keys {
        let retry = app.post_order(Some(key), &order_body("Widget", 1, "1"));
        assert_eq!(retry.status, 201, "{}", retry.body);
        assert_not_replayed(&retry);
    }
    assert_eq!((app.order_count(), app.ledger_count()), (3, 3));
}

#[test]
fn a_full_write_queue_answers_503_with_retry_after_and_changes_nothing() {
    let app = TestApp::spawn_with(Backend::Sqlite, |s| s.write_queue = 2);
    let held = HeldWriter::hold(&app.pool);
    std::thread::scope(|s| {
        let queued: Vec<_> = ["q1", "q2"]
            .into_iter()
            .map(|key| s.spawn(|| app.post_order(Some(key), &order_body("Widget", 1, "1"))))
            .collect();
        let deadline = Instant::now() + Duration::from_secs(30);
        while queued_len(&app) < 2 {
            assert!(Instant::now() < deadline, "the queue never filled");
            std::thread::sleep(Duration::from_millis(5));
        }
        let refused = app.post_order(Some("overflow"), &order_body("Widget", 1, "1"));
        assert_problem(&refused, 503, "SERVICE_UNAVAILABLE");
        assert!(
            refused.header("Retry-After").is_some(),
            "503 without Retry-After"
        );
        held.release_when_queued(&app.pool, 2);
        for post in queued {
            assert_eq!(post.join().expect("client").status, 201);
        }
    });
    assert_eq!((app.order_count(), app.ledger_count()), (2, 2));
    let retry = app.post_order(Some("overflow"), &order_body("Widget", 1, "1"));
    assert_eq!(retry.status, 201, "the refused key is free: {}", retry.body);
}

fn queued_len(app: &TestApp) -> usize {
    queued(&app.pool)
}
