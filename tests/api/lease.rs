//! The lease and the in-progress answer, driven at the ledger's own level
//! (`Ledger::execute` against the test database): a holder past its lease
//! records nothing, a failed mutation frees its key, a concurrent request
//! waits or is told `IDEMPOTENCY_IN_PROGRESS`, and a hung holder is taken
//! over without ever committing afterwards.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use actix_web::http::StatusCode;
use std::future::Future;

use idempotency_ledger::protocol::{Created, Entry, NewEntry, Storage, StorageError};
use idempotency_ledger::row::Row;
use idempotency_ledger::{
    Completion, Fingerprint, IdempotencyKey, Ledger, LedgerError, LedgerRequest, LedgerTx, Outcome,
    RecordedResponse,
};
use orders_api::db::{self, Conn, Pool, PoolOptions, WriteError};
use orders_api::http::mutation::json_reply;
use orders_api::orders;
use orders_api::orders::input::parse_new_order;
use serde_json::Value;

use crate::both_backends;
use crate::helpers::*;
use crate::process::{ledger_count, order_count, order_id_for_key};

const USER: &str = "alice";
const DAY: Duration = Duration::from_secs(86_400);
/// How long a request waits for another one with its key (the default).
const WAIT: Duration = Duration::from_secs(orders_api::config::DEFAULT_WAIT_SECS);

/// The error a test mutation fails with (a 5xx, for the HTTP layer).
#[derive(Debug, PartialEq, Eq)]
struct Failed;

/// A `POST /v1/orders` as the ledger sees it.
#[derive(Clone)]
struct CreateRequest {
    key: IdempotencyKey,
    fingerprint: Fingerprint,
    json: Value,
    body: String,
}

impl CreateRequest {
    fn new(key: &str, body: &str) -> Self {
        let json: Value = serde_json::from_str(body).expect("JSON body");
        Self {
            key: IdempotencyKey::parse(key.as_bytes()).expect("a valid key"),
            // What the server computes for the same request.
            fingerprint: Fingerprint::of("POST", "/v1/orders", body.as_bytes(), Some(&json)),
            json,
            body: body.to_owned(),
        }
    }

    fn ledger(&self) -> LedgerRequest<'_> {
        LedgerRequest {
            user_id: USER,
            key: &self.key,
            fingerprint: &self.fingerprint,
        }
    }

    /// The create route's unit: insert, answer 201, record; counts its runs.
    fn unit(
        &self,
        runs: &Arc<AtomicUsize>,
    ) -> impl FnOnce(&mut LedgerTx<'_, '_>) -> Result<Completion, Failed> + Send + 'static {
        let (request, runs) = (self.clone(), Arc::clone(runs));
        move |tx| {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok(Completion::Record(request.run(tx)))
        }
    }

    /// What the create route does inside its unit: insert, answer 201.
    fn run(&self, tx: &mut LedgerTx<'_, '_>) -> RecordedResponse {
        let new = parse_new_order(&self.json).expect("a valid order");
        let order = orders::prepare(USER, &self.fingerprint, new);
        let written = tx
            .insert(&orders::new_row(&order, &self.key))
            .expect("insert order");
        assert!(written, "expected a new order");
        json_reply(
            StatusCode::CREATED,
            &order.view(),
            Some(format!("/v1/orders/{}", order.id)),
        )
    }
}

/// The ledger's async entry, for a test thread.
trait ExecuteBlocking {
    fn execute_blocking<E, F>(
        &self,
        request: LedgerRequest<'_>,
        mutation: F,
    ) -> Result<Outcome, LedgerError<E>>
    where
        F: FnOnce(&mut LedgerTx<'_, '_>) -> Result<Completion, E> + Send + 'static,
        E: Send + 'static;
}

