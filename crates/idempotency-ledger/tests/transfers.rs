//! The ledger is generic in fact: a second domain that has nothing to do with
//! orders — money transfers between accounts — driven through the crate's
//! public API only, on SQLite and on PostgreSQL (`TEST_DATABASE_URL`, a
//! fresh database per test).
//!
//! A transfer is one row in `transfers`, keyed `UNIQUE (account,
//! idempotency_key)`, and a debit of `accounts.balance`: a general mutation
//! ([`Ledger::execute`]) makes both; the one-statement path
//! ([`Ledger::execute_insert`]) makes the row alone.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Text};
use idempotency_ledger::db::{Backend, Conn, Pool, PoolOptions};
use idempotency_ledger::row::{Columns, Row, Timestamp};
use idempotency_ledger::{
    Completion, Fingerprint, IdempotencyKey, Ledger, LedgerError, LedgerRequest, LedgerTx, Outcome,
    RecordedResponse, Settings,
};

const SQLITE_TABLES: &str = "
    CREATE TABLE accounts (account TEXT PRIMARY KEY, balance BIGINT NOT NULL);
    CREATE TABLE transfers (
        account TEXT NOT NULL,
        idempotency_key TEXT NOT NULL,
        request_fingerprint TEXT NOT NULL,
        cents BIGINT NOT NULL,
        created_at TEXT NOT NULL,
        UNIQUE (account, idempotency_key)
    );";

const POSTGRES_TABLES: &str = "
    CREATE TABLE accounts (account TEXT PRIMARY KEY, balance BIGINT NOT NULL);
    CREATE TABLE transfers (
        account TEXT NOT NULL,
        idempotency_key TEXT NOT NULL,
        request_fingerprint TEXT NOT NULL,
        cents BIGINT NOT NULL,
        created_at TIMESTAMPTZ NOT NULL,
        UNIQUE (account, idempotency_key)
    );";

/// A transfer as its table stores it, described once.
#[derive(Debug, Clone)]
struct NewTransfer {
    account: String,
    idempotency_key: String,
    request_fingerprint: String,
    cents: i64,
    created_at: Timestamp,
}

impl Row for NewTransfer {
    const TABLE: &'static str = "transfers";
    const UNIQUE: &'static [&'static str] = &["account", "idempotency_key"];

    fn columns<'b, C: Columns<'b>>(&'b self, c: &mut C) -> QueryResult<()> {
        c.column("account", self.account.as_str())?;
        c.column("idempotency_key", self.idempotency_key.as_str())?;
        c.column("request_fingerprint", self.request_fingerprint.as_str())?;
        c.column("cents", &self.cents)?;
        c.column("created_at", &self.created_at)
    }
}

/// A fresh database with the ledger's table and the transfers domain's.
struct TestDb {
    pool: Option<Pool>,
    /// SQLite: the file; PostgreSQL: the server's URL and the database.
    place: Place,
}

enum Place {
    Sqlite(std::path::PathBuf),
    Postgres { server: String, name: String },
}

const LEASE: Duration = Duration::from_secs(30);
/// What a read found answers from memory this long: the service's default.
const REMEMBER: Duration = Duration::from_secs(1);

fn options() -> PoolOptions {
    PoolOptions {
        max_size: 8,
        connection_timeout: Duration::from_secs(10),
        lease: LEASE,
        write_queue: 1_024,
        shown: "the test database".into(),
    }
}

impl TestDb {
    fn fresh(backend: Backend) -> Self {
        let unique = uuid::Uuid::new_v4().simple().to_string();
        match backend {
            Backend::Sqlite => {
                let path = std::env::temp_dir().join(format!("ledger-transfers-{unique}.db"));
                let url = path.to_str().expect("a UTF-8 path").to_owned();
                let mut conn = SqliteConnection::establish(&url).expect("create the file");
                conn.batch_execute(idempotency_ledger::SQLITE_DDL)
                    .expect("the ledger's table");
                conn.batch_execute(SQLITE_TABLES)
                    .expect("the domain's tables");
                drop(conn);
                let pool = Pool::connect(Backend::Sqlite, &url, &options()).expect("pool");
                Self {
                    pool: Some(pool),
                    place: Place::Sqlite(path),
                }
            }
            Backend::Postgres => {
                let server = std::env::var("TEST_DATABASE_URL")
                    .expect("TEST_DATABASE_URL names a PostgreSQL server for these tests");
                let name = format!("ledger_transfers_{unique}");
                let mut admin = PgConnection::establish(&server).expect("the test server");
                admin
                    .batch_execute(&format!("CREATE DATABASE {name}"))
                    .expect("create the test database");
                let url = with_database(&server, &name);
                let mut conn = PgConnection::establish(&url).expect("the test database");
                conn.batch_execute(idempotency_ledger::POSTGRES_DDL)
                    .expect("the ledger's table");
                conn.batch_execute(POSTGRES_TABLES)
                    .expect("the domain's tables");
                let pool = Pool::connect(Backend::Postgres, &url, &options()).expect("pool");
                Self {
                    pool: Some(pool),
                    place: Place::Postgres { server, name },
                }
            }
        }
    }

    fn pool(&self) -> &Pool {
        self.pool.as_ref().expect("open")
    }

    /// PostgreSQL: the test database's URL.
    fn url(&self) -> String {
        match &self.place {
            Place::Postgres { server, name } => with_database(server, name),
            Place::Sqlite(_) => panic!("a PostgreSQL test database"),
        }
    }

    /// Sets the expiry of `key`'s entry: `day` days into the year 2000, long
    /// expired (a later day expires later).
    fn expire(&self, key: &str, day: u32) {
        let mut pooled = self.pool().get().expect("connection");
        let expiry = format!("2000-01-{day:02} 00:00:00+00:00");
        match pooled.conn() {
            Conn::Sqlite(c) => {
                diesel::sql_query("UPDATE idempotency_ledger SET expires_at = ? WHERE idempotency_key = ?")
                    .bind::<Text, _>(&expiry)
                    .bind::<Text, _>(key)
                    .execute(c)
            }
            Conn::Postgres(c) => diesel::sql_query(
                "UPDATE idempotency_ledger SET expires_at = $1::timestamptz WHERE idempotency_key = $2",
            )
            .bind::<Text, _>(&expiry)
            .bind::<Text, _>(key)
            .execute(c),
        }
        .expect("expire the entry");
    }

    /// The keys that have a ledger entry, in key order.
    fn entry_keys(&self) -> Vec<String> {
        #[derive(QueryableByName)]
        struct Key {
            #[diesel(sql_type = Text)]
            idempotency_key: String,
        }
        let sql = "SELECT idempotency_key FROM idempotency_ledger ORDER BY idempotency_key";
        let mut pooled = self.pool().get().expect("connection");
        let keys: Vec<Key> = match pooled.conn() {
            Conn::Sqlite(c) => diesel::sql_query(sql).load(c),
            Conn::Postgres(c) => diesel::sql_query(sql).load(c),
        }
        .expect("entry keys");
        keys.into_iter().map(|k| k.idempotency_key).collect()
    }

