//! The column types a `Row` takes, written through the ledger's insert
//! (on PostgreSQL its one-statement path) and read back as they were.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use idempotency_ledger::columns::Uuid;
use idempotency_ledger::db::Backend;
use idempotency_ledger::row::{Columns, Row};
use idempotency_ledger::{
    Completion, Fingerprint, IdempotencyKey, LedgerRequest, Options, Outcome, RecordedResponse,
};
use support::Scratch;

struct Reading {
    id: Uuid,
    user: String,
    key: String,
    ok: bool,
    celsius: f64,
    ratio: f32,
    note: Option<String>,
    missing: Option<i64>,
    flag: Option<bool>,
}

impl Row for Reading {
    const TABLE: &'static str = "readings";
    const UNIQUE: &'static [&'static str] = &["owner", "idempotency_key"];
    fn columns<'b, C: Columns<'b>>(&'b self, c: &mut C) -> QueryResult<()> {
        c.column("id", &self.id)?;
        c.column("owner", self.user.as_str())?;
        c.column("idempotency_key", self.key.as_str())?;
        c.column("ok", &self.ok)?;
        c.column("celsius", &self.celsius)?;
        c.column("ratio", &self.ratio)?;
        c.column("note", &self.note)?;
        c.column("missing", &self.missing)?;
        c.column("flag", &self.flag)
    }
}

#[derive(QueryableByName, Debug, PartialEq)]
struct Back {
    #[diesel(sql_type = diesel::sql_types::Text)]
    id: String,
    #[diesel(sql_type = diesel::sql_types::Bool)]
    ok: bool,
    #[diesel(sql_type = diesel::sql_types::Double)]
    celsius: f64,
    #[diesel(sql_type = diesel::sql_types::Float)]
    ratio: f32,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
    note: Option<String>,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::BigInt>)]
    missing: Option<i64>,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Bool>)]
    flag: Option<bool>,
}

both_backends! {
    fn bool_floats_nulls_and_uuids_are_written_as_they_are(backend) {
        let db = Scratch::fresh(backend);
        let ledger = idempotency_ledger::open(&db.url, Options::default()).expect("open");
        let (uuid, real) = match backend {
            Backend::Sqlite => ("TEXT", "REAL"),
            Backend::Postgres => ("UUID", "DOUBLE PRECISION"),
        };
        let table = format!(
            "CREATE TABLE readings (id {uuid} NOT NULL, owner TEXT NOT NULL,
             idempotency_key TEXT NOT NULL, ok BOOLEAN NOT NULL, celsius {real} NOT NULL,
             ratio REAL NOT NULL, note TEXT, missing BIGINT, flag BOOLEAN,
             UNIQUE (owner, idempotency_key))"
        );
        match backend {
            Backend::Sqlite => SqliteConnection::establish(&db.url).unwrap().batch_execute(&table),
            Backend::Postgres => PgConnection::establish(&db.url).unwrap().batch_execute(&table),
        }
        .expect("the table");
        let id = uuid::Uuid::new_v4();
        let row = Reading {
            id: Uuid::new(id),
            user: "ada".into(),
            key: "k1".into(),
            ok: true,
            celsius: -12.25,
            ratio: 0.5,
            note: Some("cold".into()),
            missing: None,
            flag: None,
        };
        let key = IdempotencyKey::parse(b"k1").unwrap();
        let fingerprint = Fingerprint::of("POST", "/readings", b"{}");
        let request = LedgerRequest { user_id: "ada", key: &key, fingerprint: &fingerprint };
        let created = RecordedResponse { status: 201, headers: vec![], body: vec![] };
        let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
        let outcome = runtime
            .block_on(ledger.execute_insert(request, move || (row, created), |_| {
                Ok::<_, ()>(Completion::KeyReusedFound)
            }))
            .expect("written");
        assert!(matches!(outcome, Outcome::Executed(_)), "{outcome:?}");

        let sql = match backend {
            Backend::Sqlite => "SELECT id, ok, celsius, ratio, note, missing, flag FROM readings",
            Backend::Postgres => "SELECT id::text AS id, ok, celsius, ratio, note, missing, flag FROM readings",
        };
        let back: Vec<Back> = match backend {
            Backend::Sqlite => diesel::sql_query(sql).load(&mut SqliteConnection::establish(&db.url).unwrap()),
            Backend::Postgres => diesel::sql_query(sql).load(&mut PgConnection::establish(&db.url).unwrap()),
        }
        .expect("read back");
        assert_eq!(
            back,
            [Back {
                id: id.hyphenated().to_string(),
                ok: true,
                celsius: -12.25,
                ratio: 0.5,
                note: Some("cold".into()),
                missing: None,
                flag: None,
            }]
        );
    }
}
