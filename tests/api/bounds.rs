//! Bounds that fire (CONTRACT §4, "Bounds that fire"): each limit the
//! docs state, shown firing with the default settings — writes admitted at
//! once, a writer unit that hangs or panics, a duplicate that waits for the
//! first request with its key. (The body deadline is in `abuse.rs`, the
//! client's `--max-wait` in `client.rs`.)
//!
//! Requests pile up deterministically: the test holds the database (the
//! SQLite writer, or a lock the first request needs) and watches the queue,
//! never the clock.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use idempotency_ledger::DEFAULT_WRITE_ADMISSION;
use idempotency_ledger::fault::{self, Point};
use orders_api::db::Backend;

use crate::expect::*;
use crate::group_commit::{HeldWriter, queued};
use crate::helpers::*;

const PATIENCE: Duration = Duration::from_secs(30);

/// A `503` as every one the service sends: problem+json, `Retry-After`,
/// `X-Should-Retry: true`.
pub fn assert_unavailable(response: &TestResponse) {
    assert_problem(response, 503, "SERVICE_UNAVAILABLE");
    assert!(
        response.header("Retry-After").is_some(),
        "503 without Retry-After"
    );
    assert_eq!(response.header("X-Should-Retry"), Some("true"));
}

/// With the default settings, more concurrent creates than
/// `WRITE_ADMISSION` while the writer is held: exactly the bound is admitted
/// (waiting in the writer's queue), every other one is answered `503` with
/// `Retry-After` while the writer is still held, reads are answered
/// meanwhile, and each refused key is free for a retry. While every slot
/// is taken a replay is shed too, on arrival (before its read), and
/// replays once a slot is free. Before, every create was admitted and
/// waited; then every shed create first read the ledger.
#[test]
fn creates_beyond_the_write_admission_are_answered_503_at_once_and_their_keys_stay_free() {
    let app = TestApp::spawn(Backend::Sqlite);
    let bound = usize::try_from(DEFAULT_WRITE_ADMISSION).unwrap();
    let excess = 16;
    let body = order_body("Widget", 1, "1");
    let answered = AtomicUsize::new(0);

    let recorded = app.post_order(Some("recorded"), &body);
    assert_eq!(recorded.status, 201, "{}", recorded.body);
    let shed_before = writes_shed(&app);
    let held = HeldWriter::hold(&app.pool);
    let responses: Vec<(String, TestResponse)> = std::thread::scope(|s| {
        let posts: Vec<_> = (0..bound + excess)
            .map(|i| {
                let (app, body, answered) = (&app, &body, &answered);
                s.spawn(move || {
                    let key = format!("admit-{i}");
                    let response = app.post_order(Some(&key), body);
                    answered.fetch_add(1, Ordering::SeqCst);
                    (key, response)
                })
            })
            .collect();
        // The excess is answered while the writer is still held.
        let deadline = Instant::now() + PATIENCE;
        while answered.load(Ordering::SeqCst) < excess || queued(&app.pool) < bound {
            assert!(
                Instant::now() < deadline,
                "{} answered, {} queued while the writer is held",
                answered.load(Ordering::SeqCst),
                queued(&app.pool)
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(answered.load(Ordering::SeqCst), excess);
        let read = app.call("GET", "/v1/orders", None, None);
        assert_eq!(
            read.status, 200,
            "a read waits behind held writes: {}",
            read.body
        );
        assert_eq!(app.request("GET", "/healthz", &[], None).status, 200);
        let replay = app.post_order(Some("recorded"), &body);
        assert_unavailable(&replay);
        held.release_when_queued(&app.pool, bound);
        posts
            .into_iter()
            .map(|p| p.join().expect("client"))
            .collect()
    });

    let shed: Vec<&String> = responses
        .iter()
        .filter(|(_, r)| r.status == 503)
        .map(|(key, _)| key)
        .collect();
    assert_eq!(shed.len(), excess);
    // The process's counter, shared with every test running beside this one:
    // it rose by at least this test's sheds.
    let counted = writes_shed(&app) - shed_before;
    assert!(counted >= excess as f64, "{counted} shed writes counted");
    for (_, response) in &responses {
        match response.status {
            201 => {}
            503 => assert_unavailable(response),
            other => panic!("unexpected {other}: {}", response.body),
        }
    }
    assert_eq!(app.order_count(), i64::try_from(bound + 1).unwrap());
    let replay = app.post_order(Some("recorded"), &body);
    assert_eq!(replay.status, 200, "a slot is free: {}", replay.body);
    assert_eq!(replay.body, recorded.body);
    for key in shed {
        let retry = app.post_order(Some(key), &body);
        assert_eq!(retry.status, 201, "the refused key is free: {}", retry.body);
        assert_not_replayed(&retry);
    }
    assert_eq!(
        (app.order_count(), app.ledger_count()),
        (
            i64::try_from(bound + excess + 1).unwrap(),
            i64::try_from(bound + excess + 1).unwrap()
        )
    );
}

/// `orders_api_writes_shed_total` on the app's `/metrics` (0 before the first).
fn writes_shed(app: &TestApp) -> f64 {
    let metrics = app.request("GET", "/metrics", &[], None).body.clone();
    metrics
        .lines()
        .find_map(|line| line.strip_prefix("orders_api_writes_shed_total "))
        .map_or(0.0, |value| {
            value.trim().parse().expect("a counter's value")
        })
}

/// The next create's transaction, held in the database until released:
/// on SQLite a unit holding the writer (the create waits in its queue), on
/// PostgreSQL an insert trigger that waits for an advisory lock the test
/// holds (with no lock timeout; the lease still bounds it).
enum HeldCreate {
    Sqlite(HeldWriter),
    Postgres(diesel::PgConnection),
}

/// The advisory lock the PostgreSQL trigger waits for.
const HOLD_LOCK: i64 = 16_016;

impl HeldCreate {
    fn hold(app: &TestApp) -> Self {
        use diesel::Connection;
        use diesel::connection::SimpleConnection;
        match app.db.backend() {
            Backend::Sqlite => HeldCreate::Sqlite(HeldWriter::hold(&app.pool)),
            Backend::Postgres => {
                let mut conn = diesel::PgConnection::establish(app.db.url.as_str()).unwrap();
                conn.batch_execute(&format!(
                    "CREATE FUNCTION hold_insert() RETURNS trigger LANGUAGE plpgsql \
                     SET lock_timeout = 0 AS $$ BEGIN \
                     PERFORM pg_advisory_lock({HOLD_LOCK}); PERFORM pg_advisory_unlock({HOLD_LOCK}); \
                     RETURN NEW; END $$; \
                     CREATE TRIGGER hold BEFORE INSERT ON orders \
                     FOR EACH ROW EXECUTE FUNCTION hold_insert(); \
                     SELECT pg_advisory_lock({HOLD_LOCK});"
                ))
                .unwrap();
                HeldCreate::Postgres(conn)
            }
        }
    }

    /// Waits until one create is held.
    fn wait_for_one(&self, app: &TestApp) {
        let deadline = Instant::now() + PATIENCE;
        let held = || match self {
            HeldCreate::Sqlite(_) => queued(&app.pool) >= 1,
            HeldCreate::Postgres(_) => {
                crate::process::pg_sessions_where(
                    &app.db.url,
                    "wait_event_type = 'Lock' AND wait_event = 'advisory'",
                ) >= 1
            }
        };
        while !held() {
            assert!(Instant::now() < deadline, "the create was never held");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Lets the held create go; on SQLite after checking that it alone
    /// waits for the writer (a duplicate waits outside it).
    fn release(self, app: &TestApp) {
        use diesel::connection::SimpleConnection;
        match self {
            HeldCreate::Sqlite(held) => held.release_when_queued(&app.pool, 1),
            HeldCreate::Postgres(mut conn) => conn
                .batch_execute(&format!(
                    "SELECT pg_advisory_unlock({HOLD_LOCK}); DROP TRIGGER hold ON orders;"
                ))
                .unwrap(),
        }
    }
}

crate::both_backends! {
    /// A duplicate of a create held in the database waits for it — outside
    /// the writer's queue on SQLite, holding no connection on PostgreSQL —
    /// and replays its answer once it commits. The duplicate is waiting
    /// (counted among its key's waiters, at the ledger's `Waiting` fault
    /// point) before the create is let go.
    fn a_duplicate_of_a_held_create_waits_for_it_and_replays_its_answer(backend) {
        let app = TestApp::spawn(backend);
        let body = order_body("Widget", 2, "9.99");
        // Fault holds are process-wide: each backend's copy has its own key.
        let key = format!("waited-for-{backend:?}");
        let key: &str = &key;
        let held = HeldCreate::hold(&app);

        let (first, duplicate) = std::thread::scope(|s| {
            let first = s.spawn(|| app.post_order(Some(key), &body));
            held.wait_for_one(&app);
            let waiting = fault::hold(Point::Waiting, key);
            let duplicate = s.spawn(|| app.post_order(Some(key), &body));
            assert!(
                waiting.wait_reached(PATIENCE),
                "the duplicate never waited for the held create"
            );
            // Back to its wait for the holder, then the holder goes on.
            waiting.release();
            assert!(!duplicate.is_finished(), "answered while the create was held");
            held.release(&app);
            (first.join().expect("first"), duplicate.join().expect("duplicate"))
        });

        assert_eq!(first.status, 201, "{}", first.body);
        assert_replay_of(&first, &duplicate);
        assert_eq!((app.order_count(), app.ledger_count()), (1, 1));
    }

    /// Past `IDEMPOTENCY_WAIT_SECS` (1 s here) the duplicate of a
    /// create still held is answered `409 IDEMPOTENCY_IN_PROGRESS` with
    /// `Retry-After` and `X-Should-Retry: true`, having changed nothing; the
    /// first then commits, and a retry replays it. Before, SQLite kept the
    /// duplicate waiting for as long as the first was held, and PostgreSQL
    /// sent no `X-Should-Retry`.
    fn a_duplicate_still_waiting_after_the_bound_is_answered_409_in_progress_with_should_retry(backend) {
        let app = TestApp::spawn_with(backend, |s| s.idempotency_wait_secs = 1);
        let body = order_body("Widget", 2, "9.99");
        let held = HeldCreate::hold(&app);

        let (first, duplicate) = std::thread::scope(|s| {
            let first = s.spawn(|| app.post_order(Some("held"), &body));
            held.wait_for_one(&app);
            let duplicate = app.post_order(Some("held"), &body);
            assert_eq!(app.order_count(), 0, "the duplicate created nothing");
            held.release(&app);
            (first.join().expect("first"), duplicate)
        });

        crate::race::assert_in_progress(&duplicate);
        assert_eq!(first.status, 201, "{}", first.body);
        let retry = app.post_order(Some("held"), &body);
        assert_replay_of(&first, &retry);
        assert_eq!((app.order_count(), app.ledger_count()), (1, 1));
    }

    /// With `WRITE_ADMISSION=1` and its one slot held by a create stuck in
    /// the database, a replay of a recorded key, a duplicate of the held key
    /// and a new key are each answered `503` with `Retry-After` at once,
    /// changing nothing; once the create commits, the replay replays and
    /// the new key runs. The shed on arrival and the replay's read-only
    /// path, met through HTTP on both backends.
    fn while_the_one_write_slot_is_held_a_replay_a_duplicate_and_a_new_key_are_shed_then_served(backend) {
        let app = TestApp::spawn_with(backend, |s| s.write_admission = 1);
        let body = order_body("Widget", 2, "9.99");
        let recorded = app.post_order(Some("recorded"), &body);
        assert_eq!(recorded.status, 201, "{}", recorded.body);
        let held = HeldCreate::hold(&app);

        let first = std::thread::scope(|s| {
            let first = s.spawn(|| app.post_order(Some("held"), &body));
            held.wait_for_one(&app);
            for key in ["recorded", "held", "fresh"] {
                let shed = app.post_order(Some(key), &body);
                assert_unavailable(&shed);
            }
            assert!(!first.is_finished(), "all of that while the create was held");
            held.release(&app);
            first.join().expect("first")
        });

        assert_eq!(first.status, 201, "{}", first.body);
        let replay = app.post_order(Some("recorded"), &body);
        assert_replay_of(&recorded, &replay);
        let fresh = app.post_order(Some("fresh"), &body);
        assert_eq!(fresh.status, 201, "the shed key is free: {}", fresh.body);
        assert_not_replayed(&fresh);
        assert_eq!((app.order_count(), app.ledger_count()), (3, 3));
    }

    /// With the default settings, every read of the database stuck the way
    /// a frozen file system leaves it (the `Read` fault point: a blocking
    /// thread that never returns, its connection checked out): a create
    /// (the read of its key), `GET` of an order, the list, the lookup of a
    /// token not seen yet and `/readyz` are each answered `503` with
    /// `Retry-After` while the reads are still stuck — within the pool's
    /// read bound (`/readyz`, its own). Once the reads return, every user is
    /// served again, and the create's key, recorded by nothing, runs. Before,
    /// every one of them waited for as long as its read did.
    fn reads_stuck_as_on_a_frozen_file_system_are_answered_503_and_served_again_once_they_return(backend) {
        // Alice's token stays remembered, so that her requests reach their
        // own reads; carol's has never been looked up.
        let app = TestApp::spawn_with(backend, |s| s.auth_cache_secs = 600);
        let body = order_body("Widget", 1, "1.00");
        let created = app.post_order(Some("before"), &body);
        assert_eq!(created.status, 201, "{}", created.body);
        let order = created.header("Location").expect("Location").to_owned();
        let carol = app.create_token("carol");
        let bob = app.create_token("bob");

        let frozen = fault::frozen(Point::Read, &database_shown(&app));
        let asked: [(&str, &str, &str, Option<&str>); 5] = [
            ("create", "POST", "/v1/orders", Some("during")),
            ("get", "GET", &order, None),
            ("list", "GET", "/v1/orders", None),
            ("token lookup", "GET", "/v1/orders", None),
            ("readyz", "GET", "/readyz", None),
        ];
        let answers = std::thread::scope(|s| {
            let (tx, rx) = std::sync::mpsc::channel();
            for (label, method, path, key) in asked {
                let (tx, app, body, carol) = (tx.clone(), &app, &body, &carol);
                s.spawn(move || {
                    let token = if label == "token lookup" { carol } else { &app.token };
                    let started = Instant::now();
                    let body = (method == "POST").then_some(body.as_str());
                    let answer = app.call_as(token, method, path, key, body);
                    let _ = tx.send((label, answer, started.elapsed()));
                });
            }
            let mut answers = Vec::new();
            for _ in asked {
                match rx.recv_timeout(PATIENCE) {
                    Ok(answer) => answers.push(answer),
                    Err(_) => {
                        drop(frozen);
                        panic!("answered while every read was stuck: only {answers:?}");
                    }
                }
            }
            assert_eq!(
                frozen.waiting(),
                asked.len(),
                "each request's read is still stuck when it is answered"
            );
            drop(frozen);
            answers
        });

        for (label, answer, waited) in &answers {
            eprintln!("{label}: {} after {waited:?} with its read stuck", answer.status);
            assert_unavailable(answer);
        }
        let served = app.post_order(Some("during"), &body);
        assert_eq!(served.status, 201, "the refused key is free: {}", served.body);
        assert_not_replayed(&served);
        assert_eq!(app.call("GET", &order, None, None).status, 200);
        assert_eq!(app.call_as(&carol, "GET", "/v1/orders", None, None).status, 200);
        let bobs = app.call_as(&bob, "POST", "/v1/orders", Some("bob-1"), Some(&body));
        assert_eq!(bobs.status, 201, "{}", bobs.body);
        assert_eq!(app.request("GET", "/readyz", &[], None).status, 200);
        assert_eq!((app.order_count(), app.ledger_count()), (3, 3));
    }
}

/// Blocks a writer unit until the test lets it go (at most a minute).
fn hanging_unit(
    running: std::sync::mpsc::Sender<()>,
    release: std::sync::mpsc::Receiver<()>,
) -> impl FnOnce(&mut orders_api::db::Conn<'_>) -> Result<(), diesel::result::Error> + Send + 'static
{
    move |conn| {
        use diesel::connection::SimpleConnection;
        let orders_api::db::Conn::Sqlite(c) = conn else {
            panic!("a SQLite writer")
        };
        c.batch_execute(
            "INSERT INTO api_keys (user_id, token_hash, token_prefix, created_at) \
             VALUES ('ghost', 'hung', 'p', '2026-01-01')",
        )?;
        running.send(()).expect("report running");
        let _ = release.recv_timeout(Duration::from_secs(60));
        Ok(())
    }
}

fn ghosts(app: &TestApp) -> i64 {
    use diesel::prelude::*;
    use orders_api::db::schema::sqlite::api_keys;
    let mut pooled = app.pool.get().expect("connection");
    let orders_api::db::Conn::Sqlite(c) = pooled.conn() else {
        panic!("a SQLite pool")
    };
    api_keys::table
        .filter(api_keys::user_id.eq("ghost"))
        .count()
        .get_result(c)
        .expect("count")
}

/// A unit that hangs past the lease (1 s here) is abandoned: its
/// caller is answered `Unavailable` while it still hangs, so is the create
/// queued behind it (`503` with `Retry-After`), and it never commits, even
/// once it returns; then the replaced writer serves the next writes, the
/// refused key among them. Before, every write of the process waited for the
/// hung unit, for as long as it hung.
#[test]
fn a_writer_unit_that_hangs_past_the_lease_is_abandoned_rolled_back_and_the_writer_replaced() {
    let app = TestApp::spawn_with(Backend::Sqlite, |s| s.lease_secs = 1);
    let body = order_body("Widget", 1, "1");
    let (running, on_running) = std::sync::mpsc::channel();
    let (release, on_release) = std::sync::mpsc::channel::<()>();
    let (hung_answer, on_hung_answer) = std::sync::mpsc::channel();

    let behind = std::thread::scope(|s| {
        let pool = app.pool.clone();
        s.spawn(move || {
            let answer = pool.write_blocking(hanging_unit(running, on_release));
            let _ = hung_answer.send(answer);
        });
        on_running.recv_timeout(PATIENCE).expect("the unit runs");
        let behind = s.spawn(|| app.post_order(Some("behind"), &body));
        let answer = on_hung_answer
            .recv_timeout(PATIENCE)
            .expect("the hung unit's caller is answered while it hangs");
        assert!(
            matches!(answer, Err(orders_api::db::WriteError::Unavailable(_))),
            "{answer:?}"
        );
        let behind = behind.join().expect("client");
        // Answered while the unit still hangs; now let it return.
        drop(release);
        behind
    });

    assert_unavailable(&behind);
    let stats = app.pool.writer_stats().expect("the writer ran");
    assert!(stats.replaced >= 1, "{stats:?}");
    // Writing resumes once the hung unit has returned and been rolled back.
    crate::writer_bounds::wait_until_ready(&app);
    let retry = app.post_order(Some("behind"), &body);
    assert_eq!(retry.status, 201, "the refused key is free: {}", retry.body);
    assert_not_replayed(&retry);
    assert_eq!(ghosts(&app), 0, "the abandoned unit committed");
    assert_eq!((app.order_count(), app.ledger_count()), (1, 1));
}

/// A panic whose payload panics again when dropped: the second panic is
/// outside the unit's `catch_unwind` and kills the writer thread.
struct Bomb;

impl Drop for Bomb {
    fn drop(&mut self) {
        panic!("the writer thread dies");
    }
}

/// A writer thread that dies mid-batch (a panic its units'
/// `catch_unwind` cannot hold) is replaced: the create in its batch is
/// answered `503` with `Retry-After`, nothing of the batch persists, and the
/// next writes are served — the refused key first. Before, every write after
/// the death was refused until a restart.
#[test]
fn a_writer_thread_that_dies_is_replaced_and_the_requests_it_held_are_answered_503() {
    let app = TestApp::spawn(Backend::Sqlite);
    let body = order_body("Widget", 1, "1");

    let held = HeldWriter::hold(&app.pool);
    let (in_batch, bomb) = std::thread::scope(|s| {
        let in_batch = s.spawn(|| app.post_order(Some("in-batch"), &body));
        let deadline = Instant::now() + PATIENCE;
        while queued(&app.pool) < 1 {
            assert!(Instant::now() < deadline, "the create never queued");
            std::thread::sleep(Duration::from_millis(5));
        }
        let pool = app.pool.clone();
        let bomb = s.spawn(move || {
            pool.write_blocking(|_conn| -> Result<(), diesel::result::Error> {
                std::panic::panic_any(Bomb)
            })
        });
        held.release_when_queued(&app.pool, 2);
        (
            in_batch.join().expect("client"),
            bomb.join().expect("bomb's caller"),
        )
    });

    assert_unavailable(&in_batch);
    assert!(bomb.is_err(), "{bomb:?}");
    let stats = app.pool.writer_stats().expect("the writer ran");
    assert!(stats.replaced >= 1, "{stats:?}");
    assert_eq!((app.order_count(), app.ledger_count()), (0, 0));
    let retry = app.post_order(Some("in-batch"), &body);
    assert_eq!(retry.status, 201, "the refused key is free: {}", retry.body);
    assert_not_replayed(&retry);
}

/// The key of the pool's `Read` fault point: the database as it is shown.
fn database_shown(app: &TestApp) -> String {
    app.settings.pool_options().shown
}