impl<S: Storage> ExecuteBlocking for Ledger<S> {
    fn execute_blocking<E, F>(
        &self,
        request: LedgerRequest<'_>,
        mutation: F,
    ) -> Result<Outcome, LedgerError<E>>
    where
        F: FnOnce(&mut LedgerTx<'_, '_>) -> Result<Completion, E> + Send + 'static,
        E: Send + 'static,
    {
        actix_web::rt::System::new().block_on(self.execute(request, mutation))
    }
}

/// A ledger with the server's settings, writing through `pool`, whose
/// fence (and every other bound the protocol itself keeps) is at `lease`,
/// whatever the pool enforces at its own.
fn ledger(pool: &Pool, lease: Duration) -> Ledger<Fenced> {
    let mut settings = orders_api::config::Settings::for_database(
        orders_api::db::DatabaseUrl::parse("sqlite://unused.db").expect("a URL"),
    );
    settings.idempotency_wait_secs = WAIT.as_secs();
    settings.retention_secs = DAY.as_secs();
    let storage = Fenced {
        pool: pool.clone(),
        lease,
    };
    Ledger::new(storage, settings.ledger_settings())
}

/// The pool as the protocol's storage, but for the lease it tells the
/// protocol: a test of the fence alone, apart from the bounds the pool
/// keeps at its own lease (the SQLite watchdog, PostgreSQL's timeouts).
#[derive(Clone)]
struct Fenced {
    pool: Pool,
    lease: Duration,
}

impl Storage for Fenced {
    type Share = <Pool as Storage>::Share;

    fn lease(&self) -> Duration {
        self.lease
    }

    fn find(
        &self,
        user: &str,
        key: &str,
    ) -> impl Future<Output = Result<Option<Entry>, StorageError>> + Send {
        self.pool.find(user, key)
    }

    fn unit<F, T, E>(
        &self,
        work: F,
    ) -> impl Future<Output = Result<Result<T, E>, WriteError>> + Send
    where
        F: FnOnce(&mut Conn<'_>) -> Result<T, E> + Send + 'static,
        T: Send + 'static,
        E: From<diesel::result::Error> + Send + 'static,
    {
        self.pool.unit(work)
    }

    fn try_lock(
        conn: &mut Conn<'_>,
        user: &str,
        key: &str,
        lease: Duration,
    ) -> Result<bool, diesel::result::Error> {
        Pool::try_lock(conn, user, key, lease)
    }

    fn record(conn: &mut Conn<'_>, entry: &NewEntry) -> Result<bool, diesel::result::Error> {
        Pool::record(conn, entry)
    }

    fn share(&self) -> impl Future<Output = Option<Self::Share>> + Send {
        self.pool.share()
    }

    fn create<R: Row>(
        &self,
        row: Arc<R>,
        entry: impl FnOnce() -> NewEntry + Send,
    ) -> impl Future<Output = Result<Created, StorageError>> + Send {
        self.pool.create(row, entry)
    }
}

/// A migrated database's pool whose PostgreSQL sessions enforce `lease`.
fn pool(db: &TestDb, lease: Duration) -> Pool {
    db::run_migrations(&db.url).expect("migrations");
    orders_api::db::connect(
        &db.url,
        &PoolOptions {
            max_size: 4,
            connection_timeout: Duration::from_secs(10),
            lease,
            write_queue: orders_api::db::writer::DEFAULT_QUEUE_CAPACITY,
            shown: "the test database".into(),
        },
    )
    .expect("pool")
}

fn order_id_in(response: &RecordedResponse) -> String {
    let json: Value = serde_json::from_slice(&response.body).expect("JSON body");
    json["id"].as_str().expect("order id").to_owned()
}

fn header<'r>(response: &'r RecordedResponse, name: &str) -> Option<&'r str> {
    response
        .headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