    fn ledger(&self) -> Ledger {
        self.ledger_with(|_| {})
    }

    /// [`TestDb::ledger`] whose duplicates wait at most `wait` for a key.
    fn ledger_waiting(&self, wait: Duration) -> Ledger {
        self.ledger_with(|s| s.wait = wait)
    }

    /// [`TestDb::ledger`] with its settings changed by `change`.
    fn ledger_with(&self, change: impl FnOnce(&mut Settings)) -> Ledger {
        let mut settings = Settings {
            retention: Duration::from_secs(86_400),
            wait: Duration::from_secs(10),
            waiters_per_key: 64,
            write_admission: 64,
            remember: REMEMBER,
        };
        change(&mut settings);
        Ledger::new(self.pool().clone(), settings)
    }

    fn open_account(&self, account: &str, balance: i64) {
        let mut pooled = self.pool().get().expect("connection");
        let sql = "INSERT INTO accounts (account, balance) VALUES ($1, $2)";
        match pooled.conn() {
            Conn::Sqlite(c) => diesel::sql_query(sql.replace('$', "?"))
                .bind::<Text, _>(account)
                .bind::<BigInt, _>(balance)
                .execute(c),
            Conn::Postgres(c) => diesel::sql_query(sql)
                .bind::<Text, _>(account)
                .bind::<BigInt, _>(balance)
                .execute(c),
        }
        .expect("open the account");
    }

    fn count(&self, table: &str) -> i64 {
        #[derive(QueryableByName)]
        struct Count {
            #[diesel(sql_type = BigInt)]
            n: i64,
        }
        let sql = format!("SELECT count(*) AS n FROM {table}");
        let mut pooled = self.pool().get().expect("connection");
        let count: Count = match pooled.conn() {
            Conn::Sqlite(c) => diesel::sql_query(sql).get_result(c),
            Conn::Postgres(c) => diesel::sql_query(sql).get_result(c),
        }
        .expect("count");
        count.n
    }

    fn balance(&self, account: &str) -> i64 {
        #[derive(QueryableByName)]
        struct Balance {
            #[diesel(sql_type = BigInt)]
            balance: i64,
        }
        let mut pooled = self.pool().get().expect("connection");
        let found: Balance = match pooled.conn() {
            Conn::Sqlite(c) => diesel::sql_query("SELECT balance FROM accounts WHERE account = ?")
                .bind::<Text, _>(account)
                .get_result(c),
            Conn::Postgres(c) => {
                diesel::sql_query("SELECT balance FROM accounts WHERE account = $1")
                    .bind::<Text, _>(account)
                    .get_result(c)
            }
        }
        .expect("balance");
        found.balance
    }

    /// Every transfer row, each column as text, in key order.
    fn transfers(&self) -> Vec<Vec<String>> {
        #[derive(QueryableByName)]
        struct Stored {
            #[diesel(sql_type = Text)]
            account: String,
            #[diesel(sql_type = Text)]
            idempotency_key: String,
            #[diesel(sql_type = Text)]
            request_fingerprint: String,
            #[diesel(sql_type = Text)]
            cents: String,
            #[diesel(sql_type = Text)]
            created_at: String,
        }
        let mut pooled = self.pool().get().expect("connection");
        let rows: Vec<Stored> = match pooled.conn() {
            Conn::Sqlite(c) => diesel::sql_query(
                "SELECT account, idempotency_key, request_fingerprint, CAST(cents AS TEXT) AS cents, \
                 created_at FROM transfers ORDER BY idempotency_key",
            )
            .load(c),
            Conn::Postgres(c) => diesel::sql_query(
                "SELECT account, idempotency_key, request_fingerprint, cents::text AS cents, \
                 to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US') AS created_at \
                 FROM transfers ORDER BY idempotency_key",
            )
            .load(c),
        }
        .expect("transfers");
        rows.into_iter()
            .map(|r| {
                vec![
                    r.account,
                    r.idempotency_key,
                    r.request_fingerprint,
                    r.cents,
                    r.created_at,
                ]
            })
            .collect()
    }

    /// SQLite: the transactions the writer has committed (`None` on
    /// PostgreSQL, which has no writer).
    fn writer_batches(&self) -> Option<u64> {
        match self.pool().backend() {
            Backend::Sqlite => Some(self.pool().writer_stats().map_or(0, |s| s.batches)),
            Backend::Postgres => None,
        }
    }

    /// Deletes every ledger entry by hand, behind the ledger's back (as an
    /// operator might, or a backup restored from before they were written).
    fn delete_every_entry(&self) {
        let mut pooled = self.pool().get().expect("connection");
        match pooled.conn() {
            Conn::Sqlite(c) => c.batch_execute("DELETE FROM idempotency_ledger"),
            Conn::Postgres(c) => c.batch_execute("DELETE FROM idempotency_ledger"),
        }
        .expect("delete the entries");
    }

    /// Moves every ledger entry's expiry into the past and purges them.
    fn purge_every_entry(&self) -> usize {
        let mut pooled = self.pool().get().expect("connection");
        match pooled.conn() {
            Conn::Sqlite(c) => c.batch_execute(
                "UPDATE idempotency_ledger SET expires_at = '2000-01-01 00:00:00+00:00'",
            ),
            Conn::Postgres(c) => c.batch_execute(
                "UPDATE idempotency_ledger SET expires_at = '2000-01-01 00:00:00+00'",
            ),
        }
        .expect("expire");
        drop(pooled);
        Ledger::purge_expired(self.pool(), 100, 10).expect("purge")
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        drop(self.pool.take());
        match &self.place {
            Place::Sqlite(path) => {
                for suffix in ["", "-wal", "-shm"] {
                    let mut name = path.clone().into_os_string();
                    name.push(suffix);
                    let _ = std::fs::remove_file(name);
                }
            }
            Place::Postgres { server, name } => {
                if let Ok(mut admin) = PgConnection::establish(server) {
                    let _ = admin
                        .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"));
                }
            }
        }
    }
}

fn with_database(server: &str, name: &str) -> String {
    let (base, query) = match server.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (server, None),
    };
    let after_scheme = base.find("://").map_or(0, |i| i + 3);
    let server_part = match base[after_scheme..].find('/') {
        Some(slash) => &base[..after_scheme + slash],
        None => base,
    };
    match query {
        Some(query) => format!("{server_part}/{name}?{query}"),
        None => format!("{server_part}/{name}"),
    }
}