both_backends! {
    fn a_mutation_that_outlives_its_lease_is_refused_and_records_nothing(backend) {
        let db = TestDb::fresh(backend);
        let pool = pool(&db, Duration::from_secs(30));
        let ledger = ledger(&pool, Duration::from_secs(1));
        let request = CreateRequest::new("slow-holder", &order_body("Widget", 2, "9.99"));

        let holder = request.clone();
        let slow = ledger.execute_blocking(request.ledger(), move |tx| -> Result<Completion, Failed> {
            let response = holder.run(tx);
            std::thread::sleep(Duration::from_millis(1_200));
            Ok(Completion::Record(response))
        });

        assert!(matches!(slow, Err(LedgerError::LeaseExpired)), "{slow:?}");
        assert_eq!(order_count(&pool), 0, "the late holder's order was rolled back");
        assert_eq!(ledger_count(&pool), 0, "the late holder recorded nothing");

        // The key is free: the next request with it runs.
        let runs = Arc::new(AtomicUsize::new(0));
        let next = ledger.execute_blocking(request.ledger(), request.unit(&runs));
        let Ok(Outcome::Executed(response)) = next else { panic!("the retry did not run: {next:?}") };
        assert_eq!(response.status, 201);
        assert_eq!(order_id_for_key(&pool, USER, "slow-holder"), Some(order_id_in(&response)));

        // And it is recorded: one more request replays without running.
        let replay = ledger.execute_blocking(request.ledger(), request.unit(&runs));
        assert_eq!(replay.ok(), Some(Outcome::Replayed(response)));
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        assert_eq!((order_count(&pool), ledger_count(&pool)), (1, 1));
    }

    fn a_mutation_that_fails_records_nothing_and_frees_its_key(backend) {
        let db = TestDb::fresh(backend);
        let pool = pool(&db, Duration::from_secs(30));
        let ledger = ledger(&pool, Duration::from_secs(30));
        let request = CreateRequest::new("failing", &order_body("Widget", 2, "9.99"));

        let holder = request.clone();
        let failed = ledger.execute_blocking(request.ledger(), move |tx| -> Result<Completion, Failed> {
            // The business change happens, then the mutation fails.
            holder.run(tx);
            Err(Failed)
        });

        assert!(matches!(failed, Err(LedgerError::Operation(Failed))), "{failed:?}");
        assert_eq!(order_count(&pool), 0, "the failed mutation's change was rolled back");
        assert_eq!(ledger_count(&pool), 0, "a failure is never recorded");

        let retry = ledger.execute_blocking(request.ledger(), request.unit(&Arc::default()));
        let Ok(Outcome::Executed(response)) = retry else { panic!("the retry did not run: {retry:?}") };
        assert_eq!(response.status, 201);
        assert_eq!((order_count(&pool), ledger_count(&pool)), (1, 1));
    }
}

/// Runs `request` through the ledger on a thread that holds its key (its
/// transaction open, the key's advisory lock on PostgreSQL) until
/// `while_held` returns; returns the holder's outcome
/// and what `while_held` returned.
fn with_key_held<T: Send, S: Storage>(
    ledger: Ledger<S>,
    request: &CreateRequest,
    while_held: impl FnOnce() -> T + Send,
) -> (Result<Outcome, LedgerError<Failed>>, T) {
    std::thread::scope(|s| {
        let (holding, on_holding) = mpsc::channel();
        let (release, on_release) = mpsc::channel::<()>();
        let held = request.clone();
        let holder = s.spawn(move || {
            ledger.execute_blocking(request.ledger(), move |tx| -> Result<Completion, Failed> {
                let response = held.run(tx);
                holding.send(()).expect("report the held key");
                // Dropped (a panic in `while_held`) or sent: either way, finish.
                let _ = on_release.recv_timeout(Duration::from_secs(60));
                Ok(Completion::Record(response))
            })
        });
        on_holding
            .recv_timeout(Duration::from_secs(30))
            .expect("the holder holds the key");
        let during = while_held();
        release.send(()).expect("release the holder");
        (holder.join().expect("holder thread"), during)
    })
}