/// One transfer request: who, which key, what body.
struct Request {
    account: String,
    key: IdempotencyKey,
    fingerprint: Fingerprint,
    cents: i64,
}

impl Request {
    fn new(account: &str, key: &str, cents: i64) -> Self {
        let body = format!(r#"{{"cents":{cents}}}"#);
        let json: serde_json::Value = serde_json::from_str(&body).expect("JSON");
        Self {
            account: account.to_owned(),
            key: IdempotencyKey::parse(key.as_bytes()).expect("a key"),
            fingerprint: Fingerprint::of("POST", "/transfers", body.as_bytes(), Some(&json)),
            cents,
        }
    }

    fn ledger(&self) -> LedgerRequest<'_> {
        LedgerRequest {
            user_id: &self.account,
            key: &self.key,
            fingerprint: &self.fingerprint,
        }
    }

    fn row(&self) -> NewTransfer {
        NewTransfer {
            account: self.account.clone(),
            idempotency_key: self.key.as_str().to_owned(),
            request_fingerprint: self.fingerprint.as_str().to_owned(),
            cents: self.cents,
            created_at: Timestamp::new(
                chrono::DateTime::from_timestamp(1_800_000_000, 123_456_000).expect("a time"),
            ),
        }
    }

    /// The row and its answer, as [`Ledger::execute_insert`] makes them.
    fn made(&self) -> impl FnOnce() -> (NewTransfer, RecordedResponse) + Send + use<> {
        let made = (self.row(), self.answer());
        move || made
    }

    fn answer(&self) -> RecordedResponse {
        RecordedResponse {
            status: 201,
            headers: vec![
                ("Content-Type".into(), "application/json".into()),
                (
                    "Location".into(),
                    format!("/transfers/{}", self.key.as_str()),
                ),
            ],
            body: format!(r#"{{"account":"{}","cents":{}}}"#, self.account, self.cents)
                .into_bytes(),
        }
    }

    /// The general mutation: the transfer's row and the account's debit.
    fn debit(
        &self,
        runs: &Arc<AtomicUsize>,
    ) -> impl FnOnce(&mut LedgerTx<'_, '_>) -> Result<Completion, Failed> + Send + 'static {
        let (row, answer, runs) = (self.row(), self.answer(), Arc::clone(runs));
        move |tx| {
            runs.fetch_add(1, Ordering::SeqCst);
            if !tx.insert(&row).map_err(|_| Failed)? {
                return Ok(Completion::KeyReusedFound);
            }
            let sql = "UPDATE accounts SET balance = balance - $1 WHERE account = $2";
            let updated = match tx.conn() {
                Conn::Sqlite(c) => diesel::sql_query(sql.replace("$1", "?").replace("$2", "?"))
                    .bind::<BigInt, _>(row.cents)
                    .bind::<Text, _>(&row.account)
                    .execute(*c),
                Conn::Postgres(c) => diesel::sql_query(sql)
                    .bind::<BigInt, _>(row.cents)
                    .bind::<Text, _>(&row.account)
                    .execute(*c),
            }
            .map_err(|_| Failed)?;
            assert_eq!(updated, 1);
            Ok(Completion::Record(answer))
        }
    }

    /// What the one-statement path asks when the row exists already: a
    /// replay of the transfer (the ledger's entry was purged).
    fn found(
        &self,
    ) -> impl FnOnce(&mut LedgerTx<'_, '_>) -> Result<Completion, Failed> + Send + 'static {
        let mut again = self.answer();
        again.status = 200;
        move |_| Ok(Completion::ReplayFound(again))
    }
}

/// A mutation's own failure (a 5xx, for an HTTP layer).
#[derive(Debug, PartialEq, Eq)]
struct Failed;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("a runtime")
}

macro_rules! both_backends {
    ($(fn $name:ident($backend:ident) $body:block)*) => {
        mod sqlite {
            use super::*;
            $(#[test] fn $name() { let $backend = Backend::Sqlite; $body })*
        }
        mod postgres {
            use super::*;
            $(
                #[test]
                #[cfg_attr(postgres_tests_ignored, ignore = "set TEST_DATABASE_URL to run the PostgreSQL tests")]
                fn $name() { let $backend = Backend::Postgres; $body }
            )*
        }
    };
}

both_backends! {
    fn n_concurrent_identical_requests_make_one_transfer_and_one_debit(backend) {
        let db = TestDb::fresh(backend);
        db.open_account("acme", 1_000);
        let ledger = db.ledger();
        let runs = Arc::new(AtomicUsize::new(0));
        let outcomes: Vec<Outcome> = runtime().block_on(async {
            let tasks: Vec<_> = (0..16)
                .map(|_| {
                    let (ledger, runs) = (ledger.clone(), Arc::clone(&runs));
                    tokio::spawn(async move {
                        let request = Request::new("acme", "t-1", 250);
                        ledger.execute(request.ledger(), request.debit(&runs)).await
                    })
                })
                .collect();
            let mut outcomes = Vec::new();
            for task in tasks {
                outcomes.push(task.await.expect("task").expect("an answer"));
            }
            outcomes
        });
        let executed: Vec<_> = outcomes.iter().filter(|o| matches!(o, Outcome::Executed(_))).collect();
        assert_eq!(executed.len(), 1, "{outcomes:?}");
        let Outcome::Executed(first) = executed[0] else { unreachable!() };
        for outcome in &outcomes {
            match outcome {
                Outcome::Executed(_) | Outcome::InProgress => {}
                Outcome::Replayed(answer) => assert_eq!(answer, first, "a replay is the first answer"),
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(runs.load(Ordering::SeqCst), 1, "the mutation ran once");
        assert_eq!((db.count("transfers"), db.count("idempotency_ledger")), (1, 1));
        assert_eq!(db.balance("acme"), 750, "one debit");
    }

    fn a_replay_is_the_recorded_answer_byte_for_byte_and_runs_nothing(backend) {
        let db = TestDb::fresh(backend);
        db.open_account("acme", 1_000);
        let ledger = db.ledger();
        let runs = Arc::new(AtomicUsize::new(0));
        let request = Request::new("acme", "t-2", 100);
        let (first, again) = runtime().block_on(async {
            let first = ledger.execute(request.ledger(), request.debit(&runs)).await;
            let again = ledger.execute(request.ledger(), request.debit(&runs)).await;
            (first, again)
        });
        let Ok(Outcome::Executed(answer)) = first else { panic!("{first:?}") };
        assert_eq!(answer, request.answer());
        assert_eq!(again.ok(), Some(Outcome::Replayed(answer)));
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        assert_eq!(db.balance("acme"), 900);
    }

    fn the_same_key_with_another_body_is_refused_and_changes_nothing(backend) {
        let db = TestDb::fresh(backend);
        db.open_account("acme", 1_000);
        let ledger = db.ledger();
        let runs = Arc::new(AtomicUsize::new(0));
        let (first, reused) = runtime().block_on(async {
            let first = Request::new("acme", "t-3", 100);
            let first = ledger.execute(first.ledger(), first.debit(&runs)).await;
            let changed = Request::new("acme", "t-3", 99_900);
            let reused = ledger.execute(changed.ledger(), changed.debit(&runs)).await;
            (first, reused)
        });
        assert!(matches!(first, Ok(Outcome::Executed(_))), "{first:?}");
        assert_eq!(reused.ok(), Some(Outcome::KeyReused));
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        assert_eq!(db.balance("acme"), 900);
        assert_eq!(db.count("transfers"), 1);
    }

    fn the_same_key_from_another_account_is_another_key(backend) {
        let db = TestDb::fresh(backend);
        db.open_account("acme", 1_000);
        db.open_account("globex", 1_000);
        let ledger = db.ledger();
        let runs = Arc::new(AtomicUsize::new(0));
        let (a, b) = runtime().block_on(async {
            let a = Request::new("acme", "shared", 100);
            let b = Request::new("globex", "shared", 100);
            (
                ledger.execute(a.ledger(), a.debit(&runs)).await,
                ledger.execute(b.ledger(), b.debit(&runs)).await,
            )
        });
        assert!(matches!(a, Ok(Outcome::Executed(_))) && matches!(b, Ok(Outcome::Executed(_))));
        assert_eq!((db.balance("acme"), db.balance("globex")), (900, 900));
    }

    fn a_failed_mutation_leaves_nothing_and_its_key_free(backend) {
        let db = TestDb::fresh(backend);
        db.open_account("acme", 1_000);
        let ledger = db.ledger();
        let request = Request::new("acme", "t-4", 100);
        let row = request.row();
        let failed = runtime().block_on(ledger.execute(request.ledger(), move |tx: &mut LedgerTx<'_, '_>| {
            // The change is made, then the mutation fails (a 5xx).
            tx.insert(&row).map_err(|_| Failed)?;
            Err::<Completion, _>(Failed)
        }));
        assert!(matches!(failed, Err(LedgerError::Operation(Failed))), "{failed:?}");
        assert_eq!((db.count("transfers"), db.count("idempotency_ledger")), (0, 0));
        let retry = runtime().block_on(ledger.execute(request.ledger(), request.debit(&Arc::default())));
        assert!(matches!(retry, Ok(Outcome::Executed(_))), "{retry:?}");
        assert_eq!(db.balance("acme"), 900);
    }

    fn the_one_statement_path_records_its_row_and_a_retry_after_the_purge_finds_it(backend) {
        let db = TestDb::fresh(backend);
        // `purge_every_entry` moves the entry's expiry into the past behind
        // the ledger's back, which the replay's read must then see.
        let ledger = db.ledger_with(|s| s.remember = Duration::ZERO);
        let request = Request::new("acme", "t-5", 100);
        let first = runtime().block_on(ledger.execute_insert(request.ledger(), request.made(), request.found()));
        assert_eq!(first.ok(), Some(Outcome::Executed(request.answer())));
        assert_eq!((db.count("transfers"), db.count("idempotency_ledger")), (1, 1));

        let replay = runtime().block_on(ledger.execute_insert(request.ledger(), request.made(), request.found()));
        assert_eq!(replay.ok(), Some(Outcome::Replayed(request.answer())), "the entry answers");

        assert_eq!(db.purge_every_entry(), 1);
        let after_purge = runtime().block_on(ledger.execute_insert(request.ledger(), request.made(), request.found()));
        let mut found = request.answer();
        found.status = 200;
        assert_eq!(after_purge.ok(), Some(Outcome::Replayed(found)), "the row's unique key answers");
        assert_eq!((db.count("transfers"), db.count("idempotency_ledger")), (1, 0), "nothing written twice");
    }

    fn what_a_read_found_answers_the_keys_retries_from_memory_for_the_remembered_time(backend) {
        let db = TestDb::fresh(backend);
        db.open_account("acme", 1_000);
        db.open_account("globex", 1_000);
        let remembering = db.ledger_with(|s| s.remember = Duration::from_secs(3_600));
        let request = Request::new("acme", "t-remembered", 100);
        let runs = Arc::new(AtomicUsize::new(0));
        let rt = runtime();
        let ran = || runs.load(Ordering::SeqCst);
        let first = rt.block_on(remembering.execute(request.ledger(), request.debit(&runs)));
        assert!(matches!(first, Ok(Outcome::Executed(_))), "{first:?}");
        // The first retry reads the entry, and what it found is remembered.
        let replay = rt.block_on(remembering.execute(request.ledger(), request.debit(&runs)));
        assert_eq!(replay.ok(), Some(Outcome::Replayed(request.answer())));

        db.delete_every_entry();
        let remembered = rt.block_on(remembering.execute(request.ledger(), request.debit(&runs)));
        assert_eq!(
            remembered.ok(),
            Some(Outcome::Replayed(request.answer())),
            "the retry is answered as the read found the entry, without another read"
        );
        let another = Request::new("acme", "t-remembered", 999);
        let refused = rt.block_on(remembering.execute(another.ledger(), another.debit(&runs)));
        assert_eq!(refused.ok(), Some(Outcome::KeyReused), "another request with the key is refused from memory too");
        assert_eq!(ran(), 1, "nothing ran again");

        // The same key from another account is another key, never answered
        // from acme's entry.
        let theirs = Request::new("globex", "t-remembered", 100);
        let done = rt.block_on(remembering.execute(theirs.ledger(), theirs.debit(&runs)));
        assert!(matches!(done, Ok(Outcome::Executed(_))), "{done:?}");
        assert_eq!(ran(), 2);

        // A ledger that remembers nothing reads, and sees the deletion: the
        // key is new, and its mutation runs (and finds its transfer row).
        let reading = db.ledger_with(|s| s.remember = Duration::ZERO);
        let read = rt.block_on(reading.execute(request.ledger(), request.debit(&runs)));
        assert!(matches!(read, Ok(Outcome::KeyReused)), "{read:?}");
        assert_eq!(ran(), 3, "the deleted entry's key ran again");
        assert_eq!((db.balance("acme"), db.balance("globex")), (900, 900));
    }

    fn at_the_default_time_an_entry_deleted_behind_the_ledgers_back_is_seen_once_the_time_has_passed(backend) {
        let db = TestDb::fresh(backend);
        db.open_account("acme", 1_000);
        let ledger = db.ledger(); // remembers for REMEMBER, the service's default
        let request = Request::new("acme", "t-default", 100);
        let runs = Arc::new(AtomicUsize::new(0));
        let rt = runtime();
        let first = rt.block_on(ledger.execute(request.ledger(), request.debit(&runs)));
        assert!(matches!(first, Ok(Outcome::Executed(_))), "{first:?}");
        let replay = rt.block_on(ledger.execute(request.ledger(), request.debit(&runs)));
        assert_eq!(replay.ok(), Some(Outcome::Replayed(request.answer())));
        // The replay's read began before now: its memory ends by now + REMEMBER.
        let read_done = std::time::Instant::now();
        db.delete_every_entry();
        std::thread::sleep((read_done + REMEMBER).saturating_duration_since(std::time::Instant::now()));
        let after = rt.block_on(ledger.execute(request.ledger(), request.debit(&runs)));
        assert!(
            matches!(after, Ok(Outcome::KeyReused)),
            "read again: the key is new, its mutation runs and finds its transfer row: {after:?}"
        );
        assert_eq!(runs.load(Ordering::SeqCst), 2);
    }

    fn an_entry_is_never_answered_from_memory_past_its_expiry_so_the_purge_leaves_its_key_new(backend) {
        let db = TestDb::fresh(backend);
        db.open_account("acme", 1_000);
        let retention = Duration::from_secs(1);
        let ledger = db.ledger_with(|s| {
            s.retention = retention;
            s.remember = Duration::from_secs(3_600);
        });
        let request = Request::new("acme", "t-expiring", 100);
        let runs = Arc::new(AtomicUsize::new(0));
        let rt = runtime();
        let first = rt.block_on(ledger.execute(request.ledger(), request.debit(&runs)));
        assert!(matches!(first, Ok(Outcome::Executed(_))), "{first:?}");
        let answered = chrono::Utc::now();
        let replay = rt.block_on(ledger.execute(request.ledger(), request.debit(&runs)));
        assert_eq!(replay.ok(), Some(Outcome::Replayed(request.answer())), "remembered until its expiry");

        // The entry expired before `answered + retention`: past that, on the
        // clock the purge reads, it goes.
        let expired = answered + retention;
        while chrono::Utc::now() <= expired {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(Ledger::purge_expired(db.pool(), 100, 10).expect("purge"), 1);
        let after = rt.block_on(ledger.execute(request.ledger(), request.debit(&runs)));
        assert_eq!(
            after.ok(),
            Some(Outcome::KeyReused),
            "the key is new: its mutation runs (and finds its transfer row), never a replay from memory"
        );
        assert_eq!(runs.load(Ordering::SeqCst), 2);
        assert_eq!(db.balance("acme"), 900);
    }

    fn a_row_is_stored_the_same_whichever_path_writes_it(backend) {
        let db = TestDb::fresh(backend);
        db.open_account("acme", 1_000);
        let ledger = db.ledger();
        let general = Request::new("acme", "path-general", 100);
        let one = Request::new("acme", "path-one-statement", 100);
        runtime().block_on(async {
            let a = ledger.execute(general.ledger(), general.debit(&Arc::default())).await;
            assert!(matches!(a, Ok(Outcome::Executed(_))), "{a:?}");
            let b = ledger.execute_insert(one.ledger(), one.made(), one.found()).await;
            assert!(matches!(b, Ok(Outcome::Executed(_))), "{b:?}");
        });
        let rows = db.transfers();
        assert_eq!(rows.len(), 2);
        // Column by column, but for the key each was sent with.
        let written = |row: &[String]| {
            let mut row = row.to_vec();
            row.remove(1);
            row
        };
        assert_eq!(written(&rows[0]), written(&rows[1]), "{rows:?}");
        assert_eq!(rows[0][0], "acme");
        assert_eq!(rows[0][3], "100");
        assert!(rows[0][4].starts_with("2027-01-15 08:00:00.123456"), "{rows:?}");
    }

    fn the_purge_deletes_only_expired_entries_the_oldest_first_a_batch_per_transaction(backend) {
        let db = TestDb::fresh(backend);
        let ledger = db.ledger();
        let keys = ["p-1", "p-2", "p-3", "p-4", "p-5", "p-6"];
        runtime().block_on(async {
            for key in keys {
                let request = Request::new("acme", key, 100);
                let done = ledger.execute_insert(request.ledger(), request.made(), request.found()).await;
                assert!(matches!(done, Ok(Outcome::Executed(_))), "{done:?}");
            }
        });
        // Expired out of the order they were written; p-6 is still live.
        db.expire("p-3", 1);
        db.expire("p-2", 2);
        db.expire("p-1", 3);
        db.expire("p-4", 4);
        db.expire("p-5", 5);

        assert_eq!(Ledger::purge_expired(db.pool(), 2, 1).expect("purge"), 2, "one batch of two: the bound");
        assert_eq!(db.entry_keys(), ["p-1", "p-4", "p-5", "p-6"], "the two that expired first went");
        let batches = db.writer_batches();
        assert_eq!(
            Ledger::purge_expired(db.pool(), 2, 10).expect("purge"),
            3,
            "batches go on while they are full"
        );
        if let Some(before) = batches {
            assert_eq!(
                db.writer_batches(),
                Some(before + 2),
                "a batch of two, then a short one that ends the round"
            );
        }
        assert_eq!(Ledger::purge_expired(db.pool(), 2, 10).expect("purge"), 0);
        assert_eq!(db.entry_keys(), ["p-6"], "live entries stay");
        assert_eq!(db.count("transfers"), 6, "the purge removes entries, never the effects");
    }

    fn a_request_holds_its_key_in_this_process_from_its_start_until_its_answer(backend) {
        let db = TestDb::fresh(backend);
        db.open_account("acme", 1_000);
        let ledger = db.ledger();
        assert_eq!(ledger.keys_in_flight(), 0, "nothing is held before a request");
        let rt = runtime();
        let (task, release) = held_unit(&rt, &ledger, &Request::new("acme", "t-held", 100), &Arc::default());
        assert_eq!(ledger.keys_in_flight(), 1, "a request holds its key while its unit runs");
        release.send(()).expect("the unit waits");
        let done = rt.block_on(task).expect("the request's task");
        assert!(matches!(done, Ok(Outcome::Executed(_))), "{done:?}");
        assert_eq!(ledger.keys_in_flight(), 0, "an answered request holds nothing");
    }

    fn while_every_write_slot_is_taken_a_replay_a_duplicate_and_a_new_key_are_refused_on_arrival(backend) {
        let db = TestDb::fresh(backend);
        db.open_account("acme", 1_000);
        let ledger = db.ledger_with(|s| s.write_admission = 1);
        let runs = Arc::new(AtomicUsize::new(0));
        let rt = runtime();
        let recorded = Request::new("acme", "t-recorded", 100);
        let first = rt.block_on(ledger.execute(recorded.ledger(), recorded.debit(&runs)));
        let Ok(Outcome::Executed(answer)) = first else { panic!("{first:?}") };

        // The one slot, held by a unit until the test releases it.
        let held = Request::new("acme", "t-held", 100);
        let (holder, release) = held_unit(&rt, &ledger, &held, &runs);
        assert!(ledger.admission().is_full());

        // Each is refused at once: not read (a replay), not waiting for the
        // holder (a duplicate), not run (a new key).
        let fresh = Request::new("acme", "t-fresh", 100);
        for request in [&recorded, &held, &fresh] {
            let refused = rt.block_on(ledger.execute(request.ledger(), request.debit(&runs)));
            assert!(matches!(refused, Err(LedgerError::Overloaded)), "{:?}: {refused:?}", request.key);
        }
        assert_eq!(runs.load(Ordering::SeqCst), 1, "none of them ran");

        release.send(()).expect("the unit waits");
        let done = rt.block_on(holder).expect("the holder's task");
        assert!(matches!(done, Ok(Outcome::Executed(_))), "{done:?}");
        // A slot free: the replay is answered, the new key runs.
        let replay = rt.block_on(ledger.execute(recorded.ledger(), recorded.debit(&runs)));
        assert_eq!(replay.ok(), Some(Outcome::Replayed(answer)));
        let again = rt.block_on(ledger.execute(fresh.ledger(), fresh.debit(&runs)));
        assert!(matches!(again, Ok(Outcome::Executed(_))), "{again:?}");
        assert_eq!((db.count("transfers"), db.count("idempotency_ledger")), (3, 3));
        assert_eq!(db.balance("acme"), 700);
    }
}

/// Runs `request` (its debit counted in `runs`) on `rt` with a unit that,
/// once running, waits until the test sends on the returned channel (or
/// drops it); returns once the unit runs, with the request's task.
fn held_unit(
    rt: &tokio::runtime::Runtime,
    ledger: &Ledger,
    request: &Request,
    runs: &Arc<AtomicUsize>,
) -> (
    tokio::task::JoinHandle<Result<Outcome, LedgerError<Failed>>>,
    std::sync::mpsc::Sender<()>,
) {
    let (entered, in_unit) = std::sync::mpsc::channel();
    let (release, released) = std::sync::mpsc::channel::<()>();
    let (ledger, debit) = (ledger.clone(), request.debit(runs));
    let (account, key, cents) = (
        request.account.clone(),
        request.key.as_str().to_owned(),
        request.cents,
    );
    let task = rt.spawn(async move {
        let request = Request::new(&account, &key, cents);
        ledger
            .execute(request.ledger(), move |tx| {
                entered.send(()).expect("the test waits for the unit");
                // Dropped by a failed test: the unit goes on, and the
                // runtime's drop does not wait for it in vain.
                let _ = released.recv();
                debit(tx)
            })
            .await
    });
    in_unit.recv().expect("the unit runs");
    (task, release)
}

/// Logs and metrics label each answer with these words (the server's
/// `idempotency_outcomes_total{outcome=…}`): renaming one splits a series.
#[test]
fn each_outcome_has_the_stable_label_that_logs_and_metrics_use() {
    let answer = Request::new("acme", "t-label", 1).answer();
    let labels = [
        Outcome::Executed(answer.clone()).label(),
        Outcome::Replayed(answer).label(),
        Outcome::KeyReused.label(),
        Outcome::InProgress.label(),
    ];
    assert_eq!(
        labels,
        ["executed", "replayed", "key_reused", "in_progress"]
    );
}

/// What every PostgreSQL statement of a unit may wait for a lock, read from
/// inside the unit's transaction.
fn lock_timeout(conn: &mut PgConnection) -> String {
    #[derive(QueryableByName)]
    struct Setting {
        #[diesel(sql_type = Text)]
        lock_timeout: String,
    }
    diesel::sql_query("SHOW lock_timeout")
        .get_result::<Setting>(conn)
        .expect("SHOW lock_timeout")
        .lock_timeout
}

/// The lock wait is the unit's own: `SET LOCAL lock_timeout` in its
/// transaction, which a distributed backend (Citus) carries to every node
/// the transaction touches — where the service's session settings never
/// arrive. Here the one pooled session is left with no bound at all, as a
/// worker's session would be; a unit whose change waits for a row another
/// transaction holds still gives up after the lock wait (a lock timeout),
/// not after the lease (a statement timeout), and leaves the session as it
/// found it.
#[test]
#[cfg_attr(
    postgres_tests_ignored,
    ignore = "set TEST_DATABASE_URL to run the PostgreSQL tests"
)]
fn a_units_lock_wait_is_bounded_by_its_own_transaction_whatever_its_session_says() {
    use idempotency_ledger::db::{Failure, classify};
    use std::sync::Mutex;

    let db = TestDb::fresh(Backend::Postgres);
    db.open_account("acme", 1_000);
    let lease = Duration::from_secs(6);
    // One connection: every read and unit runs on the session unbounded here.
    let options = PoolOptions {
        max_size: 1,
        lease,
        ..options()
    };
    let pool = Pool::connect(Backend::Postgres, &db.url(), &options).expect("pool");
    let session = |pool: &Pool, sql: Option<&str>| {
        let mut pooled = pool.get().expect("the one connection");
        let Conn::Postgres(c) = pooled.conn() else {
            panic!("PostgreSQL")
        };
        if let Some(sql) = sql {
            c.batch_execute(sql).expect("set the session");
        }
        lock_timeout(c)
    };
    assert_eq!(session(&pool, None), "2s", "every session starts bounded");
    assert_eq!(session(&pool, Some("SET lock_timeout = 0")), "0");

    let mut holder = PgConnection::establish(&db.url()).expect("connect");
    holder
        .batch_execute("BEGIN; SELECT 1 FROM accounts WHERE account = 'acme' FOR UPDATE")
        .expect("hold the account's row");
    let ledger = Ledger::new(
        pool.clone(),
        Settings {
            retention: Duration::from_secs(86_400),
            wait: Duration::from_secs(10),
            waiters_per_key: 4,
            write_admission: 4,
            remember: REMEMBER,
        },
    );
    let request = Request::new("acme", "held-row", 100);
    let inside = Arc::new(Mutex::new(None));
    let seen = Arc::clone(&inside);
    let outcome = runtime().block_on(ledger.execute(
        request.ledger(),
        move |tx: &mut LedgerTx<'_, '_>| {
            let Conn::Postgres(c) = tx.conn() else {
                panic!("PostgreSQL")
            };
            *seen.lock().expect("not poisoned") = Some(lock_timeout(c));
            diesel::sql_query("UPDATE accounts SET balance = balance - 100 WHERE account = 'acme'")
                .execute(*c)?;
            Ok::<_, diesel::result::Error>(Completion::KeyReusedFound)
        },
    ));
    holder.batch_execute("ROLLBACK").expect("release the row");

    assert_eq!(
        inside.lock().expect("not poisoned").as_deref(),
        Some("2s"),
        "the unit's own bound"
    );
    match outcome {
        Err(LedgerError::Operation(e)) => {
            assert_eq!(
                classify(&e),
                Failure::LockTimeout,
                "the lock wait gave up, not the lease: {e}"
            );
        }
        other => panic!("the held row answered {other:?}"),
    }
    assert_eq!(
        session(&pool, None),
        "0",
        "the bound was the transaction's, not the session's"
    );
    assert_eq!(
        (db.balance("acme"), db.count("idempotency_ledger")),
        (1_000, 0)
    );
}

/// A writer outside the ledger's protocol (here: a session that inserted
/// the key's entry and has not committed) holds the row a unit must record.
/// The unit's insert waits for it up to the lock wait, then the request is
/// answered in progress — whether that writer commits is for a retry to
/// find out — and the unit's change is rolled back with it.
#[test]
#[cfg_attr(
    postgres_tests_ignored,
    ignore = "set TEST_DATABASE_URL to run the PostgreSQL tests"
)]
fn a_unit_whose_entry_waits_on_a_row_held_outside_the_protocol_is_answered_in_progress_and_changes_nothing()
 {
    let db = TestDb::fresh(Backend::Postgres);
    db.open_account("acme", 1_000);
    let mut outsider = PgConnection::establish(&db.url()).expect("connect");
    outsider
        .batch_execute(
            "BEGIN; INSERT INTO idempotency_ledger VALUES \
             ('outside', 'acme', 'f', 201, '[]', ''::bytea, now(), now() + interval '1 day')",
        )
        .expect("hold the key's entry, uncommitted");
    let ledger = db.ledger();
    let request = Request::new("acme", "outside", 100);
    let held = runtime().block_on(ledger.execute(request.ledger(), request.debit(&Arc::default())));
    outsider
        .batch_execute("ROLLBACK")
        .expect("let the entry go");

    assert_eq!(held.ok(), Some(Outcome::InProgress));
    assert_eq!(
        (
            db.balance("acme"),
            db.count("transfers"),
            db.count("idempotency_ledger")
        ),
        (1_000, 0, 0),
        "nothing of the unit persisted"
    );
    let retry =
        runtime().block_on(ledger.execute(request.ledger(), request.debit(&Arc::default())));
    assert!(matches!(retry, Ok(Outcome::Executed(_))), "{retry:?}");
    assert_eq!(db.balance("acme"), 900);
}