crate::postgres_only! {
    /// CONTRACT §4: "same key while the first is still running → the
    /// duplicate waits for the first to finish, without holding a database
    /// connection for the wait, and gets its replay". PostgreSQL, across
    /// ledgers (as across processes: the holder's key is not in the server's
    /// own in-flight set): the duplicate finds the advisory lock taken, rolls
    /// back and looks again later — no session of it waits on a lock (a
    /// session that did would show it in `pg_stat_activity` at once, and be
    /// refused `409` when `lock_timeout` fired) — and replays the holder's
    /// answer once that commits.
    fn a_duplicate_of_a_claim_held_elsewhere_waits_without_a_lock_and_replays_the_holders_answer() {
        // Waiting far longer than the test holds the key: however slow the
        // machine, the duplicate is still waiting when it is looked at.
        let app = TestApp::spawn_with(orders_api::db::Backend::Postgres, |s| {
            s.idempotency_wait_secs = 120;
        });
        let body = order_body("Widget", 2, "9.99");
        let request = CreateRequest::new("held-key", &body);

        let (held, waiting) = std::thread::scope(|s| {
            let ledger = app.settings.ledger(app.pool.clone());
            let (held, waiting) = with_key_held(ledger, &request, || {
                let waiting = s.spawn(|| app.post_order(Some("held-key"), &request.body));
                // The duplicate tried the key's lock and let its session go —
                // idle after its one statement's try, or after the rollback
                // every later try ends with (nothing else in this database
                // rolls back; the one statement's session is taken again
                // for the next try within a millisecond, too soon to be
                // seen reliably) — or it waits on a lock.
                crate::process::wait_for_session_where(
                    &app.db.url,
                    "(state = 'idle' AND (query LIKE '%pg_try_advisory_xact_lock%' OR query = 'ROLLBACK')) \
                     OR wait_event_type = 'Lock'",
                    Duration::from_secs(30),
                );
                assert_eq!(
                    crate::process::pg_sessions_where(&app.db.url, "wait_event_type = 'Lock'"),
                    0,
                    "the duplicate waits on a lock"
                );
                assert!(!waiting.is_finished(), "the duplicate did not wait for the holder");
                assert_eq!(app.order_count(), 0, "the waiting request created nothing");
                waiting
            });
            (held, waiting.join().expect("waiting client"))
        });

        let Ok(Outcome::Executed(original)) = held else {
            panic!("the holder did not run: {held:?}")
        };
        assert_eq!(waiting.status, 200, "{}", waiting.body);
        assert_eq!(waiting.header("Idempotent-Replayed"), Some("true"));
        assert_eq!(waiting.body.as_bytes(), original.body.as_slice());
        assert_eq!(waiting.header("Location"), header(&original, "location"));
        assert_eq!((app.order_count(), app.ledger_count()), (1, 1));
    }
}