/// Another process's unit holds the key's advisory lock (here: a session
/// that took it). A request of this process never writes beside it — on
/// the general way and on the one-statement create alike it gives the key
/// back, looks again, and is answered in progress at its wait bound — and
/// runs once the lock is free.
#[test]
#[cfg_attr(
    postgres_tests_ignored,
    ignore = "set TEST_DATABASE_URL to run the PostgreSQL tests"
)]
fn a_key_whose_lock_another_session_holds_is_not_written_until_the_lock_is_free() {
    let db = TestDb::fresh(Backend::Postgres);
    db.open_account("acme", 1_000);
    let lock = idempotency_ledger::db::lock_id("t-locked", "acme");
    let mut other = PgConnection::establish(&db.url()).expect("connect");
    let advisory = |conn: &mut PgConnection, call: &str| {
        diesel::sql_query(format!("SELECT {call}($1)"))
            .bind::<BigInt, _>(lock)
            .execute(conn)
            .expect("the advisory lock call");
    };
    advisory(&mut other, "pg_advisory_lock");
    let ledger = db.ledger_waiting(Duration::from_secs(1));
    let request = Request::new("acme", "t-locked", 100);
    let runs = Arc::new(AtomicUsize::new(0));
    let rt = runtime();

    let general = rt.block_on(ledger.execute(request.ledger(), request.debit(&runs)));
    let one_statement =
        rt.block_on(ledger.execute_insert(request.ledger(), request.made(), request.found()));
    assert_eq!(general.ok(), Some(Outcome::InProgress));
    assert_eq!(one_statement.ok(), Some(Outcome::InProgress));
    assert_eq!(runs.load(Ordering::SeqCst), 0, "the mutation never ran");
    assert_eq!(
        (
            db.balance("acme"),
            db.count("transfers"),
            db.count("idempotency_ledger")
        ),
        (1_000, 0, 0)
    );

    advisory(&mut other, "pg_advisory_unlock");
    let retry = rt.block_on(ledger.execute(request.ledger(), request.debit(&runs)));
    assert!(matches!(retry, Ok(Outcome::Executed(_))), "{retry:?}");
    assert_eq!(db.balance("acme"), 900);
}

/// A purge batch holds nothing a live request waits for: while one is
/// deleting (its transaction open), a replay of a key whose entry it is
/// deleting and a new request both answer — the replay from the entry as
/// committed, the new request by running.
#[test]
#[cfg_attr(
    postgres_tests_ignored,
    ignore = "set TEST_DATABASE_URL to run the PostgreSQL tests"
)]
fn a_purge_batch_in_progress_holds_nothing_a_replay_or_a_new_request_waits_for() {
    let db = TestDb::fresh(Backend::Postgres);
    db.open_account("acme", 1_000);
    let ledger = db.ledger();
    let old = Request::new("acme", "expired", 100);
    let first = runtime().block_on(ledger.execute(old.ledger(), old.debit(&Arc::default())));
    assert!(matches!(first, Ok(Outcome::Executed(_))), "{first:?}");
    db.expire("expired", 1);

    let mut purger = PgConnection::establish(&db.url()).expect("connect");
    purger.batch_execute("BEGIN").expect("begin");
    let purging = idempotency_ledger::db::purge_batch(
        &mut Conn::Postgres(&mut purger),
        chrono::Utc::now(),
        1_000,
    );
    assert_eq!(
        purging.expect("purge"),
        1,
        "the batch holds the expired entry"
    );

    let fresh = Request::new("acme", "fresh", 50);
    let (replay, new) = runtime().block_on(async {
        (
            ledger
                .execute(old.ledger(), old.debit(&Arc::default()))
                .await,
            ledger
                .execute_insert(fresh.ledger(), fresh.made(), fresh.found())
                .await,
        )
    });
    purger.batch_execute("COMMIT").expect("commit the batch");

    assert_eq!(
        replay.ok(),
        Some(Outcome::Replayed(old.answer())),
        "the committed entry answers"
    );
    assert_eq!(new.ok(), Some(Outcome::Executed(fresh.answer())));
    assert_eq!(db.entry_keys(), ["fresh"]);
}