/// SQLite's own default busy timeout: a writer that waited only this long
/// for another connection's write lock would fail ("database is locked").
const SQLITE_DEFAULT_BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// CONTRACT §4: "…or, where the server chooses to wait briefly for the first to
/// finish, its replay. Never a second execution, never a 5xx." SQLite only,
/// across processes: the key is held by a writer outside the server (a pool
/// of the test's own on the same file: its own connection, holding
/// `BEGIN IMMEDIATE` with the create inside), so the server's writer waits
/// on SQLite's file lock — for as long as the holder may keep it (its
/// lease), longer than SQLite's default busy timeout — then replays the
/// holder's answer. (Held through the server's own writer, as this test
/// once was, the request only queued behind it and never met the lock.)
#[test]
fn on_sqlite_a_request_whose_key_is_held_elsewhere_waits_on_the_file_lock_past_the_busy_timeout_and_replays()
 {
    let app = TestApp::spawn(orders_api::db::Backend::Sqlite);
    let request = CreateRequest::new("held-key", &order_body("Widget", 2, "9.99"));
    // Another process's writer, as far as the server can tell.
    let elsewhere = pool(&app.db, Duration::from_secs(30));
    let ledger = ledger(&elsewhere, Duration::from_secs(30));

    let (held, waiting) = std::thread::scope(|s| {
        let (held, waiting) = with_key_held(ledger, &request, || {
            assert!(
                app.pool.writer_stats().is_none(),
                "the server has written already"
            );
            let waiting = s.spawn(|| app.post_order(Some("held-key"), &request.body));
            // The request reached the server's writer, whose transaction
            // waits for the file's write lock ...
            let deadline = Instant::now() + Duration::from_secs(30);
            while app.pool.writer_stats().is_none() {
                assert!(
                    Instant::now() < deadline,
                    "the request never reached the writer"
                );
                std::thread::sleep(Duration::from_millis(5));
            }
            // ... held from here for longer than SQLite's default busy
            // timeout: this duration is what the test is about.
            std::thread::sleep(SQLITE_DEFAULT_BUSY_TIMEOUT + Duration::from_secs(1));
            assert!(!waiting.is_finished(), "answered while the file was locked");
            waiting
        });
        // The holder has committed; now the waiting request can finish.
        (held, waiting.join().expect("waiting client"))
    });

    let Ok(Outcome::Executed(original)) = held else {
        panic!("the holder did not run: {held:?}")
    };
    assert_eq!(waiting.status, 200, "{}", waiting.body);
    assert_eq!(waiting.header("Idempotent-Replayed"), Some("true"));
    assert_eq!(waiting.body.as_bytes(), original.body.as_slice());
    assert_eq!((app.order_count(), app.ledger_count()), (1, 1));
}

crate::postgres_only! {
    /// CONTRACT §4: a holder that hangs past its lease loses its key, the next
    /// request takes the key over and runs, and the hung holder can never commit
    /// afterwards: one execution in all. PostgreSQL only: the server ends a
    /// session idle in its transaction for longer than the lease, which releases
    /// the key's advisory lock while the holder still hangs.
    fn a_hung_holder_is_taken_over_after_its_lease_and_never_commits_afterwards() {
        let lease = Duration::from_secs(1);
        let db = TestDb::fresh(orders_api::db::Backend::Postgres);
        let pool = pool(&db, lease);
        let ledger = ledger(&pool, lease);
        let request = CreateRequest::new("hung-holder", &order_body("Widget", 2, "9.99"));

        let (hung, (taken_over, in_progress)) = with_key_held(ledger.clone(), &request, || {
            // The holder hangs until the takeover is done.
            let deadline = Instant::now() + Duration::from_secs(20);
            let mut in_progress = 0;
            let taken_over = loop {
                assert!(Instant::now() < deadline, "the key was never taken over");
                match ledger.execute_blocking(request.ledger(), request.unit(&Arc::default())) {
                    Ok(Outcome::InProgress) => {
                        in_progress += 1;
                        std::thread::sleep(Duration::from_millis(100));
                    }
                    Ok(Outcome::Executed(response)) => break response,
                    other => panic!("a request waiting for a held key got {other:?}"),
                }
            };
            (taken_over, in_progress)
        });

        eprintln!("answered in progress {in_progress} time(s) before the takeover");
        assert!(
            matches!(
                hung,
                Err(LedgerError::LeaseExpired | LedgerError::Unavailable(_))
            ),
            "the hung holder must not succeed after a takeover: {hung:?}"
        );
        assert_eq!(order_count(&pool), 1, "one execution in all");
        assert_eq!(ledger_count(&pool), 1);
        assert_eq!(
            order_id_for_key(&pool, USER, "hung-holder"),
            Some(order_id_in(&taken_over))
        );
        let replay = ledger.execute_blocking(request.ledger(), |_| -> Result<Completion, Failed> {
            panic!("a recorded key must not run again")
        });
        assert_eq!(replay.ok(), Some(Outcome::Replayed(taken_over)));
    }
}