/// Two purges at once (two processes): the second's batch waits for the
/// first's and then finds nothing left to delete — no entry deleted twice,
/// no error, no row lock taken or skipped.
#[test]
#[cfg_attr(
    postgres_tests_ignored,
    ignore = "set TEST_DATABASE_URL to run the PostgreSQL tests"
)]
fn two_purges_at_once_delete_each_expired_entry_once() {
    let db = TestDb::fresh(Backend::Postgres);
    let ledger = db.ledger();
    runtime().block_on(async {
        for key in ["a", "b", "c"] {
            let request = Request::new("acme", key, 100);
            let done = ledger
                .execute_insert(request.ledger(), request.made(), request.found())
                .await;
            assert!(matches!(done, Ok(Outcome::Executed(_))), "{done:?}");
        }
    });
    for key in ["a", "b", "c"] {
        db.expire(key, 1);
    }
    let mut first = PgConnection::establish(&db.url()).expect("connect");
    first.batch_execute("BEGIN").expect("begin");
    let now = chrono::Utc::now();
    let deleted = idempotency_ledger::db::purge_batch(&mut Conn::Postgres(&mut first), now, 1_000);
    assert_eq!(deleted.expect("first purge"), 3);

    let url = db.url();
    let second = std::thread::spawn(move || {
        let mut second = PgConnection::establish(&url).expect("connect");
        second.batch_execute("BEGIN").expect("begin");
        let deleted =
            idempotency_ledger::db::purge_batch(&mut Conn::Postgres(&mut second), now, 1_000);
        second.batch_execute("COMMIT").expect("commit");
        deleted
    });
    // The second waits for the first's row locks…
    // (A second that never waits finishes instead: the test then fails
    // rather than hangs.)
    let mut watcher = PgConnection::establish(&db.url()).expect("connect");
    while waiting_sessions(&mut watcher) == 0 && !second.is_finished() {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(
        !second.is_finished(),
        "the second purge did not wait for the first's locks"
    );
    // …and, once they are released, finds the entries gone.
    first.batch_execute("COMMIT").expect("commit");
    assert_eq!(second.join().expect("second purge").expect("no error"), 0);
    assert!(db.entry_keys().is_empty());
}

/// Sessions of this database waiting for a lock.
fn waiting_sessions(conn: &mut PgConnection) -> i64 {
    diesel::select(diesel::dsl::sql::<BigInt>(
        "(SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
         AND wait_event_type = 'Lock')",
    ))
    .get_result(conn)
    .expect("pg_stat_activity")
}

/// A node of a plan: its type, its index, whether a `Limit` is above it,
/// and whether it is (under) the inner side of a nested loop (run once per
/// outer row).
#[derive(Debug)]
struct PlanNode {
    kind: String,
    index: Option<String>,
    under_limit: bool,
    repeated: bool,
}

/// Every node of `EXPLAIN (FORMAT JSON)` of the purge's statement.
fn purge_plan(conn: &mut PgConnection) -> Vec<PlanNode> {
    #[derive(QueryableByName)]
    struct Plan {
        #[diesel(sql_type = Text)]
        #[diesel(column_name = "QUERY PLAN")]
        plan: String,
    }
    fn walk(node: &serde_json::Value, under_limit: bool, repeated: bool, out: &mut Vec<PlanNode>) {
        let kind = node["Node Type"].as_str().unwrap_or("").to_owned();
        for (i, child) in node["Plans"].as_array().into_iter().flatten().enumerate() {
            let inner = kind == "Nested Loop" && i == 1;
            walk(
                child,
                under_limit || kind == "Limit",
                repeated || inner,
                out,
            );
        }
        out.push(PlanNode {
            index: node["Index Name"].as_str().map(str::to_owned),
            kind,
            under_limit,
            repeated,
        });
    }
    let explained: Plan = diesel::sql_query(format!(
        "EXPLAIN (FORMAT JSON) {}",
        idempotency_ledger::db::PURGE_POSTGRES
    ))
    .bind::<diesel::sql_types::Timestamptz, _>(chrono::Utc::now())
    .bind::<BigInt, _>(1_000_i64)
    .get_result(conn)
    .expect("EXPLAIN the purge");
    let json: serde_json::Value = serde_json::from_str(&explained.plan).expect("a JSON plan");
    let mut nodes = Vec::new();
    walk(&json[0]["Plan"], false, false, &mut nodes);
    nodes
}

/// A backlog the statistics do not know of — inserted after the last
/// `ANALYZE` by one statement, so that the planner believes almost nothing
/// has expired, and every entry of it expires at the same instant — must
/// not make a purge batch read the whole backlog, let alone once per entry
/// it deletes: the plan reads the expired entries from the `expires_at`
/// index only under the batch's `LIMIT`, and runs that selection once —
/// before and after the statistics catch up.
#[test]
#[cfg_attr(
    postgres_tests_ignored,
    ignore = "set TEST_DATABASE_URL to run the PostgreSQL tests"
)]
fn the_purges_plan_reads_the_backlog_only_as_far_as_one_batch_whatever_the_statistics_say() {
    let db = TestDb::fresh(Backend::Postgres);
    let mut conn = PgConnection::establish(&db.url()).expect("connect");
    conn.batch_execute(
        "ALTER TABLE idempotency_ledger SET (autovacuum_enabled = false);
         INSERT INTO idempotency_ledger SELECT 'live-' || g, 'u' || (g % 97), 'fp', 201, '[]', '\\x7b7d',
             now(), now() + interval '1 day' + g * interval '1 ms' FROM generate_series(1, 1000) g;
         ANALYZE idempotency_ledger;
         INSERT INTO idempotency_ledger SELECT 'expired-' || g, 'u' || (g % 97), 'fp', 201, '[]', '\\x7b7d',
             now() - interval '2 days', now() - interval '1 day'
             FROM generate_series(1, 50000) g;",
    )
    .expect("a backlog the statistics do not know of");

    for statistics in ["stale", "fresh"] {
        if statistics == "fresh" {
            conn.batch_execute("ANALYZE idempotency_ledger")
                .expect("ANALYZE");
        }
        let plan = purge_plan(&mut conn);
        let by_expiry: Vec<&PlanNode> = plan
            .iter()
            .filter(|n| n.index.as_deref() == Some("idempotency_ledger_expires_at"))
            .collect();
        assert!(
            !by_expiry.is_empty() && by_expiry.iter().all(|n| n.under_limit),
            "{statistics} statistics: expired entries are read beyond the batch: {plan:#?}"
        );
        assert!(
            plan.iter()
                .filter(|n| n.kind == "Limit")
                .all(|n| !n.repeated),
            "{statistics} statistics: the batch is selected again for every row: {plan:#?}"
        );
    }
    conn.batch_execute("BEGIN").expect("begin");
    let deleted = idempotency_ledger::db::purge_batch(
        &mut Conn::Postgres(&mut conn),
        chrono::Utc::now(),
        1_000,
    );
    conn.batch_execute("COMMIT").expect("commit");
    assert_eq!(deleted.expect("purge"), 1_000);
}
